"""Speculative traces (docs/trace-format.md §3.5): the recorded ones really
speculate, and a replay finds a changed draft, scheduled draft, acceptance or
stats entry at its step, on both backends."""

from __future__ import annotations

import json
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
