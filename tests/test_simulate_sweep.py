"""``--sweep``: a 3×3 grid gives the same rows run serially, in processes,
and as tasks on a local Ray instance (Ray is the optional extra ``ray``,
in the test extra); the grid, its table, and bad sweeps named."""

from __future__ import annotations

from pathlib import Path

import pytest

from ironbatch.cli import main
from ironbatch.simulation import synthetic_workload
from ironbatch.simulation.sweep import grid, parse_sweep, run_sweep

CLOCK = "linear:intercept_s=0.005,per_prefill_token_s=3e-5,per_decode_token_s=3e-4"
AXES = [("max_num_batched_tokens", [256, 512, 2048]), ("num_blocks", [160, 300, 2000])]


def workload():  # type: ignore[no-untyped-def]
    return synthetic_workload(
        "synthetic:requests=150,rate=40,prompt_mean=200,output_mean=40,prefix_groups=2,seed=9"
    )


@pytest.fixture(scope="module")
def serial() -> list[dict]:
    result = run_sweep(workload(), AXES, config={"max_model_len": 2048}, step_model=CLOCK, jobs=1)
    return result.rows


def test_the_grid_covers_every_combination(serial: list[dict]) -> None:
    assert len(serial) == 9
    assert [(r["max_num_batched_tokens"], r["num_blocks"]) for r in serial] == [
        (a, b) for a in (256, 512, 2048) for b in (160, 300, 2000)
    ]
    # The settings matter: a tight cache preempts, an ample one does not.
    by = {(r["max_num_batched_tokens"], r["num_blocks"]): r for r in serial}
    assert by[(2048, 160)]["preemptions"] > 0 and by[(2048, 2000)]["preemptions"] == 0
    assert len({r["e2e_p99_ms"] for r in serial}) > 3


def test_processes_give_the_same_rows(serial: list[dict]) -> None:
    result = run_sweep(workload(), AXES, config={"max_model_len": 2048}, step_model=CLOCK, jobs=2)
    assert result.rows == serial


def test_a_local_ray_instance_gives_the_same_rows(serial: list[dict]) -> None:
    ray = pytest.importorskip("ray")
    try:
        result = run_sweep(workload(), AXES, config={"max_model_len": 2048}, step_model=CLOCK,
                           ray_address="local")  # fmt: skip
    finally:
        ray.shutdown()
    assert result.rows == serial


def test_bad_sweeps_are_named() -> None:
    with pytest.raises(ValueError, match="unknown key 'colour'"):
        parse_sweep(["colour=red,blue"])
    with pytest.raises(ValueError, match="max_num_seqs is swept twice"):
        parse_sweep(["max_num_seqs=1,2", "max_num_seqs=3"])
    with pytest.raises(ValueError, match="max_num_seqs must be an int"):
        parse_sweep(["max_num_seqs=4,lots"])
    with pytest.raises(ValueError, match="both set with --config and swept"):
        run_sweep(workload(), [("max_num_seqs", [4])], config={"max_num_seqs": 8}, jobs=1)
    assert grid([("a", [1, 2]), ("b", [3])]) == [{"a": 1, "b": 3}, {"a": 2, "b": 3}]


def test_the_command_line_writes_the_table(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    spec = "synthetic:requests=40,rate=20,prompt_mean=100,output_mean=10"
    code = main(["simulate", spec, "--step-model", CLOCK, "--sweep", "max_num_seqs=2,8",
                 "--jobs", "1", "--out", str(tmp_path), "--report"])  # fmt: skip
    assert code == 0
    assert "2 configurations" in capsys.readouterr().out
    lines = (tmp_path / "sweep.csv").read_text().splitlines()
    assert lines[0].startswith("max_num_seqs,ttft_p50_ms") and len(lines) == 3
    assert (tmp_path / "report.html").exists()
