"""Speculative decoding end to end through vLLM 0.33's ``EngineCore``, with
the drafts of vLLM's GPU n-gram proposer (``ngram_gpu``): ``k`` per request,
-1 in the slots it found no match for. Synchronous, the engine hands them to
the scheduler after each step (``take_draft_token_ids``, then
``update_draft_token_ids``); asynchronous, the scheduler reserves ``k``
placeholders and the runner fills them. The drop-in must give the executor
the same SchedulerOutputs and the engine the same outputs, stats included,
as vLLM's own scheduler: before the fix, the first padded draft raised out
of ``update_draft_token_ids`` and ended the engine."""

from __future__ import annotations

import copy
from collections import Counter
from concurrent.futures import Future

import pytest

pytest.importorskip("vllm")

from vllm.v1.core.sched.output import SchedulerOutput  # noqa: E402
from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput  # noqa: E402

from test_vllm_engine_core import (  # noqa: E402
    FakeExecutor,
    Run,
    RunnerRequest,
    assert_same_runs,
    run_engine,
)
from vllm_pair import scheduler_output_view  # noqa: E402

K = 3  # num_speculative_tokens


class NgramGpuExecutor(FakeExecutor):
    """The fake runner of ``test_vllm_engine_core`` verifying drafts: a
    draft is accepted while it equals the token the request samples at its
    position (a -1 never does). Asynchronous, the placeholders are the
    runner's own drafts, accepted in a number fixed by the request and
    position. Its proposer hands over ngram_gpu's shape: ``K`` drafts, some
    right, some wrong, the rest -1."""

    def _init_executor(self) -> None:
        super()._init_executor()
        self.proposable: dict[str, int] = {}  # request -> computed, after the last step

    def execute_model(  # type: ignore[override]
        self, scheduler_output: SchedulerOutput, non_block: bool = False
    ) -> ModelRunnerOutput | None | Future[ModelRunnerOutput | None]:
        so = scheduler_output
        self.received.append(copy.deepcopy(scheduler_output_view(so)))
        self._update_states(so)
        sampled: dict[str, list[int]] = {}
        self.proposable = {}
        for rid, n in so.num_scheduled_tokens.items():
            state = self.requests[rid]
            drafts = so.scheduled_spec_decode_tokens.get(rid, [])
            state.num_computed += n
            if state.num_computed < state.prefill_len:
                continue
            base = state.num_computed - len(drafts)  # the first position sampled
            accepted = self._accepted(rid, base, drafts)
            self.seen["drafts"] += len(drafts)
            self.seen["padding"] += drafts.count(-1) if not self._async else 0
            self.seen["accepted"] += accepted
            sampled[rid] = [self.token_fn(rid, base + i) for i in range(accepted + 1)]
            state.num_computed = base + accepted
            self.proposable[rid] = state.num_computed
        return self._hand_over(list(so.num_scheduled_tokens), sampled, non_block)

    @property
    def _async(self) -> bool:
        return bool(self.vllm_config.scheduler_config.async_scheduling)

    def _accepted(self, rid: str, base: int, drafts: list[int]) -> int:
        if self._async:  # placeholders: what the runner drafted itself
            return (int(rid[1:]) + base) % (len(drafts) + 1)
        n = 0
        while n < len(drafts) and drafts[n] == self.token_fn(rid, base + n):
            n += 1
        return n

    def _update_states(self, so: SchedulerOutput) -> None:
        # As the parent, but a continuing request's count is the runner's
        # own: under async scheduling the scheduler's runs ahead of the
        # rejections it has not yet seen.
        for rid in so.finished_req_ids | (so.preempted_req_ids or set()):
            self.requests.pop(rid, None)
        for d in so.scheduled_new_reqs:
            tokens = d.prefill_token_ids if d.prefill_token_ids is not None else d.prompt_token_ids
            assert tokens is not None
            self.requests[d.req_id] = RunnerRequest(len(tokens), d.num_computed_tokens)

    def take_draft_token_ids(self) -> DraftTokenIds | None:  # type: ignore[override]
        """ngram_gpu's drafts for every request that sampled: the first
        ``right`` are the tokens it will sample, then one wrong one, then
        -1 to ``K``; a request with no match gets -1 only."""
        if not self.proposable:
            return None
        ids, drafts = [], []
        for rid, computed in self.proposable.items():
            start = computed + 1  # the next step's first sampled position
            right = (int(rid[1:]) * 7 + computed) % (K + 2) - 1  # -1: no match at all
            d = [self.token_fn(rid, start + i) for i in range(max(right, 0))]
            if 0 <= right < K:
                d.append(1 if self.token_fn(rid, start + right) != 1 else 4)  # a wrong one
            ids.append(rid)
            drafts.append((d + [-1] * K)[:K])
        return DraftTokenIds(req_ids=ids, draft_token_ids=drafts)


def run_speculating(scheduler_cls: str | None, async_scheduling: bool) -> Run:
    return run_engine(
        scheduler_cls,
        async_scheduling,
        executor_class=NgramGpuExecutor,
        speculative_config={
            "method": "ngram_gpu",
            "num_speculative_tokens": K,
            "prompt_lookup_max": 3,
            "prompt_lookup_min": 1,
        },
    )


def spec_stats(run: Run) -> Counter[str]:
    """The speculative-decoding stats the engine reported, summed."""
    total: Counter[str] = Counter()
    for _, outputs in run.steps:
        for eco in (outputs or {}).values():
            stats = (eco["scheduler_stats"] or {}).get("spec_decoding_stats")
            if stats:
                total["num_drafts"] += stats["num_drafts"]
                total["num_draft_tokens"] += stats["num_draft_tokens"]
                total["num_accepted_tokens"] += stats["num_accepted_tokens"]
    return total


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_engine_core_runs_padded_ngram_gpu_drafts_like_vllm(async_scheduling: bool) -> None:
    ours = run_speculating("ironbatch.vllm.Scheduler", async_scheduling)
    theirs = run_speculating(None, async_scheduling)
    ours_seen, theirs_seen = ours.runner_counts, theirs.runner_counts
    assert ours.scheduler_module == "ironbatch.vllm.scheduler"
    assert theirs.scheduler_module.startswith("vllm.v1.core.sched.")
    # The workload really verifies drafts, padded ones among them (sync),
    # and some are accepted.
    assert theirs_seen["drafts"] >= 100 and theirs_seen["accepted"] >= 20, theirs_seen
    if not async_scheduling:
        assert theirs_seen["padding"] >= 50, theirs_seen
    # vLLM counts the padding as drafts (all but those of steps whose
    # output it drops: an aborted request's; async, also a finished one's
    # step already in flight).
    stats = spec_stats(theirs)
    assert stats["num_draft_tokens"] >= 100, stats
    if not async_scheduling:
        assert 0 <= theirs_seen["drafts"] - stats["num_draft_tokens"] <= 3 * K, stats
    assert ours_seen == theirs_seen
    assert spec_stats(ours) == stats
    assert_same_runs(ours, theirs)
