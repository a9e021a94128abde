"""Speculative decoding in an ironbatch-trace/1 step line
(``docs/trace-format.md`` §3.5): the drafts given before a step's
``schedule()``, the draft tokens it scheduled, and the spec-decoding stats its
``update_from_output()`` counted, in the trace's JSON shapes.

The stats and the scheduled drafts are read by attribute name, so the same
functions serve the replay (ironbatch's objects) and the recorder (vLLM's
``SpecDecodingStats``, whose fields have the same names)."""

from __future__ import annotations

from typing import Any

from ironbatch.scheduler_output import SchedulerOutput

# Optional step-line keys (the growth rule): a trace without them has no
# speculation, and a replay then neither gives drafts nor compares them.
DRAFTS = "drafts"  # on the step line: given before schedule()
SPEC_TOKENS = "spec_tokens"  # in "schedule": the draft tokens scheduled
SPEC_STATS = "spec_decoding_stats"  # on the step line: counted by the update

# The SpecDecodingStats fields a trace records; ``num_spec_tokens`` is the
# header's ``num_speculative_tokens`` and not repeated per step.
STATS_FIELDS = (
    "num_drafts",
    "num_draft_tokens",
    "num_accepted_tokens",
    "num_accepted_tokens_per_pos",
    "num_draft_tokens_per_pos",
)


def step_drafts(step_line: dict[str, Any]) -> dict[str, list[int]]:
    """The drafts a step line gives before its ``schedule()``, by request id
    (empty when it gives none). A repeated id keeps its last drafts, as
    vLLM's ``update_draft_token_ids`` leaves it."""
    return {request_id: tokens for request_id, tokens in step_line.get(DRAFTS, ())}


def scheduled_spec_tokens(out: SchedulerOutput) -> list[list[Any]]:
    """``[request_id, draft_tokens]`` for each row that scheduled drafts, in
    scheduling order (-1 for a placeholder): vLLM's
    ``scheduled_spec_decode_tokens`` in the trace's shape."""
    counts = out.num_spec_tokens.tolist()
    if not any(counts):  # the common case, decided without the token column
        return []
    tokens = out.spec_token_ids.tolist()
    rows: list[list[Any]] = []
    start = 0
    for request_id, n in zip(out.req_ids, counts, strict=True):
        if n:
            rows.append([request_id, tokens[start : start + n]])
            start += n
    return rows


def stats_record(stats: Any) -> dict[str, Any] | None:
    """A step's spec-decoding stats as the trace records them; None when the
    update verified no drafts (vLLM reports none then)."""
    if stats is None:
        return None
    record: dict[str, Any] = {}
    for name in STATS_FIELDS:
        value = getattr(stats, name)
        record[name] = [int(x) for x in value] if name.endswith("_per_pos") else int(value)
    return record
