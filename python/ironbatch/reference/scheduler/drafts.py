"""Draft tokens in (docs/scheduling.md §4.13): after each synchronous step's
output, the model runner's proposer hands over the drafts each request
should verify in its next step (vLLM's ``update_draft_token_ids``). The
twin of ``rust/src/scheduler/drafts.rs``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ironbatch.reference.args import draft_list
from ironbatch.reference.error import debug_str
from ironbatch.reference.spec_decode import NO_DRAFTS, Drafts

if TYPE_CHECKING:
    from ironbatch.reference.scheduler import Scheduler


def drafts_unused(s: Scheduler, slot: int, computed: int, n: int) -> bool:
    """Whether drafts proposed after this step for the request in ``slot``,
    scheduled for ``n`` tokens after ``computed``, are sure to go
    unverified: the step is a prefill chunk short of the prompt's end (it
    samples nothing), or the token it samples is the request's last by
    ``max_tokens`` even if every draft is rejected (async: the token in
    flight counts too). Stop tokens cannot be foreseen, so they do not count
    (vLLM's ``_drafts_unused``)."""
    r = s.requests[slot]
    if computed + n < r.num_tokens:
        return True
    in_flight = 1 if r.num_output_placeholders > 0 else 0
    return r.num_output_tokens + 1 + in_flight >= r.stop.max_tokens


def update_draft_token_ids(
    s: Scheduler, request_ids: Sequence[str], tokens: Sequence[int], offsets: Sequence[int]
) -> None:
    """Give request ``request_ids[i]`` the drafts
    ``tokens[offsets[i]:offsets[i + 1]]``, replacing any it had. Ids of
    requests that finished meanwhile are skipped, and a request whose last
    step was a prefill chunk gets none (its drafts would follow tokens it has
    not computed). A token is an id or ``DRAFT_PADDING`` (kept as a draft,
    as vLLM keeps it). Checked first: a ``ValueError`` changes nothing."""
    tokens = draft_list("token_ids", tokens)
    k = s.config.num_speculative_tokens
    n = len(request_ids)
    if len(offsets) != n + 1 or offsets[0] != 0 or offsets[n] != len(tokens):
        raise ValueError(
            f"draft_token_ids: offsets must rise from 0 to {len(tokens)} over {n} requests"
        )
    for i in range(n):
        if offsets[i] > offsets[i + 1]:
            raise ValueError("draft_token_ids: offsets must rise")
        if offsets[i + 1] - offsets[i] > k:
            raise ValueError(
                f"draft_token_ids: request {debug_str(request_ids[i])} got "
                f"{offsets[i + 1] - offsets[i]} drafts, more than num_speculative_tokens={k}"
            )
    for i, request_id in enumerate(request_ids):
        slot = s.ids.get(request_id)
        if slot is None:
            continue  # finished (or aborted) since
        r = s.requests[slot]
        drafts = tuple(tokens[offsets[i] : offsets[i + 1]])
        r.drafts = NO_DRAFTS if r.prefill_chunk or not drafts else Drafts(drafts)
