"""How close the simulator comes to the real engine: one workload through
``LLMEngine`` in real time (``engine_replay``) and through the simulator
with a step model profiled on that engine, the engine's settings mirrored;
median and p90 TTFT and E2E side by side. The CPU test
(tests/test_simulate_fidelity.py) and the GPU run (benches/gpu/
simulate_fidelity.py) both report this."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ironbatch.simulation.engine_replay import replay_on_engine
from ironbatch.simulation.run import simulate
from ironbatch.simulation.step_model import StepModel
from ironbatch.simulation.workload import Workload

METRICS = ("ttft p50", "ttft p90", "e2e p50", "e2e p90")


@dataclass
class Fidelity:
    """Per metric: the engine's value and the simulator's (seconds); and
    how busy the machine was (wall over CPU time inside the engine's steps:
    1 when nothing else ran)."""

    engine: dict[str, float] = field(default_factory=dict)
    simulated: dict[str, float] = field(default_factory=dict)
    busy: float = 1.0

    def error(self, metric: str) -> float:
        return (self.simulated[metric] - self.engine[metric]) / self.engine[metric]

    def table(self) -> str:
        lines = ["| metric | engine ms | simulated ms | error |", "|---|---|---|---|"]
        for m in METRICS:
            lines.append(f"| {m} | {self.engine[m] * 1e3:,.1f} | {self.simulated[m] * 1e3:,.1f} | "
                         f"{self.error(m):+.1%} |")  # fmt: skip
        return "\n".join(lines)


def engine_settings(engine: Any) -> dict[str, Any]:
    """The simulator's settings for what ``engine`` runs (synchronous, as
    LLMEngine steps)."""
    c = engine.scheduler.scheduler_config
    cache = engine.scheduler.cache_config
    return {
        "async_scheduling": False,
        "max_num_seqs": c.max_num_seqs,
        "max_num_batched_tokens": c.max_num_batched_tokens,
        "max_model_len": c.max_model_len,
        "enable_chunked_prefill": c.enable_chunked_prefill,
        "long_prefill_token_threshold": c.long_prefill_token_threshold,
        "policy": c.policy,
        "num_blocks": cache.num_blocks,
        "block_size": cache.block_size,
        "enable_prefix_caching": cache.enable_prefix_caching,
    }


def measure(engine: Any, workload: Workload, step_model: StepModel, *, clock: str) -> Fidelity:
    """Run ``workload`` on ``engine`` (on ``clock``: "wall" or "thread") and
    in the simulator; compare."""
    w = replace(workload, vocab_size=min(workload.vocab_size, engine.model_config.vocab_size))
    real = replay_on_engine(engine, w, clock=clock)
    if not (real["output_tokens"] == w.output_tokens).all():
        raise AssertionError("the engine generated other lengths than the workload's")
    sim = simulate(w, config=engine_settings(engine), step_model=step_model).requests
    out = Fidelity(busy=float(real["busy_s"][0] / real["busy_cpu_s"][0]))
    for key, measured, simulated in [
        ("ttft", real["first_token_s"] - real["arrival_s"], sim["ttft_s"]),
        ("e2e", real["finish_s"] - real["arrival_s"], sim["e2e_s"]),
    ]:
        for q in (50, 90):
            out.engine[f"{key} p{q}"] = float(np.percentile(measured, q))
            out.simulated[f"{key} p{q}"] = float(np.percentile(simulated, q))
    return out
