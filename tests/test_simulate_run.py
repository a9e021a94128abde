"""``ironbatch.simulate`` and ``ironbatch simulate``: the clock charges what
the step model says, the decisions are the scheduler's own (a run's trace
replays identical on the plain-Python twin), the outputs and the summary,
the step models, and bad input named."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import ironbatch
from ironbatch.cli import main
from ironbatch.simulation import StepModel, load_step_model, simulate, synthetic_workload
from ironbatch.simulation.workload import from_lengths
from ironbatch.trace import replay

# 10 ms a step, 0.1 ms per prefill token, 1 ms per decode token, 2 ms of CPU.
CLOCK = (
    "linear:intercept_s=0.01,per_prefill_token_s=1e-4,per_decode_token_s=1e-3,"
    "overhead_per_step_s=0.002"
)
SYNC = {"async_scheduling": False}


def test_the_clock_charges_the_step_model() -> None:
    w = from_lengths("one", arrival_s=[0.5], prompt_tokens=[100], output_tokens=[4])
    r = simulate(w, step_model=CLOCK, config=SYNC).requests
    prefill = 0.002 + 0.010 + 100 * 1e-4
    decode = 0.002 + 0.010 + 1e-3
    assert r["first_scheduled_s"][0] == pytest.approx(0.502)
    assert r["ttft_s"][0] == pytest.approx(prefill)
    assert r["e2e_s"][0] == pytest.approx(prefill + 3 * decode)
    assert r["tpot_s"][0] == pytest.approx(decode)
    assert r["output_tokens"][0] == 4


def test_async_scheduling_overlaps_the_cpu_with_the_device() -> None:
    w = from_lengths("one", arrival_s=[0.0], prompt_tokens=[100], output_tokens=[4])
    r = simulate(w, step_model=CLOCK).requests  # async: vLLM's default
    assert r["e2e_s"][0] == pytest.approx(0.002 + 0.020 + 3 * 0.011)


def test_a_runs_trace_replays_identical_on_the_python_twin(tmp_path: Path) -> None:
    w = synthetic_workload(
        "synthetic:requests=120,rate=40,prompt_mean=300,output_mean=30,prefix_groups=3,"
        "prefix_tokens=96,seed=4"
    )
    trace = tmp_path / "run.jsonl"
    settings = {**SYNC, "num_blocks": 120, "max_num_batched_tokens": 256, "max_num_seqs": 16,
                "max_model_len": 1536}  # fmt: skip
    r = simulate(w, step_model=CLOCK, config=settings, trace=trace)
    assert r.summary["preemptions"] > 0 and r.summary["prefix_hit_rate"] > 0
    result = replay(trace, backend="python", level="blocks")
    assert result.identical, str(result)
    assert result.steps == r.summary["steps"]


def test_the_tables_line_up(tmp_path: Path) -> None:
    w = synthetic_workload("synthetic:requests=50,rate=20,prompt_mean=80,output_mean=10")
    r = ironbatch.simulate(w, step_model=CLOCK, record_decisions=True, slo="ttft=40ms")
    n, steps = len(w), r.summary["steps"]
    assert all(len(v) == n for v in r.requests.values())
    assert all(len(v) == steps for v in r.steps.values())
    d = r.decisions
    assert len(d["offsets"]) == steps + 1 and d["num_tokens"].sum() == (
        r.steps["num_prefill_tokens"].sum() + r.steps["num_decode_tokens"].sum()
    )
    assert (r.requests["output_tokens"] == w.output_tokens).all()
    ok = r.requests["ttft_s"] <= 0.040
    assert r.summary["goodput"]["fraction"] == pytest.approx(ok.mean())
    paths = r.write(tmp_path)
    lines = (tmp_path / "requests.csv").read_text().splitlines()
    assert lines[0].startswith("id,arrival_s,") and len(lines) == n + 1
    assert json.loads((tmp_path / "summary.json").read_text())["summary"]["requests"] == n
    assert len(paths) == 3


def test_a_tight_cache_preempts_and_more_blocks_do_not() -> None:
    w = synthetic_workload("synthetic:requests=200,rate=50,prompt_mean=400,output_mean=100")
    tight = simulate(w, step_model=CLOCK, config={"num_blocks": 400, "max_model_len": 4096})
    ample = simulate(w, step_model=CLOCK, config={"max_model_len": 4096})
    assert tight.summary["preemptions"] > 0 and ample.summary["preemptions"] == 0
    assert tight.summary["latency_s"]["e2e"]["p90"] > ample.summary["latency_s"]["e2e"]["p90"]


def test_prompts_of_max_model_len_are_left_out_as_vllm_refuses_them() -> None:
    w = from_lengths("w", arrival_s=[0, 1, 2], prompt_tokens=[10, 600, 20], output_tokens=[5] * 3)
    r = simulate(w, step_model=CLOCK, config={"max_model_len": 512})
    assert r.rejected == {"prompt of max_model_len tokens or more": 1}
    assert r.requests["id"].tolist() == ["0", "2"]


def test_roofline_presets_rank_devices_and_models() -> None:
    w = synthetic_workload("synthetic:requests=300,rate=4,seed=3")

    def p50_tpot(spec: str) -> float:
        return simulate(w, step_model=spec).summary["latency_s"]["tpot"]["p50"]

    h200, h100, l4 = (p50_tpot(f"roofline:{d}") for d in ("h200", "h100", "l4"))
    assert h200 < h100 < l4
    assert p50_tpot("roofline:h100,model=llama-3.1-70b,tp=4") > h100
    m = load_step_model("roofline:h100,model=llama-3.1-8b")
    assert m.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2  # K and V, bf16
    # kv_cache_gib sizes the cache from the model's KV bytes per token.
    r = simulate(w, step_model=m, config={"kv_cache_gib": 1.0, "max_model_len": 4096})
    assert r.settings["num_blocks"] == 2**30 // (16 * 131072) + 1


def test_a_fitted_model_round_trips_through_json(tmp_path: Path) -> None:
    m = load_step_model(CLOCK)
    fitted = StepModel(
        kind="linear", coefficients=m.coefficients, overhead_per_step_s=0.002,
        description="fitted by hand", fit={"samples": 3},
    )  # fmt: skip
    fitted.save(tmp_path / "m.json")
    again = load_step_model(tmp_path / "m.json")
    assert again == fitted
    w = synthetic_workload("synthetic:requests=40,rate=10")
    a, b = simulate(w, step_model=again), simulate(w, step_model=CLOCK)
    np.testing.assert_array_equal(a.requests["e2e_s"], b.requests["e2e_s"])


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda w: simulate(w, config=["foo=1"]), "unknown key 'foo'"),
        (lambda w: simulate(w, config=["max_num_seqs=many"]), "max_num_seqs must be an int"),
        (
            lambda w: simulate(w, config={"num_blocks": 3, "max_model_len": 512}),
            "num_blocks=3 holds 32 tokens",
        ),
        (lambda w: simulate(w, speed=-2), "speed must be a finite number > 0, got -2"),
        (lambda w: simulate(w, slo="ttft=fast"), "ttft must be a time"),
        (lambda w: simulate(w, slo="latency=1"), "unknown metric 'latency'"),
        (lambda w: simulate(w, step_model="linear:per_token_s=1"), "unknown keys"),
        (lambda w: simulate(w, step_model="linear:intercept_s=-1"), "intercept_s must be"),
        (lambda w: simulate(w, step_model="roofline:tpu"), "unknown device 'tpu'"),
        (lambda w: simulate(w, trace="/tmp/x.jsonl"), "async_scheduling"),
        (lambda w: simulate(w, start_s=5, end_s=1), "must be after its start"),
        (lambda w: simulate("synthetic:rate=-1"), r"rate must be a finite number in \[1e-06, "),
        (lambda w: simulate("synthetic:requests=5,colour=red"), "unknown key 'colour'"),
    ],
)
def test_bad_input_is_named(call, match: str) -> None:  # type: ignore[no-untyped-def]
    w = synthetic_workload("synthetic:requests=5,rate=1")
    with pytest.raises((ValueError, TypeError), match=match):
        call(w)


def test_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    spec = "synthetic:requests=60,rate=20,prompt_mean=100,output_mean=12"
    code = main(["simulate", spec, "--step-model", CLOCK, "--config", "max_num_seqs=8",
                 "--slo", "ttft=100ms,tpot=20ms", "--out", str(out), "--slice", "0.5:",
                 "--speed", "2"])  # fmt: skip
    assert code == 0
    text = capsys.readouterr().out
    assert "TTFT" in text and "goodput (ttft <= 100 ms, tpot <= 20 ms)" in text
    summary = json.loads((out / "summary.json").read_text())
    assert summary["settings"]["max_num_seqs"] == 8
    assert summary["summary"]["requests"] < 60
    assert main(["simulate", spec, "--config", "nope=1"]) == 2
    assert "unknown key 'nope'" in capsys.readouterr().err
    assert main(["simulate", "synthetic:rate=-3"]) == 2
    assert (
        "rate must be a finite number in [1e-06, 1,000,000,000], got -3.0"
        in capsys.readouterr().err
    )
