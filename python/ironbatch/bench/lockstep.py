"""Replay a trace through several schedulers in lockstep, in one process:
every scheduler gets the same requests before the same step, every step's
decisions must be identical, and each scheduler's ``schedule()`` +
``update_from_output()`` is timed per step on the wall clock
(``time.perf_counter_ns``) and in thread CPU time (``time.thread_time_ns``).

A lane wraps a bench driver (``IronbatchDriver``, or ``VllmDriver`` where
vLLM is installed): its ``add``, ``schedule``, ``run_model`` and ``update``,
with async scheduling handled as ``TimedDriver.step`` does (a step's output
is applied after the next ``schedule()``). The lanes take turns within each
step, the first to go rotating, so none always finds the caches another has
just used. Decisions are the scheduled requests and their token counts:
lanes of one interface (vLLM's SchedulerOutput; the core's) must also agree
on their order, lanes of different interfaces on the tokens per request id.
The first lane is the reference. Nothing here imports vLLM; ``vllm_lane``
does, when called."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ironbatch.bench.azure_trace import TraceRequest
from ironbatch.bench.scheduler_steps import IronbatchDriver
from ironbatch.bench.trace_workload import Deployment, arrival_steps, trace_request

Decisions = list[tuple[str, int]]


class Driver(Protocol):
    """A bench driver's parts (``scheduler_steps.TimedDriver``)."""

    name: str
    async_scheduling: bool
    pending: tuple[Any, Any] | None
    sched: Any

    def add(self, request: Any) -> None: ...

    def schedule(self) -> Any: ...

    def run_model(self, out: Any) -> Any: ...

    def update(self, out: Any, result: Any) -> None: ...


class DivergenceError(AssertionError):
    """Two schedulers decided differently."""


def core_decisions(out: Any) -> Decisions:
    """An ``ironbatch.SchedulerOutput``'s requests and tokens, in order."""
    return list(zip(out.req_ids, out.num_scheduled.tolist(), strict=True))


def vllm_decisions(so: Any) -> Decisions:
    """A vLLM ``SchedulerOutput``'s requests and tokens, in order."""
    return list(so.num_scheduled_tokens.items())


@dataclass
class Lane:
    """One scheduler in the replay, and its step times (ns)."""

    name: str
    driver: Driver
    decisions: Callable[[Any], Decisions]
    interface: str  # lanes of one interface must agree on order too
    wall_ns: list[int] = field(default_factory=list)
    cpu_ns: list[int] = field(default_factory=list)

    def step(self) -> Decisions:
        """One timed step: ``schedule()``, the runner (not timed), then
        ``update_from_output()`` for this step, or under async scheduling
        for the one before."""
        d = self.driver
        # The wall clock inside the CPU clock: reading thread CPU time is a
        # system call (0.7 µs warm, 1 µs cold here), and four of them inside
        # the wall windows added 3–4 µs to every lane's step; reading the
        # wall clock costs 70 ns and stays out of the windows' edges.
        c0 = time.thread_time_ns()
        w0 = time.perf_counter_ns()
        out = d.schedule()
        w1 = time.perf_counter_ns()
        c1 = time.thread_time_ns()
        result = d.run_model(out)
        applied: tuple[Any, Any] | None = (out, result)
        if d.async_scheduling:
            applied, d.pending = d.pending, (out, result)
        c2 = time.thread_time_ns()
        w2 = time.perf_counter_ns()
        if applied is not None:
            d.update(*applied)
        w3 = time.perf_counter_ns()
        c3 = time.thread_time_ns()
        self.wall_ns.append(w1 - w0 + w3 - w2)
        self.cpu_ns.append(c1 - c0 + c3 - c2)
        return self.decisions(out)

    def unfinished(self) -> int:
        return int(self.driver.sched.get_num_unfinished_requests())


def core_lane(deployment: Deployment, *, backend: str, async_scheduling: bool) -> Lane:
    """``ironbatch.Scheduler`` on ``backend`` ("rust": the core; "python":
    the twin)."""
    driver = IronbatchDriver(deployment, backend, async_scheduling)
    name = {"rust": "core", "python": "twin"}[backend]
    return Lane(name, driver, core_decisions, interface="core")


def vllm_lane(deployment: Deployment, *, kind: str, async_scheduling: bool) -> Lane:
    """vLLM's own scheduler (``kind="vllm"``) or the drop-in
    (``"ironbatch"``); needs vLLM installed."""
    from ironbatch.bench.vllm_driver import VERSION, VllmDriver
    from ironbatch.vllm import Scheduler as DropIn

    driver = VllmDriver(deployment, kind, async_scheduling)
    if kind == "ironbatch" and not isinstance(driver.sched, DropIn):
        raise RuntimeError(
            f"the drop-in handed this configuration to vLLM's scheduler "
            f"({type(driver.sched).__name__}); nothing of ironbatch's would be timed"
        )
    name = f"vLLM {VERSION}" if kind == "vllm" else "drop-in"
    return Lane(name, driver, vllm_decisions, interface="vllm")


@dataclass
class Replay:
    """What a replay ran: per executed step, the requests it scheduled (the
    running-request count it is bucketed by) and the lanes' times."""

    lanes: list[Lane]
    scheduled: list[int] = field(default_factory=list)
    requests_added: int = 0
    last_step: int = 0  # the model-time step the replay stopped at
    finished: bool = False  # every request of the trace finished
    wall_s: float = 0.0  # the whole replay, drivers' bookkeeping included


def _diff(ref: Decisions, other: Decisions, by_order: bool) -> str:
    if by_order and dict(ref) == dict(other):
        return f"same tokens per request, in another order: {ref[:8]} vs {other[:8]}"
    a, b = dict(ref), dict(other)
    ids = [rid for rid in dict.fromkeys([*a, *b]) if a.get(rid) != b.get(rid)]
    shown = ", ".join(f"{rid}: {a.get(rid)} vs {b.get(rid)}" for rid in ids[:8])
    return f"{len(ids)} requests differ ({shown})"


def check_same(lanes: Sequence[Lane], decided: Sequence[Decisions], step: int) -> None:
    """Every lane decided as the first; raises DivergenceError naming both."""
    ref_lane, ref = lanes[0], decided[0]
    for lane, got in zip(lanes[1:], decided[1:], strict=True):
        by_order = lane.interface == ref_lane.interface
        same = got == ref if by_order else dict(got) == dict(ref)
        if not same:
            raise DivergenceError(
                f"step {step}: {lane.name} decided otherwise than {ref_lane.name}: "
                + _diff(ref, got, by_order)
            )


def replay(
    lanes: Sequence[Lane],
    rows: Sequence[TraceRequest],
    *,
    deployment: Deployment,
    step_ms: float = 30.0,
    rate_scale: float = 1.0,
    max_steps: int | None = None,
    log: Callable[[str], None] = lambda s: None,
    log_every: int = 500,
) -> Replay:
    """Replay ``rows`` through ``lanes`` until every request finished or
    ``max_steps`` steps ran. Idle stretches (nothing unfinished, the next
    arrival later) are skipped, not stepped."""
    if not lanes:
        raise ValueError("replay needs at least one lane")
    lanes = list(lanes)
    due = arrival_steps(rows, step_ms=step_ms, rate_scale=rate_scale)
    # As vLLM's EngineCore does once built (vllm.utils.gc_utils
    # .freeze_gc_heap): what exists now (the lanes, the imports) is left out
    # of every collection, so the oldest generation's collections, which
    # land in whichever lane's step is timed, scan only what serving made.
    gc.collect()
    gc.freeze()
    try:
        out = Replay(lanes)
        started = time.perf_counter()
        clock = 0  # the model-time step about to run
        next_row = 0
        unfinished = 0
        executed = 0
        while max_steps is None or executed < max_steps:
            if unfinished == 0:
                if next_row == len(rows):
                    out.finished = True
                    break
                clock = max(clock, due[next_row])  # idle until the next arrival
            while next_row < len(rows) and due[next_row] <= clock:
                for lane in lanes:  # a Request each: schedulers keep theirs
                    lane.driver.add(
                        trace_request(
                            next_row,
                            rows[next_row],
                            max_model_len=deployment.max_model_len,
                            rate_scale=rate_scale,
                        )
                    )
                next_row += 1
            first = executed % len(lanes)
            decided: list[Decisions] = [[] for _ in lanes]
            for i in [*range(first, len(lanes)), *range(first)]:
                decided[i] = lanes[i].step()
            check_same(lanes, decided, clock)
            counts = [lane.unfinished() for lane in lanes]
            if len(set(counts)) > 1:
                names = ", ".join(f"{lane.name} {n}" for lane, n in zip(lanes, counts, strict=True))
                raise DivergenceError(f"step {clock}: unfinished requests differ: {names}")
            unfinished = counts[0]
            out.scheduled.append(len(decided[0]))
            executed += 1
            clock += 1
            if log_every and executed % log_every == 0:
                log(
                    f"step {executed} (model time {clock * step_ms / 1000:,.1f} s): "
                    f"{len(decided[0])} scheduled, {unfinished} unfinished, "
                    f"{next_row}/{len(rows)} requests added, "
                    f"{time.perf_counter() - started:,.1f} s"
                )
        out.requests_added = next_row
        out.last_step = clock
        out.wall_s = time.perf_counter() - started
        return out
    finally:
        gc.unfreeze()  # a replay run in-process (tests) leaves the heap as it was
