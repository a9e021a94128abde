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


def test_bench_prints_a_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--workloads", "decode-64", "--steps", "3"]) == 0
    out = capsys.readouterr().out
    assert "| decode-64 |" in out and "ironbatch-python / ironbatch-rust" in out


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


def test_replay_reports_traces_broken_part_way_and_goes_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A trace whose header reads but which breaks later is reported with its
    line, and the next trace replayed; exit status 1."""
    lines = TRACES[0].read_text().splitlines()
    whole = gzip.compress(TRACES[0].read_bytes())
    truncated = tmp_path / "truncated.jsonl.gz"
    truncated.write_bytes(whole[: len(whole) * 2 // 3])
    step = json.loads(lines[3])
    del step["sampled"]
    keyless = tmp_path / "keyless.jsonl"
    keyless.write_text("\n".join([*lines[:3], json.dumps(step), *lines[4:]]) + "\n")
    assert main(["replay", str(truncated), str(keyless), str(TRACES[1])]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"cannot replay {truncated}: after line ")
    assert "the gzip stream is truncated or corrupt" in out[0]
    assert out[1] == (
        f"cannot replay {keyless}: line 4: the step lacks 'sampled' (docs/trace-format.md)"
    )
    assert "identical" in out[2] and out[3] == "1 of 3 identical at blocks level (rust)"


def test_replay_checks_every_header_before_replaying(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A file that is not a trace, or whose config the scheduler refuses,
    stops the command before any trace is replayed: exit status 2, one line
    on stderr, nothing on stdout."""
    header = json.loads(TRACES[0].read_text().splitlines()[0])
    header["config"]["block_size"] = True
    mistyped = tmp_path / "mistyped.jsonl"
    mistyped.write_text(json.dumps(header) + "\n")
    assert main(["replay", str(TRACES[1]), str(mistyped)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(f"ironbatch replay: {mistyped}: line 1: the header's config")
    assert "block_size" in captured.err and len(captured.err.splitlines()) == 1


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


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    import ironbatch

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out == f"ironbatch {ironbatch.__version__}\n"


def test_every_option_has_a_help_line_without_markup(capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from ironbatch.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert set(sub.choices) >= {"demo", "generate", "replay", "bench", "simulate", "profile"}
    for name, command in [("", parser), *sub.choices.items()]:
        for action in command._actions:
            assert action.help, f"ironbatch {name} {action.option_strings or action.dest}"
        with pytest.raises(SystemExit):
            main([name, "--help"] if name else ["--help"])
        text = capsys.readouterr().out
        assert "``" not in text and ":func:" not in text, f"ironbatch {name} --help: {text}"


def test_bench_help_names_the_workloads_and_the_default(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from ironbatch.cli.bench import CORE_WORKLOADS

    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: all)" not in text
    assert "default: decode-64,decode-256,decode-1024,mixed" in text
    assert all(w in text for w in CORE_WORKLOADS) and "gpt-oss-256" in CORE_WORKLOADS


def test_bench_json_is_strict(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--workloads", "decode-64", "--steps", "3", "--json"]) == 0
    captured = capsys.readouterr()

    def refuse(name: str) -> None:
        raise AssertionError(f"{name} in --json")

    doc = json.loads(captured.out, parse_constant=refuse)
    assert (doc["steps"], doc["turn"]) == (3, 1)
    (row,) = doc["rows"]
    assert row["workload"] == "decode-64"
    assert set(row["median_step_s"]) == {"ironbatch-rust", "ironbatch-python"}
    assert all(0 < s < 1 for s in row["median_step_s"].values())
    assert captured.err.startswith("decode-64: ironbatch-rust ")  # the log line, on stderr


def test_bench_times_whole_turns(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["bench", "--workloads", "decode-64", "--backends", "rust", "--steps", "5"]
    assert main([*args, "--turn", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["steps"] == 6


def test_progress_bars_on_a_terminal_only(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("tqdm")
    bench = ["bench", "--workloads", "decode-64", "--backends", "rust", "--steps", "2"]
    for tty in (False, True):
        monkeypatch.setattr(sys.stderr, "isatty", lambda tty=tty: tty)
        assert main(["replay", str(TRACES[0])]) == 0
        err = capsys.readouterr().err
        steps = len(TRACES[0].read_text().splitlines()) - 1
        assert (f"{TRACES[0].name}: {steps}it" in err) == tty, err
        assert main(bench) == 0
        err = capsys.readouterr().err
        assert ("bench: 100%" in err) == tty, err
        assert "decode-64: ironbatch-rust" in err


def test_demo_says_what_it_runs(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    assert main(["demo", "--requests", "3", "--max-num-seqs", "2", "--num-blocks", "33"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(
        "model: a random-weight Llama: 4 layers, hidden size 128, 4 attention heads (2 KV), "
        "vocabulary 2,048; float32 on "
    )
    assert out[1] == (
        "settings: 3 requests (4 shared system prompts), max_num_seqs 2, num_blocks 33 of 16 "
        "tokens, max_model_len 512"
    )
    # What the line promises: --num-blocks max_num_seqs x 16 + 1, no preemption.
    assert out[2] == "The KV cache holds 2 requests at their longest: no preemptions."
    assert out[3] == "| metric | value |" and "| requests | 3 |" in out
    assert "| preemptions | 0 |" in out


def test_demo_explains_its_tight_cache() -> None:
    from types import SimpleNamespace

    from ironbatch.cli.demo import DEFAULT_NUM_BLOCKS, describe

    config = SimpleNamespace(
        num_layers=4, hidden_size=128, num_heads=4, num_kv_heads=2, vocab_size=2048
    )
    engine = SimpleNamespace(model_config=config, num_blocks=DEFAULT_NUM_BLOCKS, device="cpu")
    line = describe(engine, None, 300, 64).splitlines()[2]
    assert line == (
        "The KV cache is deliberately tight (199 usable blocks for up to 64 requests of up to "
        "16 blocks), so requests are preempted and recomputed; --num-blocks 1,025 holds them all."
    )


def test_generate_tries_the_random_model(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    argv = ["generate", "--model", "random", "--prompt", "ids:5,6,7", "--max-tokens", "3"]
    assert main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "--- 'ids:5,6,7'" and out[1].endswith("  [length]")
    assert len(json.loads(out[1].rpartition("  ")[0])) == 3  # three token ids
