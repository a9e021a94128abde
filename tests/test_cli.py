"""The ``ironbatch`` command: replay's report and exit status, bench's table."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ironbatch.cli import main

TRACES = sorted((Path(__file__).parent / "data" / "traces").glob("*.jsonl"))


def test_replay_identical_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", str(TRACES[0]), str(TRACES[1])]) == 0
    out = capsys.readouterr().out
    assert out.count("identical (") == 2 and "2 of 2 identical at blocks level (rust)" in out


def test_replay_difference_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = TRACES[0].read_text().splitlines()
    step = json.loads(lines[4])
    step["num_free_blocks"] += 1
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(lines[:4] + [json.dumps(step)] + lines[5:]) + "\n")
    assert main(["replay", "--backend", "python", str(bad)]) == 1
    out = capsys.readouterr().out
    assert "num_free_blocks differs" in out and "0 of 1 identical" in out
    assert main(["replay", "--level", "decisions", str(bad)]) == 0
    assert main(["replay", str(tmp_path / "missing.jsonl")]) == 1


def test_bench_prints_a_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--workloads", "decode-64", "--steps", "3"]) == 0
    out = capsys.readouterr().out
    assert "| decode-64 |" in out and "ironbatch-python / ironbatch-rust" in out
    assert main(["bench", "--workloads", "nope"]) == 2


def console_script() -> str:
    """The ``ironbatch`` entry point pip installed beside this interpreter."""
    script = Path(sys.executable).parent / "ironbatch"
    found = str(script) if script.is_file() else shutil.which("ironbatch")
    assert found, "the ironbatch console script is not installed"
    return found


def test_console_script_is_installed(tmp_path: Path) -> None:
    script = console_script()
    done = subprocess.run([script, "replay", str(TRACES[2])], capture_output=True, text=True)
    assert done.returncode == 0 and "identical" in done.stdout, done.stderr
    # The same trace gzipped, and from standard input.
    gz = tmp_path / "trace.jsonl.gz"
    gz.write_bytes(gzip.compress(TRACES[2].read_bytes()))
    for stdin_bytes, arg in (
        (None, str(gz)),
        (TRACES[2].read_bytes(), "-"),
        (gz.read_bytes(), "-"),
    ):
        raw = subprocess.run([script, "replay", arg], input=stdin_bytes, capture_output=True)
        assert raw.returncode == 0 and b"1 of 1 identical" in raw.stdout, raw.stderr
    done = subprocess.run([script, "nonsense"], capture_output=True, text=True)
    assert done.returncode == 2 and "invalid choice" in done.stderr


def test_replay_reports_broken_traces_and_goes_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    truncated = tmp_path / "truncated.jsonl.gz"
    truncated.write_bytes(gzip.compress(TRACES[0].read_bytes())[:200])
    header = json.loads(TRACES[0].read_text().splitlines()[0])
    header["config"]["block_size"] = True
    mistyped = tmp_path / "mistyped.jsonl"
    mistyped.write_text(json.dumps(header) + "\n")
    assert main(["replay", str(truncated), str(mistyped), str(TRACES[1])]) == 1
    out = capsys.readouterr().out
    assert out.count("cannot replay") == 2 and "1 of 3 identical" in out


def test_replay_json_is_strict_and_names_the_difference(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = TRACES[0].read_text().splitlines()
    step = json.loads(lines[4])
    step["num_free_blocks"] += 1
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(lines[:4] + [json.dumps(step)] + lines[5:]) + "\n")
    assert main(["replay", "--json", str(TRACES[1]), str(bad)]) == 1

    def refuse(name: str) -> None:
        raise AssertionError(f"{name} in --json")

    doc = json.loads(capsys.readouterr().out, parse_constant=refuse)
    assert (doc["traces"], doc["identical"], doc["level"]) == (2, 1, "blocks")
    same, differs = doc["results"]
    assert same == {"path": str(TRACES[1]), "identical": True, "steps": same["steps"]}
    assert (differs["identical"], differs["step"], differs["field"]) == (
        False,
        3,
        "num_free_blocks",
    )
    assert differs["recorded"] == differs["replayed"] + 1
