"""Every trace recorded from vLLM 0.33's own scheduler replays identical at
block level on both backends (hybrid KV caches' per KV-cache group), and a
replay reports a real difference."""

from __future__ import annotations

import copy
import gzip
import json
from pathlib import Path

import pytest

from ironbatch.trace import TraceError, replay

from scheduler_helpers import BACKENDS

DATA = Path(__file__).parent / "data"
# traces/: the 40 shared traces recorded from vLLM 0.33.0; recorded/: 32 more
# recorded from vLLM 0.33.0 with benches/record_vllm.py (seeds 100-129, and
# two large workloads with many preemptions, seeds 201 and 203 with --big);
# recorded-spec/: 39 speculative ones, k drawn per seed: 23 n-gram (--spec
# ngram: seeds 300-319, and seeds 400, 405 and 408 with --big, gzipped) and 16
# with a drafter of its own (lookahead slots and hashes, drafting slots): 3
# each of --spec eagle (seeds 504, 505, 509), eagle3 (525, 530, 534), mtp
# (540, 545, 551) and draft_model (563, 573, 576), and one --big each, gzipped
# (eagle 601, eagle3 610, mtp 621, draft_model 632); recorded-hybrid/: 17 of
# hybrid KV caches, block ids per KV-cache group, the window drawn per seed:
# --layout gpt-oss (seeds 705, 706, 725, 728, 736, 739), gemma3 (743, 746,
# 761, 767) and llama4 (801, 810, 818, 819), and one --big each, gzipped
# (gpt-oss 900, gemma3 913, llama4 936); recorded-lora/: 11 with LoRA
# (--lora: max_loras 1-4, up to 8 adapters), seeds 1000, 1002, 1005, 1008,
# 1009, 1010, 1011, 1013, 1016 and 1019, each chosen because its replay
# changes without the cap and without the adapters (tested below), and one
# --big, gzipped (1101); recorded-images/: 11 of a vision model (--images:
# its encoder budget 16-64 and cache 1-2 times that, up to three images a
# request from a shared pool), seeds 1201, 1202, 1204, 1205, 1206, 1210,
# 1217, 1222, 1223 and 1225, each chosen because its replay changes without
# the images and without the encoder's limits (tested below), and one --big,
# gzipped (1301); recorded-connector/: 22 with a KV connector, its calls
# answered from the record (--connector): standin (seeds 1006, 1009, 1011,
# 1012, 1014, 1016, 1018, 1019, 1028, 1038, and 1052 with --big, gzipped),
# nixl as a decode instance (1102, 1106, 1108, 1109, 1119, 1124, and 1150
# with --big, gzipped) and offloading (1200, 1201, 1203, 1209), chosen for
# both failure policies, failed loads, lost blocks and held frees
# (tests/test_trace_connector.py); recorded-recurrent/: 10 of Mamba and
# linear-attention hybrids, prefix caching off (--layout qwen3-next: seeds
# 1400, 1403, 1405, 1407; --layout jamba: 1400, 1403, 1404, 1410; and one
# --big each, gzipped: 1452), chosen for preemptions
# (tests/test_trace_recurrent.py); recorded-recurrent-align/: 10 of the
# same with prefix caching on, vLLM's cache mode "align" (--layout
# qwen3-next-align: seeds 1500, 1501, 1509, 1512; --layout jamba-align:
# 1500, 1506, 1508, 1513; and one --big each, gzipped: 1552), chosen for
# preemptions, with and without Mamba2's prefill checkpoints.
TRACES = sorted((DATA / "traces").glob("*.jsonl"))
RECORDED = sorted((DATA / "recorded").glob("*.jsonl"))
SPEC = sorted((DATA / "recorded-spec").glob("*.jsonl*"))
HYBRID = sorted((DATA / "recorded-hybrid").glob("*.jsonl*"))
LORA = sorted((DATA / "recorded-lora").glob("*.jsonl*"))
IMAGES = sorted((DATA / "recorded-images").glob("*.jsonl*"))
CONNECTOR = sorted((DATA / "recorded-connector").glob("*.jsonl*"))
RECURRENT = sorted((DATA / "recorded-recurrent").glob("*.jsonl*"))
ALIGNED = sorted((DATA / "recorded-recurrent-align").glob("*.jsonl*"))
ALL = TRACES + RECORDED + SPEC + HYBRID + LORA + IMAGES + CONNECTOR + RECURRENT + ALIGNED


def test_the_traces_are_there() -> None:
    assert len(TRACES) == 40
    assert len(RECORDED) == 32
    assert len(SPEC) == 39
    assert len(HYBRID) == 17
    assert len(LORA) == 11
    assert len(IMAGES) == 11
    assert len(CONNECTOR) == 22
    assert len(RECURRENT) == 10
    assert len(ALIGNED) == 10


def _lines(path: Path) -> list[str]:
    data = path.read_bytes()
    return (gzip.decompress(data) if path.suffix == ".gz" else data).decode().splitlines()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("path", ALL, ids=[p.name.split(".")[0] for p in ALL])
def test_trace_replays_identical(path: Path, backend: str) -> None:
    result = replay(path, backend=backend, level="blocks")
    assert result.identical, str(result)
    assert result.steps == len(_lines(path)) - 1


def _tampered(tmp_path: Path, edit) -> Path:  # type: ignore[no-untyped-def]
    lines = TRACES[0].read_text().splitlines()
    header, steps = lines[0], [json.loads(x) for x in lines[1:]]
    edit(steps)
    out = tmp_path / "tampered.jsonl"
    out.write_text("\n".join([header] + [json.dumps(s) for s in steps]) + "\n")
    return out


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_changed_block_id_is_found_at_block_level_only(tmp_path: Path, backend: str) -> None:
    def edit(steps: list) -> None:
        steps[3]["schedule"]["scheduled"][0][4] = [99]

    path = _tampered(tmp_path, edit)
    result = replay(path, backend=backend, level="blocks")
    assert not result.identical
    assert (result.step, result.field) == (3, "scheduled")
    assert result.expected[0][4] == [99] and result.actual[0][4] != [99]
    assert "step 3: scheduled differs" in str(result)
    assert replay(path, backend=backend, level="decisions").identical


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_changed_output_is_found(tmp_path: Path, backend: str) -> None:
    def edit(steps: list) -> None:
        steps[4]["outputs"][1][2] = None  # r1 finished with "length" in vLLM

    result = replay(_tampered(tmp_path, edit), backend=backend, level="decisions")
    assert (result.step, result.field) == (4, "outputs")


def test_replay_rejects_other_formats(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"format": "something-else"}\n')
    with pytest.raises(ValueError, match="something-else"):
        replay(bad)
    with pytest.raises(ValueError, match="level"):
        replay(TRACES[0], level="tokens")


def test_replay_streams_the_trace(tmp_path: Path) -> None:
    """Records are read as they are replayed: a difference at the first step
    is reported before any later line is parsed (a whole-file loader would
    fail on the broken tail), and a gzipped trace replays the same."""
    lines = TRACES[0].read_text().splitlines()
    first = json.loads(lines[1])
    first["num_free_blocks"] += 1
    broken = tmp_path / "broken.jsonl"
    broken.write_text("\n".join([lines[0], json.dumps(first), "{not json"]) + "\n")
    result = replay(broken)
    assert (result.steps, result.field) == (1, "num_free_blocks")
    zipped = tmp_path / "trace.jsonl.gz"
    zipped.write_bytes(gzip.compress(TRACES[0].read_bytes()))
    assert replay(zipped).identical
    assert replay(zipped).steps == len(lines) - 1


def _step_lines(path: Path, edit) -> Path:  # type: ignore[no-untyped-def]
    """The first trace with its second step record edited as a dict."""
    lines = TRACES[0].read_text().splitlines()
    step = json.loads(lines[2])
    edit(step)
    path.write_text("\n".join([*lines[:2], json.dumps(step), *lines[3:]]) + "\n")
    return path


def test_a_file_that_is_not_a_trace_is_named_with_its_line(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("\n# ironbatch\n")
    with pytest.raises(TraceError, match=r"README.md: line 2, column 1: not JSON") as e:
        replay(readme)
    assert "ironbatch-trace/1 trace is JSON lines, a header first" in str(e.value)
    binary = tmp_path / "a.out"
    binary.write_bytes(b"\x7fELF\x00\x01")
    with pytest.raises(TraceError, match=r"a.out: line 1: a NUL byte"):
        replay(binary)
    with pytest.raises(TraceError, match=r"nope.jsonl: cannot open \(No such file"):
        replay(tmp_path / "nope.jsonl")
    with pytest.raises(TraceError, match=r"cannot open \(Is a directory"):
        replay(tmp_path)


def test_a_bad_step_is_named_with_its_line_and_key(tmp_path: Path) -> None:
    missing = _step_lines(tmp_path / "m.jsonl", lambda s: s.pop("abort"))
    with pytest.raises(TraceError, match=r"m.jsonl: line 3: the step lacks 'abort'"):
        replay(missing)
    nested = _step_lines(tmp_path / "n.jsonl", lambda s: s["schedule"].pop("preempted"))
    with pytest.raises(TraceError, match=r"n.jsonl: line 3: the step lacks 'preempted'"):
        replay(nested)
    lines = TRACES[0].read_text().splitlines()
    (tmp_path / "j.jsonl").write_text("\n".join([*lines[:3], "{oops", *lines[4:]]) + "\n")
    with pytest.raises(TraceError, match=r"j.jsonl: line 4, column 2: not JSON"):
        replay(tmp_path / "j.jsonl")


def test_a_truncated_gzip_trace_is_named(tmp_path: Path) -> None:
    whole = gzip.compress(TRACES[0].read_bytes())
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(whole[: len(whole) * 2 // 3])
    with pytest.raises(TraceError, match=r"cut.jsonl.gz: after line \d+: the gzip stream is"):
        replay(cut)


def test_on_step_is_called_once_a_step(tmp_path: Path) -> None:
    calls: list[None] = []
    result = replay(TRACES[0], on_step=lambda: calls.append(None))
    assert result.identical and len(calls) == result.steps


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("path", LORA, ids=[p.name.split(".")[0] for p in LORA])
def test_a_lora_trace_needs_the_cap_and_the_adapters(
    tmp_path: Path, path: Path, backend: str
) -> None:
    """Each LoRA trace replays identical only with vLLM's rules: without
    max_loras (no skip) or without the requests' adapters (no hash keys, no
    skip) its replay differs from what vLLM recorded."""
    lines = _lines(path)
    header, steps = json.loads(lines[0]), [json.loads(x) for x in lines[1:]]
    uncapped = copy.deepcopy(header)
    del uncapped["config"]["max_loras"]
    base_model = copy.deepcopy(steps)
    for step in base_model:
        for added in step["add"]:
            added.pop("lora_request", None)
    for i, (h, s) in enumerate(((uncapped, steps), (header, base_model))):
        out = tmp_path / f"changed-{i}.jsonl"
        out.write_text("\n".join(json.dumps(x) for x in [h, *s]) + "\n")
        assert not replay(out, backend=backend, level="blocks").identical, (i, path.name)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("path", IMAGES, ids=[p.name.split(".")[0] for p in IMAGES])
def test_an_image_trace_needs_the_images_and_the_encoder_limits(
    tmp_path: Path, path: Path, backend: str
) -> None:
    """Each image trace replays identical at block level only with vLLM's
    encoder rules: without its images (no cuts before them, no image keys
    in the hashes) or without the encoder's limits (no budget or cache
    cuts), the blocks scheduled differ from what vLLM recorded. The
    recorded encoder inputs are left out, so only the blocks can tell."""
    lines = _lines(path)
    header, steps = json.loads(lines[0]), [json.loads(x) for x in lines[1:]]
    for step in steps:
        del step["schedule"]["encoder_inputs"], step["schedule"]["free_encoder_mm_hashes"]
    text = copy.deepcopy(header)
    del text["config"]["encoder_compute_budget"], text["config"]["encoder_cache_size"]
    no_images = copy.deepcopy(steps)
    for step in no_images:
        for added in step["add"]:
            added.pop("mm_features", None)
    unlimited = copy.deepcopy(header)
    unlimited["config"]["encoder_compute_budget"] = 10**6
    unlimited["config"]["encoder_cache_size"] = 10**6
    for i, (h, s) in enumerate(((header, steps), (text, no_images), (unlimited, steps))):
        out = tmp_path / f"changed-{i}.jsonl"
        out.write_text("\n".join(json.dumps(x) for x in [h, *s]) + "\n")
        identical = replay(out, backend=backend, level="blocks").identical
        assert identical == (i == 0), (i, path.name)


@pytest.mark.parametrize(
    ("features", "match"),
    [
        ("img", "mm_features must be a list or null, got str"),
        ([{"offset": 0, "length": 4}], r"mm_features\[0\] needs identifier"),
        ([{"offset": -1, "length": 4, "identifier": "a"}], "offset must be >= 0, got -1"),
        ([{"offset": 0, "length": 9999, "identifier": "a"}], "ends past the prompt"),
    ],
)
def test_a_bad_image_names_its_line(tmp_path: Path, features: object, match: str) -> None:
    out, line = _first_request_with(IMAGES[0], "mm_features", features, tmp_path)
    with pytest.raises(TraceError, match=rf"{out.name}: line {line}: .*{match}"):
        replay(out)


def _first_request_with(trace: Path, key: str, value: object, tmp_path: Path) -> tuple[Path, int]:
    """A copy of ``trace`` whose first added request has ``key`` set to
    ``value``, and the line that request is on."""
    lines = _lines(trace)
    steps = [json.loads(x) for x in lines[1:]]
    first = next(i for i, s in enumerate(steps) if s["add"])
    steps[first]["add"][0][key] = value
    out = tmp_path / f"bad-{key}.jsonl"
    out.write_text("\n".join([lines[0], *(json.dumps(s) for s in steps)]) + "\n")
    return out, first + 2


@pytest.mark.parametrize(
    ("lora", "match"),
    [
        ("adapter-1", "lora_request must be an object or null, got str"),
        ({"lora_name": "a"}, "lora_request needs lora_int_id"),
        ({"lora_name": "a", "lora_int_id": 0}, r"lora_int_id must be in \[1, "),
        ({"lora_name": 3, "lora_int_id": 1}, "lora_name must be a str"),
    ],
)
def test_a_bad_lora_request_names_its_line(tmp_path: Path, lora: object, match: str) -> None:
    out, line = _first_request_with(LORA[0], "lora_request", lora, tmp_path)
    with pytest.raises(TraceError, match=rf"{out.name}: line {line}: .*{match}"):
        replay(out)
