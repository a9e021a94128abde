"""End to end through vLLM 0.33's own engine loop: ``EngineCore`` resolves
``scheduler_cls="ironbatch.vllm.Scheduler"`` itself, builds the KV cache
config from what the executor reports, turns ``EngineCoreRequest``s into
``Request``s and drives ``step()`` (sync) or ``step_with_batch_queue()``
(async scheduling, two batches in flight), aborts included. The executor is
a fake on the CPU that samples deterministic tokens, so the same workload
run under vLLM's scheduler and under the drop-in must give equal
SchedulerOutputs (as the executor received them) and equal EngineCoreOutputs
at every step."""

from __future__ import annotations

import copy
import dataclasses
import random
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import pytest

pytest.importorskip("vllm")

import torch  # noqa: E402
import vllm.envs  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.v1.core.sched.output import GrammarOutput, SchedulerOutput  # noqa: E402
from vllm.v1.engine import EngineCoreRequest  # noqa: E402
from vllm.v1.engine.core import EngineCore  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheSpec  # noqa: E402
from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, ModelRunnerOutput  # noqa: E402

from ironbatch.vllm.harness import EOS, vllm_config  # noqa: E402

from stand_in_executor import StandInExecutor  # noqa: E402
from vllm_pair import engine_outputs_view, scheduler_output_view  # noqa: E402

BLOCK_SIZE = 16
NUM_BLOCKS = 40  # what EngineCore must size the cache to (null block included)
MAX_MODEL_LEN = 256
VOCAB = 60
STOP = 7
NUM_REQUESTS = 48
SPEC = FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=1, head_size=1, dtype=torch.float32)

TokenFn = Callable[[str, int], int]


def token_for(request_id: str, position: int) -> int:
    """The token a request samples at ``position``: a fixed function of the
    two, so both runs sample alike wherever their schedules agree."""
    v = (int(request_id[1:]) * 31 + position * 17) % 89
    return EOS if v == 0 else STOP if v == 1 else 3 + v % (VOCAB - 3)


@dataclasses.dataclass
class RunnerRequest:
    """What a model runner keeps per live request."""

    prefill_len: int  # tokens to compute before the first sample
    num_computed: int


class FakeExecutor(StandInExecutor):
    """One CPU "worker" with one full-attention layer and room for exactly
    NUM_BLOCKS blocks; runs no model. Like the GPU model runner it answers
    ``execute_model`` with None and hands the step's output to the following
    ``sample_tokens``, and it tracks requests from the SchedulerOutputs alone:
    a request samples once a step reaches the end of its known tokens."""

    def _init_executor(self) -> None:
        self.requests: dict[str, RunnerRequest] = {}
        self.received: list[dict[str, Any]] = []  # each SchedulerOutput, as received
        self.pending: ModelRunnerOutput | None = None
        self.token_fn: TokenFn = token_for
        self.seen: Counter[str] = Counter()  # what a subclass counts as it runs

    # -- start-up: what profiling and KV-cache allocation would report ---------

    def get_kv_cache_specs(self) -> list[dict[str, KVCacheSpec]]:
        return [{"model.layers.0.self_attn.attn": SPEC}]

    def get_supported_kv_cache_layouts(self) -> list[list[str]]:
        return [["LBNHC"]]

    def determine_available_memory(self) -> list[int]:
        return [NUM_BLOCKS * SPEC.page_size_bytes]

    def initialize_from_config(self, kv_cache_configs: list[KVCacheConfig]) -> None:
        assert [c.num_blocks for c in kv_cache_configs] == [NUM_BLOCKS]

    # -- steps ------------------------------------------------------------------

    def execute_model(  # type: ignore[override]
        self, scheduler_output: SchedulerOutput, non_block: bool = False
    ) -> ModelRunnerOutput | None | Future[ModelRunnerOutput | None]:
        # A copy: the scheduler may reuse what it handed out in a later step.
        self.received.append(copy.deepcopy(scheduler_output_view(scheduler_output)))
        self._update_states(scheduler_output)
        sampled: dict[str, list[int]] = {}
        for rid, n in scheduler_output.num_scheduled_tokens.items():
            state = self.requests[rid]
            state.num_computed += n
            if state.num_computed >= state.prefill_len:
                sampled[rid] = [self.token_fn(rid, state.num_computed)]
        return self._hand_over(list(scheduler_output.num_scheduled_tokens), sampled, non_block)

    def _hand_over(
        self, ids: list[str], sampled: dict[str, list[int]], non_block: bool
    ) -> ModelRunnerOutput | None | Future[ModelRunnerOutput | None]:
        """What ``execute_model`` returns: None, with the step's samples kept
        for ``sample_tokens``; with nothing scheduled, the empty output now."""
        output: ModelRunnerOutput | None = None
        if ids:
            self.pending = ModelRunnerOutput(
                req_ids=ids,
                req_id_to_index={rid: i for i, rid in enumerate(ids)},
                sampled_token_ids=[sampled.get(rid, []) for rid in ids],
            )
        else:
            output = EMPTY_MODEL_RUNNER_OUTPUT  # nothing to sample: the output now
        return _done(output) if non_block else output

    def sample_tokens(  # type: ignore[override]
        self, grammar_output: GrammarOutput | None, non_block: bool = False
    ) -> ModelRunnerOutput | Future[ModelRunnerOutput]:
        assert grammar_output is None and self.pending is not None
        output, self.pending = self.pending, None
        return _done(output) if non_block else output

    def _update_states(self, so: SchedulerOutput) -> None:
        """Forget finished and preempted requests, admit new ones (resumed
        ones come back as new, with all their tokens to prefill), and take
        each continuing request's computed count from the scheduler."""
        for rid in so.finished_req_ids | (so.preempted_req_ids or set()):
            self.requests.pop(rid, None)
        for d in so.scheduled_new_reqs:
            assert d.req_id not in self.requests, d.req_id
            tokens = d.prefill_token_ids if d.prefill_token_ids is not None else d.prompt_token_ids
            assert tokens is not None
            self.requests[d.req_id] = RunnerRequest(len(tokens), d.num_computed_tokens)
        cached = so.scheduled_cached_reqs
        for rid, computed in zip(cached.req_ids, cached.num_computed_tokens, strict=True):
            # The scheduler's count must be what this runner has computed.
            assert self.requests[rid].num_computed == computed, rid


def _done(value: Any) -> Future[Any]:
    future: Future[Any] = Future()
    future.set_result(value)
    return future


# -- the workload ---------------------------------------------------------------


@dataclasses.dataclass
class Workload:
    """Requests by arrival tick, and aborts by tick: ``direct`` ones go
    through ``EngineCore.abort_requests`` between steps, ``queued`` ones
    through its aborts queue, which a step drains while the model runs."""

    arrivals: dict[int, list[EngineCoreRequest]]
    direct_aborts: dict[int, list[str]]
    queued_aborts: dict[int, list[str]]


def make_workload(seed: int = 7) -> Workload:
    """NUM_REQUESTS requests over the first ticks: varied prompt lengths,
    shared prefixes, stop tokens, ignore_eos, max_tokens; each fits the cache
    alone, together they overflow it."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(3, VOCAB) for _ in range(MAX_MODEL_LEN)] for _ in range(3)]
    arrivals: dict[int, list[EngineCoreRequest]] = {}
    for i in range(NUM_REQUESTS):
        plen = rng.randint(1, 120)
        shared = rng.choice([0, plen // 2, plen])
        prompt = rng.choice(prefixes)[:shared] + [
            rng.randrange(3, VOCAB) for _ in range(plen - shared)
        ]
        sp = SamplingParams(
            max_tokens=rng.randint(1, MAX_MODEL_LEN - plen),
            ignore_eos=rng.random() < 0.2,
            stop_token_ids=[STOP] if rng.random() < 0.4 else [],
        )
        sp.update_from_generation_config({}, EOS)  # what the input processor does
        tick = i // 3 + rng.choice([0, 0, 4])
        request = EngineCoreRequest(
            request_id=f"r{i}",
            prompt_token_ids=prompt,
            mm_features=None,
            sampling_params=sp,
            pooling_params=None,
            arrival_time=float(tick),
            lora_request=None,
            cache_salt=None,
            data_parallel_rank=None,
        )
        arrivals.setdefault(tick, []).append(request)
    # r0, r1 and r3 are mid-generation when aborted; r12 has no token yet and
    # r37 arrives in the same tick; r8 and r15 have already finished (EOS)
    # and r999 never exists, so aborting those must change nothing.
    direct = {12: ["r0"], 16: ["r37"], 25: ["r8", "r1", "r999"]}
    queued = {10: ["r3"], 30: ["r12", "r15"]}
    return Workload(arrivals, direct, queued)


@dataclasses.dataclass
class Run:
    """What one engine run produced, step by step."""

    scheduler_module: str
    scheduler_outputs: list[dict[str, Any]]  # as the executor received them
    steps: list[tuple[bool, dict[int, Any] | None]]  # (model executed, outputs)
    transcripts: dict[str, tuple[list[int], Any, Any]]  # tokens, finish, stop reason
    final: tuple[Any, ...]  # the scheduler's counts once drained
    # What the engine derived from its scheduler: the attention block size
    # it reports to the front-end, and its KV-cache group metadata.
    engine_facts: tuple[Any, ...] = ()
    # What the executor counted as it ran (its ``seen``).
    runner_counts: Counter[str] = dataclasses.field(default_factory=Counter)


def run_engine(
    scheduler_cls: str | None,
    async_scheduling: bool,
    token_fn: TokenFn = token_for,
    executor_class: type[FakeExecutor] | None = None,
    **settings: Any,
) -> Run:
    """The workload through a fresh EngineCore with the fake executor (or
    ``executor_class``); ``settings`` go to vLLM's config."""
    config, _ = vllm_config(
        scheduler_cls,
        block_size=BLOCK_SIZE,
        max_model_len=MAX_MODEL_LEN,
        max_num_seqs=16,
        max_num_batched_tokens=128,
        async_scheduling=async_scheduling,
        **settings,
    )
    engine = EngineCore(config, executor_class=executor_class or FakeExecutor, log_stats=True)
    try:
        run = _drive(engine, async_scheduling, token_fn)
        run.engine_facts = (
            engine.vllm_config.cache_config.effective_attention_block_size,
            engine.get_kv_cache_group_metadata(),
        )
        executor = engine.model_executor
        assert isinstance(executor, FakeExecutor)
        run.runner_counts = executor.seen
        return run
    finally:
        engine.shutdown()
        # EngineCore caches vLLM's environment variables for good once built;
        # undo that so that later tests can still set them.
        vllm.envs.disable_envs_cache()


def _drive(engine: EngineCore, async_scheduling: bool, token_fn: TokenFn) -> Run:
    """Feed arrivals and aborts tick by tick, one engine step per tick (as
    EngineCoreProc's busy loop does), until everything has drained."""
    executor = engine.model_executor
    assert isinstance(executor, FakeExecutor)
    executor.token_fn = token_fn
    assert engine.vllm_config.cache_config.num_gpu_blocks == NUM_BLOCKS
    assert (engine.batch_queue is not None) == async_scheduling
    scheduler = engine.scheduler
    workload = make_workload()
    run = Run(type(scheduler).__module__, executor.received, [], {}, ())
    last_tick = max(workload.arrivals)
    for tick in range(10_000):
        for request in workload.arrivals.get(tick, []):
            engine.add_request(*engine.preprocess_add_request(request))
        engine.abort_requests(workload.direct_aborts.get(tick, []))
        if queued := workload.queued_aborts.get(tick):
            engine.aborts_queue.put(queued)
        if tick > last_tick and not scheduler.has_requests() and not engine.batch_queue:
            break
        outputs, executed = engine.step_fn()
        engine.post_step(executed)
        # A batch-queue step that only scheduled returns None: kept, so the
        # steps' shapes are compared too.
        run.steps.append((executed, None if outputs is None else engine_outputs_view(outputs)))
        for eco in (outputs or {}).values():
            for out in eco.outputs:
                tokens, _, _ = run.transcripts.get(out.request_id, ([], None, None))
                run.transcripts[out.request_id] = (
                    tokens + list(out.new_token_ids),
                    out.finish_reason,
                    out.stop_reason,
                )
    else:
        raise AssertionError("the engine never drained")
    run.final = (
        scheduler.get_request_counts(),
        scheduler.get_num_unfinished_requests(),
        scheduler.has_finished_requests(),
        scheduler.get_kv_cache_usage(),
    )
    return run


def exercised(run: Run) -> Counter[str]:
    """What a run went through: preemptions, prefix-cache hits, resumptions
    and each way of finishing ("stop None" is EOS, "stop 7" the stop token,
    "None None" an abort after some output)."""
    seen: Counter[str] = Counter()
    for so in run.scheduler_outputs:
        seen["preempted"] += len(so["preempted_req_ids"] or ())
        for d in so["scheduled_new_reqs"]:
            seen["prefix hits"] += d["num_computed_tokens"] > 0
            seen["resumed"] += len(d["prefill_token_ids"] or ()) > len(d["prompt_token_ids"])
    for _, finish, stop in run.transcripts.values():
        seen[f"{finish} {stop}"] += 1
    return seen


def assert_same_runs(ours: Run, theirs: Run) -> None:
    """Equal per-request results first (the readable failure), then equal
    SchedulerOutputs and engine steps, one by one."""
    assert ours.transcripts == theirs.transcripts
    for i, (a, b) in enumerate(zip(ours.scheduler_outputs, theirs.scheduler_outputs, strict=False)):
        assert a == b, f"SchedulerOutput {i}"
    assert len(ours.scheduler_outputs) == len(theirs.scheduler_outputs)
    for i, (a, b) in enumerate(zip(ours.steps, theirs.steps, strict=False)):
        assert a == b, f"engine step {i}"
    assert len(ours.steps) == len(theirs.steps)
    assert ours.final == theirs.final == ((0, 0), 0, False, 0.0)
    assert ours.engine_facts == theirs.engine_facts
    assert theirs.engine_facts[0] == BLOCK_SIZE


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_engine_core_runs_the_drop_in_like_vllm(async_scheduling: bool) -> None:
    ours = run_engine("ironbatch.vllm.Scheduler", async_scheduling)
    theirs = run_engine(None, async_scheduling)
    # EngineCore resolved the drop-in itself, not its fallback to vLLM's own.
    assert ours.scheduler_module == "ironbatch.vllm.scheduler"
    assert theirs.scheduler_module.startswith("vllm.v1.core.sched.")
    seen = exercised(theirs)
    for what in ("preempted", "resumed", "prefix hits", "stop None", "stop 7", "length None"):
        assert seen[what] >= 5, (what, seen)
    assert seen["None None"] >= 3, seen  # aborts after some output
    assert_same_runs(ours, theirs)
