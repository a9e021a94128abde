"""The drop-in's side of speculative decoding (docs/scheduling.md §4.13,
§5.7): drafts from vLLM's proposer into the core, with vLLM's grammar
checks on structured-output requests, and the core's verification counts
out as vLLM's ``SpecDecodingStats``. The core schedules the drafts and rolls
back the rejected ones; vLLM's engine decides when drafts arrive (after a
synchronous step's output, or into a deferred async step)."""

from __future__ import annotations

import itertools
from typing import Any

from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.outputs import DraftTokenIds
from vllm.v1.request import Request
from vllm.v1.spec_decode.metrics import SpecDecodingStats

from ironbatch.core_scheduler import CoreScheduler
from ironbatch.vllm.structured_outputs import StructuredOutputs


class Speculation:
    """Draft intake and stats for one drop-in. ``requests`` is the
    scheduler's own dict of live requests (shared)."""

    def __init__(
        self, core: CoreScheduler, requests: dict[str, Request], structured: StructuredOutputs
    ) -> None:
        self.core = core
        self.requests = requests
        self.structured = structured

    def take_drafts(self, draft_token_ids: DraftTokenIds) -> None:
        """Synchronous: the proposer's drafts for each request's next step,
        after the step's output was applied. Each replaces what its request
        had; a structured-output request keeps the prefix its grammar
        accepts. The core skips requests that finished meanwhile and drops
        drafts of requests mid-prefill, as vLLM does."""
        ids, drafts = draft_token_ids.req_ids, draft_token_ids.draft_token_ids
        if self.structured.live:
            drafts = [self._validated(rid, d) for rid, d in zip(ids, drafts, strict=True)]
        tokens = list(itertools.chain.from_iterable(drafts))
        offsets = [0, *itertools.accumulate(map(len, drafts))]
        self.core.update_draft_token_ids(list(ids), tokens, offsets)

    def _validated(self, rid: str, drafts: list[int]) -> list[int]:
        # Past the prefill only, as vLLM does (validating marks where the
        # request's reasoning stands).
        if rid not in self.structured.live or self.core.core.is_prefill_chunk(rid):
            return drafts
        return self.structured.validate_drafts(self.requests[rid], drafts)

    def fill_deferred(
        self, draft_token_ids: DraftTokenIds, scheduler_output: SchedulerOutput
    ) -> None:
        """Async, a step whose grammar masks waited for the previous output:
        the drafts the runner proposed for it, trimmed to the positions
        scheduled and to what each grammar accepts, padded back with
        placeholders (counted as invalid), written into ``scheduler_output``
        as vLLM writes them."""
        invalid: dict[str, int] = {}
        scheduled = scheduler_output.scheduled_spec_decode_tokens
        for rid, drafts in zip(
            draft_token_ids.req_ids, draft_token_ids.draft_token_ids, strict=True
        ):
            r = self.requests.get(rid)
            placeholders = scheduled.get(rid)
            # Finished since: gone, or held for a KV send (placeholders stay).
            if r is None or r.is_finished() or not placeholders:
                continue
            n = len(placeholders)
            del drafts[n:]
            drafts = self.structured.validate_drafts(r, drafts)
            if n > len(drafts):
                invalid[rid] = n - len(drafts)
                drafts.extend([-1] * (n - len(drafts)))
            scheduled[rid] = drafts
        scheduler_output.num_invalid_spec_tokens = invalid

    @staticmethod
    def stats(scheduler_output: SchedulerOutput, step: Any, update: Any) -> SpecDecodingStats:
        """vLLM's SpecDecodingStats for an update the core counted drafts in
        (``update.spec_decoding_stats``). Drafts a grammar invalidated (async
        structured outputs) are not counted as drafts, as vLLM does."""
        core = update.spec_decoding_stats
        stats = SpecDecodingStats(
            num_spec_tokens=core.num_spec_tokens,
            num_drafts=core.num_drafts,
            num_draft_tokens=core.num_draft_tokens,
            num_accepted_tokens=core.num_accepted_tokens,
            num_accepted_tokens_per_pos=list(core.num_accepted_tokens_per_pos),
            num_draft_tokens_per_pos=list(core.num_draft_tokens_per_pos),
        )
        invalid = scheduler_output.num_invalid_spec_tokens
        if invalid:
            num_spec = step.column("num_spec_tokens").tolist()
            for row in update.rows:  # the requests the core counted
                n, d = invalid.get(step.req_ids[row], 0), num_spec[row]
                if n and d:
                    stats.num_draft_tokens -= n
                    for i in range(d - n, d):
                        stats.num_draft_tokens_per_pos[i] -= 1
        return stats


def observe_per_request(
    requests: dict[str, Request],
    scheduler_output: SchedulerOutput,
    step: Any,
    update: Any,
    mro: Any,
    detailed: bool,
) -> None:
    """Each request whose drafts this update verified observes them on its
    ``spec_decode_metrics`` (``--per-request-spec-decode-metrics``): the
    drafts scheduled, less those a grammar invalidated, and how many the
    model accepted (what it returned, before any stop trims it)."""
    num_spec = step.column("num_spec_tokens").tolist()
    invalid = scheduler_output.num_invalid_spec_tokens or {}
    index = mro.req_id_to_index
    for row in update.rows:
        num_drafts = num_spec[row]
        if not num_drafts:
            continue
        rid = step.req_ids[row]
        r = requests.get(rid)
        generated = mro.sampled_token_ids[index[rid]]
        if r is None or r.spec_decode_metrics is None or not generated:
            continue
        r.spec_decode_metrics.observe(
            num_draft_tokens=num_drafts - invalid.get(rid, 0),
            num_accepted=max(len(generated) - 1, 0),
            detailed=detailed,
        )
