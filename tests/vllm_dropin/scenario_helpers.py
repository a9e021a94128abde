"""What the scenario files (test_vllm_scenarios, test_vllm_upstream) share:
building requests, feeding a step's output back, reading outputs, and
running the engine loop of async scheduling, all through the public
scheduler surface, so each scenario runs unchanged on vLLM's scheduler and on
the drop-in."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

import pytest
from vllm.sampling_params import StructuredOutputsParams
from vllm.v1.core.sched.output import NewRequestData, SchedulerOutput
from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs
from vllm.v1.metrics.stats import SchedulerStats
from vllm.v1.request import Request

import vllm_setup

Ecos = dict[int, EngineCoreOutputs]
Sampler = Callable[[SchedulerOutput], dict[str, list[int]]]

sync_and_async = pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])


def req(req_id: str, prompt: Sequence[int], max_tokens: int = 16, **kwargs: Any) -> Request:
    return vllm_setup.make_request(req_id, prompt, max_tokens, **kwargs)


def update(sched: Any, so: SchedulerOutput, sampled: dict[str, list[int]] | None = None) -> Ecos:
    """Feed the model runner's result for ``so`` back to the scheduler."""
    return sched.update_from_output(so, vllm_setup.runner_output(so, sampled))


def by_req(ecos: Ecos) -> dict[str, EngineCoreOutput]:
    """All per-request outputs of one update, whatever client they go to."""
    return {out.request_id: out for eco in ecos.values() for out in eco.outputs}


def stats_of(ecos: Ecos) -> SchedulerStats:
    """The one SchedulerStats an update returns (attached to one client)."""
    found = [eco.scheduler_stats for eco in ecos.values() if eco.scheduler_stats is not None]
    assert len(found) == 1
    return found[0]


def new_ids(so: SchedulerOutput) -> list[str]:
    return [new.req_id for new in so.scheduled_new_reqs]


def new_data(so: SchedulerOutput, req_id: str) -> NewRequestData:
    (found,) = [new for new in so.scheduled_new_reqs if new.req_id == req_id]
    return found


def pipeline(
    sched: Any,
    sampled: Sampler,
    *,
    depth: int = 2,
    before_each_update: Callable[[], None] | None = None,
) -> tuple[list[SchedulerOutput], list[Ecos]]:
    """Run the engine loop of async scheduling: keep up to ``depth`` steps in
    flight, apply the oldest step's output, schedule again, until idle.

    ``sampled(so)`` gives the tokens for a step. Returns every SchedulerOutput
    (empty ones included) and every update's outputs."""
    schedules: list[SchedulerOutput] = []
    updates: list[Ecos] = []
    in_flight: deque[SchedulerOutput] = deque()
    for _ in range(depth):
        so = sched.schedule()
        schedules.append(so)
        if so.total_num_scheduled_tokens:
            in_flight.append(so)
    while in_flight:
        if before_each_update is not None:
            before_each_update()
        so = in_flight.popleft()
        updates.append(update(sched, so, sampled(so)))
        so = sched.schedule()
        schedules.append(so)
        if so.total_num_scheduled_tokens:
            in_flight.append(so)
    return schedules, updates


def one_token_each(token: int) -> Sampler:
    """Sampler for ``pipeline``: every scheduled request samples ``token``."""
    return lambda so: {rid: [token] for rid in so.num_scheduled_tokens}


def structured(sched: Any, req_id: str, prompt: Sequence[int], **kwargs: Any) -> Future:
    """Add a structured-output request whose grammar is still compiling (as
    EngineCore's ``grammar_init`` leaves it); returns the compile's Future."""
    schema = StructuredOutputsParams(json={"type": "object"})
    r = req(req_id, prompt, structured_outputs=schema, **kwargs)
    future: Future = Future()
    r.structured_output_request.grammar = future
    sched.add_request(r)
    return future
