"""What ``ironbatch simulate`` and ``ironbatch profile`` show: a summary
table whose columns stay apart at any size, ``--json``, a sweep table that
fits the terminal with infeasible points kept and goodput only with an SLO,
the shipped sample trace, progress on a terminal only, and a poor profile
fit refused."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest

import ironbatch
from ironbatch.cli import main
from ironbatch.simulation import SAMPLE_TRACE, progress, simulate, synthetic_workload
from ironbatch.simulation.batch_shape import batch_shape
from ironbatch.simulation.profile import Sample, fit_problems, fit_samples
from ironbatch.simulation.summary import format_summary
from ironbatch.simulation.sweep import run_sweep

CLOCK = "linear:intercept_s=0.005,per_prefill_token_s=3e-5,per_decode_token_s=3e-4"
SPEC = "synthetic:requests=60,rate=20,prompt_mean=200,output_mean=10"


def strict_json(text: str) -> object:
    def refuse(name: str) -> None:
        raise AssertionError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_the_summary_columns_stay_apart_past_a_million_ms() -> None:
    summary = copy.deepcopy(simulate(SPEC, step_model=CLOCK).summary)
    summary["latency_s"]["ttft"] = {"mean": 704.5859, "p50": 718.4555, "p90": 1265.3757,
                                    "p99": 1392.515}  # fmt: skip
    lines = format_summary(summary).splitlines()
    assert lines[1].split() == ["TTFT", "704,585.9", "718,455.5", "1,265,375.7", "1,392,515.0"]
    # Right-aligned under their headers.
    assert [len(line) for line in lines[:5]] == [len(lines[0])] * 5


def test_json_prints_the_summary_as_strict_json(capsys: pytest.CaptureFixture[str]) -> None:
    one_token = "synthetic:requests=30,output=fixed,output_mean=1"
    assert main(["simulate", one_token, "--step-model", CLOCK, "--json"]) == 0
    doc = strict_json(capsys.readouterr().out)
    assert isinstance(doc, dict) and doc["summary"]["requests"] == 30
    assert doc["summary"]["latency_s"]["tpot"]["p99"] is None


def sweep_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    model = () if "--step-model" in args else ("--step-model", CLOCK)
    code = main(["simulate", SPEC, *model, "--jobs", "1", *args])
    return code, capsys.readouterr().out


def test_the_sweep_table_fits_and_shows_goodput_only_with_an_slo(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    roofline = ("--step-model", "roofline:h100")
    axes = ("--sweep", "max_num_seqs=4,16", "--sweep", "kv_cache_gib=2.0,20")
    code, plain = sweep_cli(capsys, *axes, "--out", str(tmp_path / "a"), *roofline)
    assert code == 0
    assert max(len(line) for line in plain.splitlines()[1:]) <= 100, plain
    assert "good" not in plain.lower()
    csv = (tmp_path / "a" / "sweep.csv").read_text().splitlines()
    assert "goodput" not in csv[0]
    # The swept value one way everywhere: as --config takes it.
    assert [line.split(",")[1] for line in csv[1:]] == ["2", "20", "2", "20"]
    assert " 2.0" not in plain and "2.000" not in plain
    code, with_slo = sweep_cli(capsys, "--sweep", "max_num_seqs=4,16", "--sweep",
                               "kv_cache_gib=2,20", "--slo", "ttft=500ms", *roofline)  # fmt: skip
    assert code == 0 and "good %" in with_slo
    assert max(len(line) for line in with_slo.splitlines()[1:]) <= 100, with_slo


def test_an_infeasible_point_is_a_row_and_the_sweep_goes_on(
    capsys: pytest.CaptureFixture[str],
) -> None:
    w = synthetic_workload(SPEC)
    result = run_sweep(w, [("num_blocks", [10, 2000])], step_model=CLOCK, jobs=1)
    bad, good = result.rows
    assert "num_blocks=10 holds 144 tokens" in bad["infeasible"]
    assert "derived: the longest request" in bad["infeasible"]
    assert bad["ttft_p50_ms"] is None and good["ttft_p50_ms"] > 0 and good["infeasible"] == ""
    code, out = sweep_cli(capsys, "--sweep", "num_blocks=10,2000")
    assert code == 0 and "infeasible [1]" in out and "[1] the KV cache is too small" in out
    code, out = sweep_cli(capsys, "--sweep", "num_blocks=10,11")
    assert code == 1 and "infeasible [1]" in out and "infeasible [2]" in out


def test_the_sample_trace_ships_and_simulates(capsys: pytest.CaptureFixture[str]) -> None:
    assert SAMPLE_TRACE.is_file() and SAMPLE_TRACE.parent.name == "data"
    r = ironbatch.simulate("sample", step_model=CLOCK)
    assert r.summary["requests"] == 300 and r.summary["finished"] == 300
    again = simulate(SAMPLE_TRACE, step_model=CLOCK)
    np.testing.assert_array_equal(r.requests["e2e_s"], again.requests["e2e_s"])
    assert main(["simulate", "sample", "--step-model", CLOCK]) == 0
    assert "300 of 300 requests" in capsys.readouterr().out


def test_help_says_where_max_model_len_comes_from(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["simulate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "max_model_len defaults to the longest request" in text
    assert "--config async_scheduling=false" in text and "prefix_share" in text
    assert "``" not in text


def test_progress_shows_on_request_only(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(progress, "DELAY_S", 0.0)
    with progress.elapsed("simulating 5 requests", False):
        pass
    with progress.counting("sweeping", 2, False) as tick:
        tick()
    assert capsys.readouterr().err == ""
    with progress.counting("sweeping 2 configurations", 2, True) as tick:
        tick()
        tick()
    assert "sweeping 2 configurations" in capsys.readouterr().err
    # Piped (as here): the command line shows none.
    assert main(["simulate", SPEC, "--step-model", CLOCK]) == 0
    assert "simulating" not in capsys.readouterr().err


def noisy_samples(noise: float) -> list[Sample]:
    rng = np.random.default_rng(1)
    out = []
    for _ in range(80):
        rows = int(rng.integers(1, 32))
        shape = batch_shape([1] * rows, rng.integers(10, 900, rows).tolist(), [True] * rows)
        t = (0.004 + 1e-4 * rows) * float(rng.lognormal(0, noise))
        out.append(Sample(shape, t, t * 1.1, t, t * 1.1))
    return out


def test_a_poor_fit_is_named_and_not_written_without_force(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    good = fit_samples(noisy_samples(0.01), "quiet")
    poor = fit_samples(noisy_samples(0.8), "noisy")
    assert fit_problems(good.fit) == []
    problems = fit_problems(poor.fit)
    assert any("R^2 is" in p or "median error" in p for p in problems)
    assert problems[-1].startswith("likely cause:")
    import ironbatch.simulation.profile as profile_module

    monkeypatch.setattr(profile_module, "profile_engine", lambda *a, **k: poor)
    out = tmp_path / "m.json"
    assert main(["profile", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "warning: " in err and "not written (pass --force" in err and not out.exists()
    assert main(["profile", "--out", str(out), "--force"]) == 0
    assert out.exists()
