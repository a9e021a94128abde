"""Fidelity on this machine's CPU: a step-time model fitted by ``ironbatch
profile`` on the demo model, then the real engine (``LLMEngine``, arrivals
in real time) and the simulator on the same 300-request online workload;
median and p90 TTFT and E2E must agree within 10%.

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

Still, a process that shares the core evicts the engine's caches, and the
engine's CPU time per step grows with how busy the machine is. So each try
measures that: the wall-clock over CPU time of the profile's steps and of
the run's. A try where both stay within 10% (nothing else ran much) decides
the test; a busier try is tried again (a fresh profile and run), and if no
try of three was quiet the test is skipped, naming how busy the machine was
(CI runs on a machine of its own, where every try is quiet)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from ironbatch.engine import EngineArgs, LLMEngine  # noqa: E402
from ironbatch.model.random_model import write_random_llama  # noqa: E402
from ironbatch.simulation import simulate, synthetic_workload  # noqa: E402
from ironbatch.simulation.engine_replay import replay_on_engine  # noqa: E402
from ironbatch.simulation.profile import ProfileGrid, profile  # noqa: E402

ENGINE = {"max_num_seqs": 32, "max_num_batched_tokens": 512, "num_blocks": 600,
          "block_size": 16, "max_model_len": 512, "enable_prefix_caching": True}  # fmt: skip
SIMULATED = {"async_scheduling": False} | {
    k: ENGINE[k] for k in ("max_num_seqs", "max_num_batched_tokens", "num_blocks", "max_model_len")
}
# The shapes the workload's steps take: a few decoders, short contexts,
# prompts alone and beside decodes.
GRID = ProfileGrid(decode_batches=(1, 2, 4, 8, 16), contexts=(48, 160), prefills=(48, 192),
                   mixed_batches=(2, 8), new_requests=(1, 3))  # fmt: skip
WORKLOAD = (
    "synthetic:requests=300,rate=18,prompt_mean=64,prompt_sigma=0.5,output_mean=12,"
    "output_sigma=0.5,prefix_groups=4,prefix_tokens=32,seed=1"
)
TOLERANCE = 0.10


QUIET = 1.10  # wall over CPU time at most: nothing else took the core


def one_try(model_dir: Path) -> tuple[dict[str, float], float]:
    """The relative errors of the simulated percentiles, and how busy the
    machine was (the larger wall-over-CPU ratio of the profile and run)."""
    # ``ironbatch profile``'s fit, on the engine that then serves (as a
    # deployment profiles the engine it runs).
    engine = LLMEngine(EngineArgs(model=str(model_dir), dtype="float32", seed=0, **ENGINE))
    model = profile(engine, "demo model", grid=GRID, repeats=4, clock="cpu")
    w = replace(synthetic_workload(WORKLOAD), vocab_size=engine.model_config.vocab_size)
    real = replay_on_engine(engine, w, clock="thread")
    assert (real["output_tokens"] == w.output_tokens).all()
    sim = simulate(w, config=SIMULATED, step_model=model).requests
    got = {}
    for key, measured, simulated in [
        ("ttft", real["first_token_s"] - real["arrival_s"], sim["ttft_s"]),
        ("e2e", real["finish_s"] - real["arrival_s"], sim["e2e_s"]),
    ]:
        for q in (50, 90):
            m, s = np.percentile(measured, q), np.percentile(simulated, q)
            got[f"{key} p{q}"] = (s - m) / m
    busy = max(model.fit["wall_over_cpu"], float(real["busy_s"][0] / real["busy_cpu_s"][0]))
    return got, busy


def shown(tries: list[tuple[dict[str, float], float]]) -> str:
    return "; ".join(
        f"[wall/cpu {busy:.2f}] " + ", ".join(f"{k} {v:+.1%}" for k, v in errors.items())
        for errors, busy in tries
    )


def test_the_simulator_predicts_the_engines_latencies(tmp_path: Path) -> None:
    model_dir = write_random_llama(tmp_path / "demo", seed=0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    tries: list[tuple[dict[str, float], float]] = []
    try:
        for _ in range(3):
            tries.append(one_try(model_dir))
            if tries[-1][1] <= QUIET:
                break
    finally:
        torch.set_num_threads(threads)
    errors, busy = tries[-1]
    if busy > QUIET:
        pytest.skip(f"the machine was busy in every try (other processes took the core): "
                    f"{shown(tries)}")  # fmt: skip
    assert all(abs(e) <= TOLERANCE for e in errors.values()), f"simulated vs engine: {shown(tries)}"
