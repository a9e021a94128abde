"""vLLM 0.33's own scheduler on the simulator's clock: the exactness test's
reference. It drives ``vllm.v1.core.sched`` (built by
``ironbatch.vllm.harness`` as EngineCore builds it) through the same loop the
simulator runs in Rust (rust/src/simulate/clock.rs) — requests added once
the clock reaches their arrival, a step launched after the CPU overhead once
the device is free, outputs applied when the step ends, one step late under
async scheduling — written here again in Python from vLLM's own outputs: the
batch shape from its SchedulerOutput, sampled tokens from a runner that
tracks what it was told, first tokens and finishes from its
EngineCoreOutputs. Only the step model's arithmetic is shared (the same
``_core.StepTimeModel``), so equal clocks mean equal decisions."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ironbatch.bench.vllm_driver import RunnerEmulator
from ironbatch.simulation.batch_shape import batch_shape
from ironbatch.simulation.run import SAMPLED_TOKEN
from ironbatch.simulation.step_model import StepModel
from ironbatch.simulation.workload import Workload
from ironbatch.vllm import harness

# The settings harness.make_scheduler takes from a resolved simulator config.
HARNESS_SETTINGS = (
    "max_num_seqs", "max_num_batched_tokens", "max_model_len", "enable_chunked_prefill",
    "long_prefill_token_threshold", "policy", "block_size", "num_blocks",
    "enable_prefix_caching", "async_scheduling",
)  # fmt: skip


@dataclass
class ClockRun:
    """Per step: its decisions ``[(request index, tokens), ...]`` and start;
    per request: when it first ran, got its first token and finished."""

    decisions: list[list[tuple[int, int]]] = field(default_factory=list)
    start_s: list[float] = field(default_factory=list)
    first_scheduled_s: np.ndarray = field(default_factory=lambda: np.zeros(0))
    first_token_s: np.ndarray = field(default_factory=lambda: np.zeros(0))
    finish_s: np.ndarray = field(default_factory=lambda: np.zeros(0))
    output_tokens: np.ndarray = field(default_factory=lambda: np.zeros(0))


def run_vllm(workload: Workload, settings: dict[str, Any], step_model: StepModel) -> ClockRun:
    sched = harness.make_scheduler("vllm", **{k: settings[k] for k in HARNESS_SETTINGS})
    clock = step_model.to_core()
    runner = RunnerEmulator(SAMPLED_TOKEN)
    n = len(workload)
    arrival = workload.arrival_s.tolist()
    run = ClockRun(
        first_scheduled_s=np.full(n, np.nan),
        first_token_s=np.full(n, np.nan),
        finish_s=np.full(n, np.nan),
        output_tokens=np.zeros(n, dtype=np.int64),
    )

    def apply(so: Any, mro: Any, end: float) -> None:
        for outputs in sched.update_from_output(so, mro).values():
            for o in outputs.outputs:
                i = int(o.request_id)
                if o.new_token_ids:
                    run.output_tokens[i] += len(o.new_token_ids)
                    if np.isnan(run.first_token_s[i]):
                        run.first_token_s[i] = end
                if o.finish_reason is not None:
                    run.finish_s[i] = end

    now = device_free = 0.0
    in_flight: tuple[Any, Any, float] | None = None
    next_request = 0
    while True:
        if sched.get_num_unfinished_requests() == 0:
            if in_flight is not None:
                apply(*in_flight)
                now = max(now, in_flight[2])
                in_flight = None
                continue
            if next_request == n:
                break
            now = max(now, arrival[next_request])
        while next_request < n and arrival[next_request] <= now:
            i = next_request
            sched.add_request(
                harness.make_request(
                    str(i),
                    workload.prompt_token_ids(i),
                    int(workload.output_tokens[i]),
                    block_size=settings["block_size"],
                    arrival_time=arrival[i],
                    ignore_eos=True,
                )
            )
            next_request += 1
        so = sched.schedule()
        mro = runner.output(so)
        ids = list(so.num_scheduled_tokens)
        computed = {d.req_id: d.num_computed_tokens for d in so.scheduled_new_reqs}
        cached = so.scheduled_cached_reqs
        computed.update(zip(cached.req_ids, cached.num_computed_tokens, strict=True))
        shape = batch_shape(
            [so.num_scheduled_tokens[r] for r in ids],
            [computed[r] for r in ids],
            [bool(t) for t in mro.sampled_token_ids],
        )
        if shape.num_requests == 0 and in_flight is None:
            if next_request == n:
                raise AssertionError(f"vLLM's scheduler stalled at {now} s")
            now = max(now, arrival[next_request])
            continue
        start = max(now + clock.overhead_s(shape.num_requests), device_free)
        end = start + clock.model_s(**shape.as_dict())
        device_free = end
        run.decisions.append([(int(r), so.num_scheduled_tokens[r]) for r in ids])
        run.start_s.append(start)
        for d in so.scheduled_new_reqs:
            i = int(d.req_id)
            if np.isnan(run.first_scheduled_s[i]):
                run.first_scheduled_s[i] = start
        if settings["async_scheduling"]:
            now = start
            if in_flight is not None:
                apply(*in_flight)
                now = max(now, in_flight[2])
            in_flight = (so, mro, end)
        else:
            apply(so, mro, end)
            now = end
    return run
