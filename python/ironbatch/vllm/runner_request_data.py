"""What a step's ``SchedulerOutput`` tells the model runner about its
requests: ``NewRequestData`` for the ones it must install and the
``CachedRequestData`` columns for the rest, shaped for model runner V1 or
V2 as vLLM 0.33 shapes them."""

from __future__ import annotations

import itertools

from vllm.v1.core.sched.output import CachedRequestData, NewRequestData

from ironbatch import _core
from ironbatch._core import VllmStepRows as StepRows
from ironbatch.vllm.request_mirror import RequestMirror


class RunnerRequestData:
    """Builds both from a step's rows. ``send_token_ids``: synchronous
    pipeline parallelism, where the first stage gets each step's tokens
    from the scheduler (``CachedRequestData.new_token_ids``)."""

    def __init__(
        self, mirror: RequestMirror, use_v2_model_runner: bool, send_token_ids: bool
    ) -> None:
        self.mirror = mirror
        self.use_v2_model_runner = use_v2_model_runner
        self.send_token_ids = send_token_ids
        # Model runner V1 gets all_token_ids for a request it did not see
        # in the previous step.
        self.prev_step_req_ids: set[str] = set()

    def new(self, rows: StepRows) -> list[NewRequestData]:
        """First admissions; with model runner V2 also resumed requests,
        reinstalled whole with their tokens."""
        v2 = self.use_v2_model_runner
        new_rows = rows.new + rows.resumed if v2 else rows.new
        by_slot = self.mirror.by_slot
        out = []
        for i in new_rows:
            r = by_slot[rows.slots[i]]
            tokens = r._all_token_ids if v2 else None
            out.append(NewRequestData.from_request(r, rows.block_ids(i), tokens))
        return out

    def cached(self, rows: StepRows) -> CachedRequestData:
        """Running requests (new blocks only when their table grew) and, on
        model runner V1, resumed ones with their whole table; V1 also gets
        ``all_token_ids`` for requests it did not see in the previous step."""
        resumed = [] if self.use_v2_model_runner else rows.resumed
        n = rows.num_running
        new_block_ids: list[tuple[list[int], ...] | None] = [None] * n
        for i in rows.running_grown:
            new_block_ids[i] = rows.block_ids(i)
        all_token_ids: dict[str, list[int]] = {}
        if not self.use_v2_model_runner:
            all_token_ids = self._unseen_token_ids(rows, resumed)
        if resumed:
            new_block_ids += [rows.block_ids(i) for i in resumed]
            cached_rows = [*range(n), *resumed]
            req_ids = [rows.req_ids[i] for i in cached_rows]
            computed = [rows.computed[i] for i in cached_rows]
            num_output_tokens = [rows.num_output_tokens[i] for i in cached_rows]
        else:  # the running rows lead the step: slices, not a lookup a row
            cached_rows = range(n)
            req_ids = rows.req_ids[:n]
            computed = rows.computed[:n]
            num_output_tokens = rows.num_output_tokens[:n]
        new_token_ids: list[list[int]] = []
        if self.send_token_ids:
            new_token_ids = _core.vllm_token_slices(
                self.mirror.core.core,
                slots=[rows.slots[i] for i in cached_rows],
                starts=[rows.computed[i] for i in cached_rows],
                counts=[rows.num_scheduled[i] for i in cached_rows],
            )
        return CachedRequestData(
            req_ids=req_ids,
            resumed_req_ids={rows.req_ids[i] for i in resumed},
            new_token_ids=new_token_ids,
            all_token_ids=all_token_ids,
            new_block_ids=new_block_ids,
            num_computed_tokens=computed,
            num_output_tokens=num_output_tokens,
        )

    def _unseen_token_ids(self, rows: StepRows, resumed: list[int]) -> dict[str, list[int]]:
        """Model runner V1: every cached request's tokens that it did not
        see in the previous step."""
        prev = self.prev_step_req_ids
        out: dict[str, list[int]] = {}
        for i in itertools.chain(range(rows.num_running), resumed):
            rid = rows.req_ids[i]
            if rid not in prev:
                r = self.mirror.by_slot[rows.slots[i]]
                self.mirror.sync(r, computed_too=False)
                out[rid] = r.all_token_ids.copy()
        self.prev_step_req_ids = set(rows.req_ids)
        return out
