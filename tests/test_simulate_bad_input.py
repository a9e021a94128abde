"""Hostile input to ``ironbatch simulate``, ``ironbatch profile`` and
``ironbatch.simulate``: each case is one of a class (a number out of range,
a file that is not what it claims, a setting the scheduler cannot take).
The rule: a clear error naming the option, field, file or line as the user
wrote them, before anything is printed or written: on the command line exit
status 2, ``ironbatch <command>: ...`` on stderr and no traceback; in Python
a ValueError or TypeError."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from ironbatch.cli import main
from ironbatch.simulation import StepModel, simulate, synthetic_workload
from ironbatch.simulation.workload import from_lengths

SPEC = "synthetic:requests=20,rate=5,prompt_mean=50,output_mean=5"
CLOCK = "linear:intercept_s=0.005,per_decode_token_s=1e-4"
AZURE = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def azure_rows(n: int) -> str:
    stamps = (f"2023-11-16 18:{i // 600:02d}:{i // 10 % 60:02d}.{i % 10}000000" for i in range(n))
    return AZURE + "".join(f"{t},{100 + i % 900},5\n" for i, t in enumerate(stamps))


def make_files(d: Path) -> dict[str, Path]:
    """One file per class of bad file."""
    files = {}
    files["gz_csv"] = d / "azure.csv"  # gzipped, whatever the name says: read
    files["gz_csv"].write_bytes(gzip.compress(azure_rows(50).encode()))
    whole = gzip.compress(azure_rows(3000).encode())
    files["truncated"] = d / "cut.csv.gz"
    files["truncated"].write_bytes(whole[: len(whole) // 2])
    files["binary"] = d / "binary.csv"
    files["binary"].write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)) * 4)
    files["latin1"] = d / "latin1.csv"
    files["latin1"].write_bytes(
        (azure_rows(3) + "2023-11-16 18:16:00.0,12\xe9,5\n").encode("latin-1")
    )
    files["huge_row"] = d / "huge.csv"
    files["huge_row"].write_text(azure_rows(3) + "2023-11-16 18:16:00.0,1000000000000,5\n")
    files["bad_jsonl"] = d / "m.jsonl"
    files["bad_jsonl"].write_text(
        '{"timestamp": 0, "input_length": 10, "output_length": 5}\n{"timestamp": 1, oops}\n'
    )
    files["mooncake_float"] = d / "f.jsonl"
    files["mooncake_float"].write_text(
        '{"timestamp": 0, "input_length": 10, "output_length": 5}\n'
        '{"timestamp": 1, "input_length": 1e30, "output_length": 5}\n'
    )
    header = {"format": "ironbatch-trace/1", "config": {}}
    step = {"add": [{"request_id": "r0", "prompt_token_ids": [5, 6]}], "outputs": []}
    files["trace_missing_key"] = d / "t.jsonl"
    files["trace_missing_key"].write_text(json.dumps(header) + "\n" + json.dumps(step) + "\n")
    files["step_model_shape"] = d / "sm.json"
    files["step_model_shape"].write_text(
        json.dumps({"format": "ironbatch-step-model/1", "kind": "linear", "coefficients": [1]})
    )
    files["step_model_nan"] = d / "nan.json"
    files["step_model_nan"].write_text(
        '{"format": "ironbatch-step-model/1", "kind": "linear", "coefficients": '
        '{"intercept_s": NaN}}'
    )
    files["a_file"] = d / "exists.txt"
    files["a_file"].write_text("not a folder\n")
    return files


# (arguments after "simulate", what the message must say). {name} is a file
# from make_files; {out} a fresh folder the run must not create.
CLI_CASES = [
    # Numbers out of range, infinite or NaN, wherever they are written.
    ([SPEC, "--step-model", "linear:"], "every coefficient is 0"),
    (
        [SPEC, "--step-model", "linear:intercept_s=1e308"],
        "intercept_s must be a number of seconds in [0, 3600]",
    ),
    ([SPEC, "--step-model", "linear:intercept_s=inf"], "intercept_s must be a finite number"),
    (
        [SPEC, "--step-model", "linear:per_decode_token_s=nan"],
        "per_decode_token_s must be a finite",
    ),
    (
        [SPEC, "--step-model", "roofline:h100,bandwidth_efficiency=0"],
        "bandwidth_efficiency must be in (0, 1]",
    ),
    (
        [SPEC, "--step-model", "roofline:h100,flops_efficiency=1.5"],
        "flops_efficiency must be in (0, 1]",
    ),
    (
        [SPEC, "--step-model", "roofline:h100,overhead_ms=inf"],
        "overhead_ms must be a finite number",
    ),
    ([SPEC, "--step-model", "roofline:h100,tp=0"], "tp must be an integer in [1, 4096]"),
    ([SPEC, "--config", "block_size=0"], "block_size must be an integer in [1, 1,048,576], got 0"),
    ([SPEC, "--config", "kv_cache_gib=inf"], "kv_cache_gib must be a finite number in (0, "),
    ([SPEC, "--config", "kv_cache_gib=nan"], "kv_cache_gib must be a finite number in (0, "),
    ([SPEC, "--config", "kv_cache_gib=-1"], "kv_cache_gib must be a finite number in (0, "),
    ([SPEC, "--config", "watermark=1"], "watermark must be a finite number in [0, 1)"),
    (
        [SPEC, "--config", "max_num_seqs=99999999999999999999"],
        "max_num_seqs must be an integer in [1, ",
    ),
    ([SPEC, "--config", "num_blocks=1"], "num_blocks must be an integer in [2, "),
    ([SPEC, "--config", "policy=lifo"], "policy must be one of"),
    (["synthetic:prompt_mean=1e30"], "prompt_mean must be a finite number in (0, "),
    (
        ["synthetic:burstiness=1e300,arrivals=bursty"],
        "burstiness must be a finite number in [0.01, 100]",
    ),
    (["synthetic:rate=nan"], "rate must be a finite number in [1e-06, "),
    (["synthetic:requests=1e3"], "requests must be an int, got '1e3'"),
    (["synthetic:prefix_share=2"], "prefix_share must be a finite number in [0, 1]"),
    ([SPEC, "--speed", "inf"], "--speed must be a number in (0, "),
    ([SPEC, "--speed", "0"], "--speed must be a number in (0, "),
    ([SPEC, "--max-requests", "-1"], "--max-requests must be an integer >= 1"),
    ([SPEC, "--slice", "nan:"], "--slice: START and END must be finite seconds"),
    ([SPEC, "--slo", "ttft=inf"], "slo: ttft must be a finite time > 0"),
    ([SPEC, "--sweep", "max_num_seqs=,,"], "--sweep max_num_seqs=,,: expected KEY=V1,V2,"),
    ([SPEC, "--sweep", "max_num_seqs=1,2", "--jobs", "0"], "--jobs must be an integer >= 1"),
    # Settings the scheduler cannot take, said in the user's terms.
    ([SPEC, "--config", "kv_cache_gib=0.00001"], "kv_cache_gib=1e-05"),
    ([SPEC, "--config", "kv_cache_gib=0.00001"], "give kv_cache_gib >= "),
    ([SPEC, "--config", "num_blocks=3"], "derived: the longest request"),
    ([SPEC, "--trace", "{tmp}/t.jsonl"], "add --config async_scheduling=false"),
    # Files that are not what they claim, named with the line.
    (["{truncated}"], "cut.csv.gz: after line "),
    (["{truncated}"], "gzip stream is truncated"),
    (["{binary}"], "binary.csv: line 1: a NUL byte"),
    (["{latin1}"], "latin1.csv: line 5: byte 0xe9 at column"),
    (["{huge_row}"], "huge.csv: line 5, column ContextTokens: 1,000,000,000,000 tokens"),
    (["{bad_jsonl}"], "m.jsonl: line 2, column 18: not JSON"),
    (["{mooncake_float}"], "f.jsonl: line 2: input_length must be an integer in [0, "),
    (["{trace_missing_key}"], "t.jsonl: line 2: the step lacks 'abort'"),
    ([SPEC, "--step-model", "{step_model_shape}"], "sm.json: coefficients must be an object"),
    ([SPEC, "--step-model", "{step_model_nan}"], "nan.json: linear step model: intercept_s"),
    # Where the outputs go, checked before the run.
    ([SPEC, "--out", "{a_file}"], "--out '"),
    ([SPEC, "--out", "{a_file}/sub"], "is a file, not a folder"),
    ([SPEC, "--out", "/proc/ironbatch-cannot-write"], "cannot be written"),
    (
        [SPEC, "--trace", "{out}/missing/t.jsonl", "--config", "async_scheduling=false"],
        "does not exist",
    ),
    ([SPEC, "--report"], "--report needs --out"),
]


@pytest.mark.parametrize(("args", "says"), CLI_CASES)
def test_the_command_line_names_bad_input(
    args: list[str], says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    names = {k: str(v) for k, v in make_files(tmp_path).items()}
    out = tmp_path / "out"
    argv = [a.format(out=out, tmp=tmp_path, **names) for a in args]
    if "--out" not in argv and "--report" not in argv:
        argv += ["--out", str(out)]
    code = main(["simulate", *argv])
    captured = capsys.readouterr()
    assert code == 2, captured
    assert captured.err.startswith("ironbatch simulate: "), captured.err
    assert says in captured.err, captured.err
    assert "Traceback" not in captured.err and len(captured.err.splitlines()) == 1
    assert captured.out == ""  # no summary before the error
    assert not out.exists()  # nothing written


def test_a_gzipped_csv_reads_whatever_its_name(tmp_path: Path) -> None:
    path = make_files(tmp_path)["gz_csv"]
    r = simulate(path, step_model=CLOCK)
    assert r.summary["requests"] == 50


def test_one_token_outputs_write_strict_json(tmp_path: Path) -> None:
    code = main(["simulate", "synthetic:requests=10,output=fixed,output_mean=1",
                 "--step-model", CLOCK, "--out", str(tmp_path / "o")])  # fmt: skip
    assert code == 0
    text = (tmp_path / "o" / "summary.json").read_text()

    def refuse(name: str) -> None:
        raise AssertionError(f"{name} in summary.json")

    summary = json.loads(text, parse_constant=refuse)["summary"]
    assert summary["latency_s"]["tpot"]["p50"] is None


W = synthetic_workload("synthetic:requests=5,rate=1,prompt_mean=40,output_mean=4")


def good_model() -> dict[str, float]:
    return {"intercept_s": 0.01}


API_CASES: list[tuple[Callable[[], object], type[Exception], str]] = [
    (lambda: simulate(W, slo=5), TypeError, "slo must be a string"),
    (lambda: simulate(W, slo={"ttft": "soon"}), ValueError, "ttft must be a time"),
    (lambda: simulate(W, slo={"ttft": float("nan")}), ValueError, "ttft must be a finite time"),
    (lambda: simulate(W, config=5), TypeError, "config must be a mapping"),  # type: ignore[arg-type]
    (lambda: simulate(W, config="max_num_seqs=4"), TypeError, "config must be a mapping"),
    (
        lambda: simulate(W, config={"kv_cache_gib": float("inf")}),
        ValueError,
        "kv_cache_gib must be",
    ),
    (lambda: simulate(W, config={"block_size": 0}), ValueError, "block_size must be an integer"),
    (lambda: simulate(W, config={"max_num_seqs": 2.5}), TypeError, "max_num_seqs must be a int"),
    (lambda: simulate(W, config={"async_scheduling": 1}), TypeError, "async_scheduling must be"),
    (lambda: simulate(W, step_model=5), TypeError, "step_model must be"),  # type: ignore[arg-type]
    (lambda: simulate(W, speed=float("inf")), ValueError, "speed must be a finite number"),
    (lambda: simulate(W, max_requests=2.0), TypeError, "max_requests must be an int"),  # type: ignore[arg-type]
    (lambda: simulate(W, start_s=float("nan")), ValueError, "start_s must be a finite number"),
    (lambda: simulate(W, record_steps="yes"), TypeError, "record_steps must be True or False"),  # type: ignore[arg-type]
    (lambda: simulate(W, trace="/tmp/x.jsonl"), ValueError, "async_scheduling"),
    (
        lambda: simulate(W, config={"async_scheduling": False}, trace="/no/such/dir/t.jsonl"),
        ValueError,
        "does not exist",
    ),
    (lambda: simulate(42), TypeError, "workload must be"),  # type: ignore[arg-type]
    (lambda: simulate("no-such-file.csv"), ValueError, "no such file"),
    (
        lambda: simulate(
            from_lengths("w", arrival_s=[0.0], prompt_tokens=[10], output_tokens=[2.5])
        ),
        ValueError,
        "output_tokens[0] = 2.5 is not a whole number",
    ),
    (
        lambda: simulate(
            from_lengths("w", arrival_s=[0.0], prompt_tokens=[10.5], output_tokens=[2])
        ),
        ValueError,
        "prompt_tokens[0] = 10.5 is not a whole number",
    ),
    (
        lambda: simulate(
            from_lengths("w", arrival_s=[0.0], prompt_tokens=[10], output_tokens=[True])
        ),
        TypeError,
        "output_tokens must hold numbers",
    ),
    (
        lambda: simulate(
            from_lengths("w", arrival_s=[0.0], prompt_tokens=[10**12], output_tokens=[2])
        ),
        ValueError,
        "prompt_tokens[0] = 1000000000000 is more than a request holds",
    ),
    (
        lambda: simulate(
            from_lengths("w", arrival_s=[float("nan")], prompt_tokens=[5], output_tokens=[2])
        ),
        ValueError,
        "arrival_s[0] = NaN",
    ),
    (lambda: StepModel("linear", {"intercept_s": float("inf")}), ValueError, "intercept_s must be"),
    (lambda: StepModel("linear", {}), ValueError, "every coefficient is 0"),
    (
        lambda: StepModel("linear", good_model(), overhead_per_step_s=-1),
        ValueError,
        "overhead_per_step_s must be a number of seconds",
    ),
    (
        lambda: StepModel("linear", good_model(), kv_bytes_per_token=float("nan")),
        ValueError,
        "kv_bytes_per_token must be a finite number > 0",
    ),
    (
        lambda: synthetic_workload("synthetic:prompt_mean=1000000000,prompt_sigma=5"),
        ValueError,
        "drew a prompt of",
    ),
]


@pytest.mark.parametrize(("call", "kind", "says"), API_CASES)
def test_the_python_api_names_bad_input(
    call: Callable[[], object], kind: type[Exception], says: str
) -> None:
    with pytest.raises(kind) as e:
        call()
    assert says in str(e.value)


def test_writing_into_a_file_is_named(tmp_path: Path) -> None:
    r = simulate(W, step_model=CLOCK)
    (tmp_path / "f").write_text("")
    with pytest.raises(ValueError, match="is a file; it must be a folder"):
        r.write(tmp_path / "f")


PROFILE_CASES = [
    (["--device", "tpu"], "--device must be cpu, cuda or cuda:N, got 'tpu'"),
    (["--device", "cuda:999"], "--device cuda:999: this machine has"),
    (["--threads=-1"], "--threads must be an integer in [1, "),
    (["--threads", "lots"], "--threads must be an integer in [1, "),
    (["--repeats", "0"], "--repeats must be an integer in [1, 1,000]"),
    (["--seed", "-1"], "--seed must be an integer in [0, "),
    (["--model", "{missing}"], "is not a model directory"),
    (["--out", "{folder}"], "--out '"),
]


@pytest.mark.parametrize(("args", "says"), PROFILE_CASES)
def test_profile_names_bad_options_before_it_runs(
    args: list[str], says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [a.format(missing=tmp_path / "none", folder=tmp_path) for a in args]
    code = main(["profile", "--quick", *argv, *([] if "--out" in argv else
                 ["--out", str(tmp_path / "m.json")])])  # fmt: skip
    captured = capsys.readouterr()
    assert code == 2, captured
    assert captured.err.startswith("ironbatch profile: ") and says in captured.err, captured.err
    assert "Traceback" not in captured.err
    assert not (tmp_path / "m.json").exists()
