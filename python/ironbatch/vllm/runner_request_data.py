"""What a step's ``SchedulerOutput`` tells the model runner about its
requests, beyond what the core makes (``_core.VllmObjects.schedule``:
``CachedRequestData`` and everything else that needs no vLLM ``Request``):
``NewRequestData`` for the ones it must install and, for model runner V1,
the tokens of cached requests it did not see in the previous step. Shaped
for model runner V1 or V2 as vLLM 0.33 shapes them."""

from __future__ import annotations

from vllm.v1.core.sched.output import CachedRequestData, NewRequestData

from ironbatch._core import VllmStepRows as StepRows
from ironbatch.vllm.request_mirror import RequestMirror


class RunnerRequestData:
    """Builds both from a step's rows."""

    def __init__(self, mirror: RequestMirror, use_v2_model_runner: bool, uses_mrope: bool) -> None:
        self.mirror = mirror
        self.use_v2_model_runner = use_v2_model_runner
        # An image behind a prefix hit is sent without its tensors; an
        # M-RoPE model (Qwen2-VL) keeps the ones its positions need.
        self.uses_mrope = uses_mrope
        # Model runner V1 gets all_token_ids for a request it did not see
        # in the previous step.
        self.prev_step_req_ids: set[str] = set()

    def new(self, rows: StepRows) -> list[NewRequestData]:
        """First admissions; with model runner V2 also resumed requests,
        reinstalled whole with their tokens."""
        v2 = self.use_v2_model_runner
        new_rows = rows.new + rows.resumed if v2 else rows.new
        by_slot = self.mirror.by_slot
        slots = rows.slots
        out = []
        for i in new_rows:
            r = by_slot[slots[i]]
            tokens = r._all_token_ids if v2 else None
            data = NewRequestData.from_request(
                r, rows.block_ids(i), tokens, uses_mrope=self.uses_mrope
            )
            out.append(data)
        return out

    def add_unseen_token_ids(self, rows: StepRows, cached: CachedRequestData) -> None:
        """Model runner V1: every cached request's tokens that it did not see
        in the previous step, into ``cached.all_token_ids``."""
        prev = self.prev_step_req_ids
        ids = cached.req_ids
        if not prev.issuperset(ids):
            slot_of = self.mirror.slot_of
            by_slot = self.mirror.by_slot
            for rid in ids:
                if rid not in prev:
                    r = by_slot[slot_of[rid]]
                    self.mirror.sync(r, computed_too=False)
                    cached.all_token_ids[rid] = r.all_token_ids.copy()
        self.prev_step_req_ids = set(rows.req_ids)
