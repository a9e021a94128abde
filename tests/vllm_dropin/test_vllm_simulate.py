"""The simulator against vLLM 0.33's own scheduler: the same workload on the
same step-time clock must give identical per-step decisions, step start
times and per-request TTFT and E2E, on Azure-shaped and Mooncake-shaped
workloads, sync and async, with prefix caching on (and a cache tight enough
to preempt)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

from ironbatch.bench.azure_trace import synthetic_trace_csv
from ironbatch.simulation import load_step_model, load_workload, simulate
from ironbatch.simulation.prefix_groups import with_prefix_groups
from ironbatch.simulation.workload import Workload

from vllm_clock import run_vllm

CLOCK = load_step_model(
    "linear:intercept_s=0.006,per_prefill_token_s=2e-5,per_decode_token_s=1.5e-4,"
    "per_context_token_s=1e-7,per_attention_pair_s=1e-10,overhead_per_step_s=0.0015,"
    "overhead_per_request_s=1e-5"
)


def azure_shaped(tmp_path: Path) -> Workload:
    """The conversation trace's lengths at eleven times its rate, capped
    short so the test takes seconds, three in four opening with one of
    three shared system prompts."""
    path = tmp_path / "azure.csv"
    path.write_text(synthetic_trace_csv(160, seed=11, rate_per_s=60.0))
    w = load_workload(path)
    capped = w.select(np.flatnonzero(w.prompt_tokens < 1500))
    capped = _with_outputs(capped, np.minimum(capped.output_tokens, 40))
    return with_prefix_groups(capped, groups=3, tokens=300)


def _with_outputs(w: Workload, outputs: np.ndarray) -> Workload:
    from dataclasses import replace

    return replace(w, output_tokens=outputs.astype(np.int64))


def mooncake_shaped(tmp_path: Path) -> Workload:
    """Conversations whose turns resend their history: later turns list the
    earlier turns' hash_ids first, as Mooncake's traces do."""
    rng = random.Random(5)
    rows, next_id, t = [], 0, 0
    histories: list[list[int]] = [[] for _ in range(6)]
    for _ in range(90):
        conv = rng.randrange(6)
        grow = rng.randint(1, 2)
        histories[conv] += list(range(next_id, next_id + grow))
        next_id += grow
        ids = histories[conv][:4]  # a copy: the history grows on
        length = 512 * (len(ids) - 1) + rng.randint(1, 512)
        rows.append({"timestamp": t, "input_length": length,
                     "output_length": rng.randint(10, 120), "hash_ids": ids})  # fmt: skip
        t += rng.randint(0, 20)
    path = tmp_path / "mooncake.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return load_workload(path)


WORKLOADS = {"azure": azure_shaped, "mooncake": mooncake_shaped}


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("shape", sorted(WORKLOADS))
def test_the_simulator_decides_and_times_as_vllm(
    tmp_path: Path, shape: str, async_scheduling: bool
) -> None:
    w = WORKLOADS[shape](tmp_path)
    config = {
        "async_scheduling": async_scheduling,
        "enable_prefix_caching": True,
        "max_num_seqs": 32,
        "max_num_batched_tokens": 1024,
        "max_model_len": 4096,
        "num_blocks": 700 if shape == "azure" else 300,  # tight: some are preempted
    }
    sim = simulate(w, config=config, step_model=CLOCK, record_decisions=True)
    ref = run_vllm(w, sim.settings, CLOCK)
    d = sim.decisions
    offsets = d["offsets"].tolist()
    ours = [
        list(zip(d["request"][a:b].tolist(), d["num_tokens"][a:b].tolist(), strict=True))
        for a, b in zip(offsets, offsets[1:], strict=False)
    ]
    assert len(ours) == len(ref.decisions)
    for step, (a, b) in enumerate(zip(ours, ref.decisions, strict=True)):
        assert a == b, f"step {step}: the simulator {a[:6]}..., vLLM {b[:6]}..."
    assert sim.steps["start_s"].tolist() == ref.start_s
    r = sim.requests
    np.testing.assert_array_equal(r["first_scheduled_s"], ref.first_scheduled_s)
    np.testing.assert_array_equal(r["ttft_s"], ref.first_token_s - w.arrival_s)
    np.testing.assert_array_equal(r["e2e_s"], ref.finish_s - w.arrival_s)
    np.testing.assert_array_equal(r["output_tokens"], ref.output_tokens)
    # The workload exercised what the test is about.
    assert sim.summary["prefix_hit_rate"] > 0.1
    assert sim.summary["preemptions"] > 0
