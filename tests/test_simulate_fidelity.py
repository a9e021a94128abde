"""Fidelity on this machine's CPU: a step-time model fitted by ``ironbatch
profile`` on the demo model, then the real engine (``LLMEngine``, arrivals
in real time) and the simulator on the same 300-request online workload;
median and p90 TTFT and E2E must agree within 10%.

A comparison of time measurements, so it is marked ``timing`` and left out
of the suite (the project's tests never assert a timing; CI would fail on a
noisy neighbour): run it on a quiet machine with
``python -m pytest -m timing tests/test_simulate_fidelity.py``. The
recorded tries are in benches/RESULTS.md ("fidelity on the CPU").

What makes it stable on a shared 2-core machine (other processes come and
go): the engine is single-threaded (one torch thread), so its work is this
thread's; the profile fits this thread's CPU seconds and the run keeps its
arrivals and stamps on the same thread clock (``replay_on_engine(...,
clock="thread")``: on a dedicated machine the same as the wall clock, on a
shared one without the time other processes took the core); the loop polls
between arrivals instead of sleeping, so its caches stay warm; the load is
light (about two requests in a step), where a few percent of step-time error
stays a few percent of latency instead of compounding in a queue; the
profile runs right before the run, on the engine that then serves.

Still, other processes slow the engine's steps (caches, memory bandwidth,
the core itself when they outnumber the free ones), which no clock of this
process can tell apart from the engine's own cost. So the test measures the
machine (``machine_load``): it waits (up to 30 s) for a second in which the
others leave a core free for the engine (they use at most
``(cpus - 0.9) / cpus`` of the CPUs: 55% on two), runs a try (a profile and
a run), and counts the try only if they stayed under that during it; it
tries at most twice, and if the machine was never that quiet it is skipped,
naming how busy it was. On this 2-core machine, tries with others at 52-54%
of the CPUs came within 6% and 10%; at 66% one came 34-42% low, and with a
core's worth of others or more (100%), 15-40% low."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from ironbatch.engine import EngineArgs, LLMEngine  # noqa: E402
from ironbatch.model.random_model import write_random_llama  # noqa: E402
from ironbatch.simulation import synthetic_workload  # noqa: E402
from ironbatch.simulation.fidelity import Fidelity, measure  # noqa: E402
from ironbatch.simulation.machine_load import (  # noqa: E402
    others_share,
    snapshot,
    wait_for_quiet,
)
from ironbatch.simulation.profile import ProfileGrid, profile  # noqa: E402

ENGINE = {"max_num_seqs": 32, "max_num_batched_tokens": 512, "num_blocks": 600,
          "block_size": 16, "max_model_len": 512, "enable_prefix_caching": True}  # fmt: skip
# The shapes the workload's steps take: a few decoders, short contexts,
# prompts alone and beside decodes.
GRID = ProfileGrid(decode_batches=(1, 2, 4, 8, 16), contexts=(48, 160), prefills=(48, 192),
                   mixed_batches=(2, 8), new_requests=(1, 3))  # fmt: skip
WORKLOAD = (
    "synthetic:requests=300,rate=18,prompt_mean=64,prompt_sigma=0.5,output_mean=12,"
    "output_sigma=0.5,prefix_groups=4,prefix_tokens=32,seed=1"
)
TOLERANCE = 0.10


# The most of the machine other processes may use during a try: they leave
# the engine a core.
QUIET = ((os.cpu_count() or 1) - 0.9) / (os.cpu_count() or 1)


def one_try(model_dir: Path) -> tuple[Fidelity, float]:
    """The engine's and the simulator's percentiles, and the share of the
    machine other processes used meanwhile."""
    start = snapshot()
    # ``ironbatch profile``'s fit, on the engine that then serves (as a
    # deployment profiles the engine it runs).
    engine = LLMEngine(EngineArgs(model=str(model_dir), dtype="float32", seed=0, **ENGINE))
    model = profile(engine, "demo model", grid=GRID, repeats=4, clock="cpu")
    result = measure(engine, synthetic_workload(WORKLOAD), model, clock="thread")
    return result, others_share(start, snapshot())


def shown(tries: list[tuple[Fidelity, float]]) -> str:
    return "; ".join(
        f"[others {busy:.0%} of the CPUs] " + ", ".join(f"{m} {f.error(m):+.1%}" for m in f.engine)
        for f, busy in tries
    )


@pytest.mark.timing
def test_the_simulator_predicts_the_engines_latencies(tmp_path: Path) -> None:
    model_dir = write_random_llama(tmp_path / "demo", seed=0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    tries: list[tuple[Fidelity, float]] = []
    try:
        for _ in range(2):
            before = wait_for_quiet(QUIET, within_s=30)
            if before > QUIET:
                break
            tries.append(one_try(model_dir))
            if tries[-1][1] <= QUIET:
                break
    finally:
        torch.set_num_threads(threads)
    if not tries or tries[-1][1] > QUIET:
        pytest.skip(f"the machine was never quiet (other processes used {before:.0%} of the "
                    f"CPUs before a try): {shown(tries) or 'no try ran'}")  # fmt: skip
    result = tries[-1][0]
    worst = max(abs(result.error(m)) for m in result.engine)
    assert worst <= TOLERANCE, f"simulated vs engine: {shown(tries)}"
