"""Hostile input to ``ironbatch demo``, ``generate``, ``bench`` and ``replay``:
each case is one of a class (a number out of range or not finite, a name
that is not a choice, a file that is not what the option wants). The rule:
exit status 2, one line on stderr, ``ironbatch <command>: ...``, naming the
option or file as the user wrote it and what it accepts, and nothing on
stdout before it (no run started)."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_cli import TRACES, console_script

from ironbatch.cli import main

GEN = ["generate", "--model", "random", "--prompt", "ids:1,2"]


def make_files(d: Path) -> dict[str, Path]:
    files = {"file": d / "notes.txt", "missing": d / "missing", "folder": d / "folder"}
    files["file"].write_text("not a model\n")
    files["folder"].mkdir()
    files["readme"] = d / "README.md"
    files["readme"].write_text("# ironbatch\n\nA scheduler.\n")
    files["binary"] = d / "a.out"
    files["binary"].write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)))
    files["gz_text"] = d / "notes.jsonl.gz"
    files["gz_text"].write_bytes(gzip.compress(b"hello\n"))
    files["empty"] = d / "empty.jsonl"
    files["empty"].write_text("\n\n")
    files["other"] = d / "other.jsonl"
    files["other"].write_text(json.dumps({"format": "vllm-trace/9", "config": {}}) + "\n")
    files["no_config"] = d / "noconfig.jsonl"
    files["no_config"].write_text(json.dumps({"format": "ironbatch-trace/1"}) + "\n")
    header = json.loads(TRACES[0].read_text().splitlines()[0])
    del header["config"]["max_num_seqs"]
    files["config_key"] = d / "config.jsonl"
    files["config_key"].write_text(json.dumps(header) + "\n")
    return files


# (arguments, what the one line on stderr must say). {name} is a file from
# make_files.
CASES = [
    (["nonsense"], "ironbatch: argument COMMAND: invalid choice: 'nonsense'"),
    # demo: counts out of range, NaN, a fraction; a model that is not a folder.
    (["demo", "--num-blocks", "0"], "argument --num-blocks: must be an integer in [33, 16385]"),
    (["demo", "--num-blocks", "32"], "argument --num-blocks: must be an integer in [33, "),
    (["demo", "--requests=-1"], "argument --requests: must be an integer in [1, 1000000]"),
    (["demo", "--requests", "nan"], "argument --requests: must be an integer in [1, "),
    (["demo", "--requests", "2.5"], "argument --requests: must be an integer in [1, "),
    (["demo", "--max-num-seqs", "0"], "argument --max-num-seqs: must be an integer in [1, 1024]"),
    (["demo", "--seed", "-1"], "argument --seed: must be an integer in [0, 9223372036854775807]"),
    (["demo", "--model", "{file}"], "--model '{file}' is a file, not a model directory"),
    (["demo", "--model", "{missing}"], "--model '{missing}' does not exist"),
    # generate: sampling numbers, JSON that is not a speculative config,
    # prompts the model cannot take.
    ([*GEN, "--max-tokens", "0"], "argument --max-tokens: must be an integer in [1, 2147483647]"),
    ([*GEN, "--max-tokens=-1"], "argument --max-tokens: must be an integer in [1, "),
    ([*GEN, "--temperature", "nan"], "argument --temperature: must be a number in [0, 2]"),
    ([*GEN, "--temperature", "inf"], "argument --temperature: must be a number in [0, 2]"),
    ([*GEN, "--temperature=-1"], "argument --temperature: must be a number in [0, 2]"),
    ([*GEN, "--temperature", "1e999"], "argument --temperature: must be a number in [0, 2]"),
    ([*GEN, "--seed=-1"], "argument --seed: must be an integer in [0, "),
    ([*GEN, "--attention-backend", "flash"], "argument --attention-backend: invalid choice"),
    ([*GEN, "--speculative-config", "{bad"], "--speculative-config '{bad': not valid JSON"),
    ([*GEN, "--speculative-config", "[3]"], "must be a JSON object, got list"),
    (
        [*GEN, "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 2, "k": 1}'],
        "has unsupported keys ['k']; the engine takes ['method',",
    ),
    (
        [*GEN, "--speculative-config", '{"method": "eagle", "num_speculative_tokens": 2}'],
        "method must be 'ngram'",
    ),
    (
        [*GEN, "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 0}'],
        "num_speculative_tokens must be >= 1, got 0",
    ),
    (
        [*GEN, "--speculative-config", '{"method": "ngram", "num_speculative_tokens": NaN}'],
        "NaN is not a JSON number",
    ),
    (
        ["generate", "--model", "random", "--prompt", "Hello"],
        "--prompt 'Hello': --model random has no tokenizer.json, so give token ids instead, "
        "e.g. --prompt ids:1,2,3",
    ),
    (["generate", "--model", "random", "--prompt", "ids:1,x"], "--prompt 'ids:1,x': ids: takes"),
    (["generate", "--model", "random", "--prompt", "ids:-5"], "integers >= 0"),
    (
        ["generate", "--model", "random", "--prompt", "ids:7,4096"],
        "--prompt 'ids:7,4096': prompt token id 4096 is outside the vocabulary [0, 2048)",
    ),
    (["generate", "--model", "{file}", "--prompt", "ids:1"], "is a file, not a model directory"),
    (["generate", "--model", "{missing}", "--prompt", "ids:1"], "does not exist"),
    (["generate", "--prompt", "ids:1"], "the following arguments are required: --model"),
    # bench: names that are not choices, counts out of range.
    (["bench", "--workloads", "nosuch"], "argument --workloads: 'nosuch': unknown workload"),
    (["bench", "--workloads", "json-64"], "'json-64': times a feature of vLLM's interface"),
    (["bench", "--workloads", "mixed,mixed"], "'mixed' is given twice"),
    (["bench", "--workloads", ""], "argument --workloads: '': unknown workload"),
    (["bench", "--backends", "nosuch"], "argument --backends: 'nosuch': unknown backend"),
    (["bench", "--steps", "0"], "argument --steps: must be an integer in [1, 1000000]"),
    (["bench", "--steps", "1.5"], "argument --steps: must be an integer in [1, "),
    (["bench", "--turn", "0"], "argument --turn: must be an integer in [1, "),
    (["bench", "--steps", "3", "--turn", "5"], "--turn 5 is more than --steps 3"),
    # replay: files that are not traces, named with the line.
    (["replay", "{folder}"], "ironbatch replay: {folder}: cannot open (Is a directory)"),
    (["replay", "{missing}"], "{missing}: cannot open (No such file or directory)"),
    (["replay", "{binary}"], "{binary}: line 1: a NUL byte; this is a binary file"),
    (["replay", "{gz_text}"], "{gz_text}: line 1, column 1: not JSON"),
    (
        ["replay", "{readme}"],
        "{readme}: line 1, column 1: not JSON (Expecting value); an ironbatch-trace/1 trace is "
        "JSON lines, a header first (docs/trace-format.md)",
    ),
    (["replay", "{empty}"], "{empty}: empty file, not an ironbatch-trace/1 trace"),
    (["replay", "{other}"], "{other}: line 1: not an ironbatch-trace/1 trace"),
    (["replay", "{no_config}"], "{no_config}: line 1: the header needs a 'config' object"),
    (["replay", "{config_key}"], "{config_key}: line 1: the header's config lacks 'max_num_seqs'"),
    (["replay", "-", "-"], "'-' (standard input) can be given once"),
    (["replay", "--level", "tokens", "x"], "argument --level: invalid choice: 'tokens'"),
    (["replay", "--backend", "c", "x"], "argument --backend: invalid choice: 'c'"),
]


def run_main(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as e:  # argparse's own exits
        return int(e.code or 0)


@pytest.mark.parametrize(("args", "says"), CASES, ids=[" ".join(a) for a, _ in CASES])
def test_bad_input_is_one_line_naming_the_option(
    args: list[str], says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    names = {f"{{{k}}}": str(v) for k, v in make_files(tmp_path).items()}
    argv = [names.get(a, a) for a in args]
    for name, path in names.items():
        says = says.replace(name, path)
    code = run_main(argv)
    captured = capsys.readouterr()
    assert code == 2, captured
    command = "ironbatch" if argv[0] == "nonsense" else f"ironbatch {argv[0]}"
    assert captured.err.startswith(f"{command}: "), captured.err
    assert says in captured.err, captured.err
    assert len(captured.err.splitlines()) == 1 and "Traceback" not in captured.err
    assert captured.out == ""


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["demo", "--num-blocks", "0"], "ironbatch demo: argument --num-blocks: must be"),
        (["generate", "--model", "random", "--prompt", "hi"], "has no tokenizer.json"),
        (["bench", "--steps", "0"], "ironbatch bench: argument --steps: must be"),
        (["replay", "README.md"], "ironbatch replay: README.md: line 1"),
    ],
)
def test_the_installed_command_exits_2(args: list[str], says: str) -> None:
    root = Path(__file__).parent.parent
    done = subprocess.run([console_script(), *args], capture_output=True, text=True, cwd=root)
    assert done.returncode == 2, done
    assert says in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stdout == ""


@pytest.mark.parametrize(
    ("setting", "says"),
    [
        ("num_blocks", r"num_blocks must be in \[2, 16777216\], got 0"),
        ("max_model_len", r"max_model_len must be in \[2, \d+\], got 0"),
        ("max_num_batched_tokens", r"max_num_batched_tokens must be in \[1, \d+\], got 0"),
    ],
)
def test_llm_refuses_zero_sizes(tmp_path: Path, setting: str, says: str) -> None:
    """0 is not 'work it out' (None is): it is refused with the range."""
    pytest.importorskip("torch")
    from ironbatch.engine import LLM
    from ironbatch.model.random_model import write_random_llama

    write_random_llama(tmp_path)
    with pytest.raises(ValueError, match=says):
        LLM(str(tmp_path), **{setting: 0})


@pytest.mark.parametrize(
    ("command", "missing"),
    [
        (["demo", "--requests", "2"], "torch"),
        (["generate", "--model", "random", "--prompt", "ids:1,2,3"], "torch"),
        (["profile", "--out", "{tmp}/fit.json"], "torch"),
        (["demo", "--requests", "2"], "safetensors"),
    ],
)
def test_engine_commands_without_the_engine_extra_say_how_to_get_it(
    tmp_path: Path, command: list[str], missing: str
) -> None:
    """A base install (no torch, tokenizers, safetensors, tqdm) runs
    simulate, replay and bench; the engine's commands say what to install,
    on one line, instead of a traceback."""
    args = [a.replace("{tmp}", str(tmp_path)) for a in command]
    code = (
        "import sys\n"
        f"sys.modules[{missing!r}] = None  # as if not installed\n"
        "from ironbatch.cli import main\n"
        f"sys.exit(main({args!r}))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 1, done
    line = f"ironbatch {command[0]}: needs the engine's dependencies ({missing} is not installed)"
    assert done.stderr.startswith(line) and len(done.stderr.splitlines()) == 1, done.stderr
    assert 'pip install ".[engine]"' in done.stderr
    assert done.stdout == ""
