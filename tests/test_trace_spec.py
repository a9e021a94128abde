"""Speculative traces (docs/trace-format.md §3.5): the recorded ones really
speculate, every method's are there with the settings vLLM derives for it, a
replay finds a changed draft, scheduled draft, acceptance or stats entry at
its step, and one without a drafter's setting differs, on both backends."""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ironbatch.trace import replay

from scheduler_helpers import BACKENDS

SPEC = Path(__file__).parent / "data" / "recorded-spec"
SOURCE = SPEC / "spec-0301.jsonl"  # k=4, tight cache: preemptions among the drafts

Steps = list[dict[str, Any]]


def _steps() -> tuple[str, Steps]:
    lines = SOURCE.read_text().splitlines()
    return lines[0], [json.loads(x) for x in lines[1:]]


def _tampered(tmp_path: Path, edit: Callable[[Steps], None]) -> Path:
    header, steps = _steps()
    edit(steps)
    out = tmp_path / "tampered.jsonl"
    out.write_text("\n".join([header] + [json.dumps(s) for s in steps]) + "\n")
    return out


def _first_verified(steps: Steps) -> tuple[int, str]:
    """The first step that scheduled drafts given on its own line and
    accepted some of them, for a request that runs on (no stop trims its
    tokens): (index into steps, request id)."""
    for i, s in enumerate(steps):
        given = dict(s["drafts"])
        sampled = dict(s["sampled"])
        running = {o[0] for o in s["outputs"] if o[2] is None}
        for rid, drafts in s["schedule"]["spec_tokens"]:
            if given.get(rid) == drafts and len(sampled[rid]) > 1 and rid in running:
                return i, rid
    raise AssertionError("no step accepted a draft")


def test_the_recorded_traces_speculate() -> None:
    """Drafts given, scheduled, partly accepted, padded admissions, and
    stops inside accepted runs: what the identical replays stand on."""
    header, steps = _steps()
    assert json.loads(header)["config"]["num_speculative_tokens"] == 4
    assert any(len(tokens) > 1 for s in steps for _, tokens in s["sampled"])
    totals = {"accepted": 0, "drafts": 0, "padded": 0, "stopped_in_run": 0}
    for path in sorted(SPEC.glob("*.jsonl")):
        for line in path.read_text().splitlines()[1:]:
            s = json.loads(line)
            if stats := s["spec_decoding_stats"]:
                totals["accepted"] += stats["num_accepted_tokens"]
                totals["drafts"] += stats["num_draft_tokens"]
            totals["padded"] += sum(-1 in d for _, d in s["schedule"]["spec_tokens"])
            sampled = dict(s["sampled"])
            totals["stopped_in_run"] += sum(
                o[2] is not None and len(o[1]) < len(sampled[o[0]]) for o in s["outputs"]
            )
    assert 0 < totals["accepted"] < totals["drafts"]
    assert totals["padded"] > 0 and totals["stopped_in_run"] > 0


@pytest.mark.parametrize("level", ["blocks", "decisions"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_changed_draft_is_found(tmp_path: Path, backend: str, level: str) -> None:
    i, rid = _first_verified(_steps()[1])

    def edit(steps: Steps) -> None:
        drafts = dict(steps[i]["drafts"])[rid]
        drafts[0] = 250 if drafts[0] != 250 else 251

    result = replay(_tampered(tmp_path, edit), backend=backend, level=level)
    assert (result.step, result.field) == (i, "spec_tokens")
    assert "spec_tokens differs" in str(result)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_changed_scheduled_draft_is_found(tmp_path: Path, backend: str) -> None:
    i, rid = _first_verified(_steps()[1])

    def edit(steps: Steps) -> None:
        spec = steps[i]["schedule"]["spec_tokens"]
        spec[:] = [[r, d[:-1]] if r == rid else [r, d] for r, d in spec]

    result = replay(_tampered(tmp_path, edit), backend=backend)
    assert (result.step, result.field) == (i, "spec_tokens")
    assert len(dict(result.actual)[rid]) == len(dict(result.expected)[rid]) + 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_drafts_not_given_are_found(tmp_path: Path, backend: str) -> None:
    i, rid = _first_verified(_steps()[1])

    def edit(steps: Steps) -> None:
        steps[i]["drafts"] = [[r, d] for r, d in steps[i]["drafts"] if r != rid]

    # Without its drafts the request is scheduled for one token, not 1 + d.
    result = replay(_tampered(tmp_path, edit), backend=backend)
    assert (result.step, result.field) == (i, "scheduled")
    assert [e[1] for e in result.actual if e[0] == rid] == [1]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_changed_acceptance_count_is_found(tmp_path: Path, backend: str) -> None:
    i, _ = _first_verified(_steps()[1])

    def edit(steps: Steps) -> None:
        stats = steps[i]["spec_decoding_stats"]
        stats["num_accepted_tokens"] -= 1
        last = max(p for p, n in enumerate(stats["num_accepted_tokens_per_pos"]) if n)
        stats["num_accepted_tokens_per_pos"][last] -= 1

    result = replay(_tampered(tmp_path, edit), backend=backend)
    assert (result.step, result.field) == (i, "spec_decoding_stats")
    assert result.actual["num_accepted_tokens"] == result.expected["num_accepted_tokens"] + 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_rejected_draft_shows_in_the_outputs(tmp_path: Path, backend: str) -> None:
    """One accepted draft fewer in ``sampled``: the scheduler appends one
    token fewer, and the outputs say so before the stats are compared."""
    i, rid = _first_verified(_steps()[1])

    def edit(steps: Steps) -> None:
        for entry in steps[i]["sampled"]:
            if entry[0] == rid:
                del entry[1][-2]  # the last accepted draft; the sampled token stays

    result = replay(_tampered(tmp_path, edit), backend=backend)
    assert (result.step, result.field) == (i, "outputs")


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_spec_comparisons_are_optional(tmp_path: Path, backend: str) -> None:
    """Without the recorded spec tokens and stats (keys a trace may leave
    out) the drafts still drive the replay, which compares the rest."""

    def edit(steps: Steps) -> None:
        for s in steps:
            del s["schedule"]["spec_tokens"], s["spec_decoding_stats"]

    result = replay(_tampered(tmp_path, edit), backend=backend)
    assert result.identical, str(result)
    assert result.steps == len(_steps()[1])


# Methods whose drafter has a forward pass of its own, and the config keys
# vLLM derives for them (docs/trace-format.md §2).
DRAFTER_METHODS = ("eagle", "eagle3", "mtp", "draft_model")
DRAFTER_KEYS = ("num_lookahead_tokens", "num_hash_lookahead_tokens", "num_draft_slots")


def _lines(path: Path) -> list[str]:
    data = path.read_bytes()
    return (gzip.decompress(data) if path.suffix == ".gz" else data).decode().splitlines()


def _drafter_settings(method: str, config: dict[str, Any]) -> tuple[int, int, int]:
    """What vLLM 0.33 derives from ``method`` (one MTP module, no parallel
    drafting): lookahead slots, lookahead hash tokens, drafting slots."""
    k = config["num_speculative_tokens"]
    if method == "ngram":
        return 0, 0, 0
    if method == "draft_model":
        return k, 0, 1
    return k, int(config["enable_prefix_caching"]), 0  # EAGLE, EAGLE-3, MTP


def test_each_method_is_recorded_with_its_settings() -> None:
    """Every method's traces are there (several, one big), most with prefix
    caching and some with a tight cache and preemptions, and each header
    carries what vLLM derived for its method; n-gram ones carry none of it."""
    by_method: dict[str, list[tuple[dict[str, Any], int]]] = defaultdict(list)
    for path in sorted(SPEC.glob("*.jsonl*")):
        lines = _lines(path)
        header = json.loads(lines[0])
        method = header.get("speculative_method", "ngram")
        config = header["config"]
        assert path.name.split("-")[-2] == ("spec" if method == "ngram" else method)
        settings = tuple(config.get(key, 0) for key in DRAFTER_KEYS)
        assert settings == _drafter_settings(method, config), path.name
        if method == "ngram":
            assert not set(DRAFTER_KEYS) & set(config), path.name
        preempted = sum(len(json.loads(x)["schedule"]["preempted"]) for x in lines[1:])
        by_method[method].append((config, preempted))
    assert set(by_method) == {"ngram", *DRAFTER_METHODS}
    for method in DRAFTER_METHODS:
        traces = by_method[method]
        assert len(traces) >= 4, method
        caching = [c for c, _ in traces if c["enable_prefix_caching"]]
        assert len(caching) > len(traces) // 2, method
        per_seq = [-(-c["max_model_len"] // c["block_size"]) for c, _ in traces]
        assert any(c["num_blocks"] <= 3 * n for (c, _), n in zip(traces, per_seq, strict=True))
        assert any(p for _, p in traces), method


def _without(tmp_path: Path, name: str, key: str) -> Path:
    """A copy of the recorded trace ``name`` whose header lacks ``key``."""
    lines = (SPEC / name).read_text().splitlines()
    header = json.loads(lines[0])
    del header["config"][key]
    out = tmp_path / f"without-{key}.jsonl"
    out.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    return out


@pytest.mark.parametrize("backend", BACKENDS)
def test_lookahead_hashes_matter(tmp_path: Path, backend: str) -> None:
    """Without ``num_hash_lookahead_tokens`` a block's hash exists as soon
    as the block is full, so a replay admits a request with a longer prefix
    hit than vLLM, whose EAGLE hashes wait for the token after the block."""
    name = "eagle-0505.jsonl"  # k=3, prefix caching, shared prefixes
    assert replay(SPEC / name, backend=backend, level="decisions").identical
    path = _without(tmp_path, name, "num_hash_lookahead_tokens")
    result = replay(path, backend=backend, level="decisions")
    assert result.field == "scheduled", str(result)
    recorded = {e[0]: e[3] for e in result.expected if e[2] == "new"}
    replayed = {e[0]: e[3] for e in result.actual if e[2] == "new"}
    assert any(replayed[rid] > hit for rid, hit in recorded.items() if rid in replayed)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("name", "level"),
    [
        ("eagle-0505.jsonl", "blocks"),  # ample cache: fewer blocks allocated
        ("eagle-0504.jsonl", "decisions"),  # tight cache: other preemptions
    ],
)
def test_lookahead_slots_matter(tmp_path: Path, backend: str, name: str, level: str) -> None:
    assert replay(SPEC / name, backend=backend, level=level).identical
    result = replay(_without(tmp_path, name, "num_lookahead_tokens"), backend=backend, level=level)
    assert result.field == "scheduled", str(result)


@pytest.mark.parametrize("backend", BACKENDS)
def test_drafting_slots_matter(tmp_path: Path, backend: str) -> None:
    """Without ``num_draft_slots`` the input budget is not charged a
    drafting slot per request: a replay schedules more tokens than vLLM."""
    name = "draft_model-0573.jsonl"
    assert replay(SPEC / name, backend=backend, level="decisions").identical
    result = replay(_without(tmp_path, name, "num_draft_slots"), backend=backend, level="decisions")
    assert result.field == "scheduled", str(result)
    assert sum(e[1] for e in result.actual) > sum(e[1] for e in result.expected)
