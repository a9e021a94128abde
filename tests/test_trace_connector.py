"""KV-connector traces (docs/trace-format.md §3.7): the recorded ones cover
the stand-in, NIXL as a decode instance and CPU offloading under both
load-failure policies, with async loads, failed loads, lost blocks and held
frees; a replay of a trace whose connector answers, transfer reports or
recorded orders were changed differs, on both backends; a malformed
connector record is named with its line. (tests/test_trace_replay.py
replays them all identical.)"""

from __future__ import annotations

import gzip
import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ironbatch.trace import TraceError, replay

from scheduler_helpers import BACKENDS

CONNECTOR = Path(__file__).parent / "data" / "recorded-connector"
TRACES = sorted(CONNECTOR.glob("*.jsonl*"))
NAMES = {
    "standin": "StandInKVConnector (kv_both)",
    "nixl": "NixlConnector (kv_consumer)",
    "offloading": "OffloadingConnector (kv_both)",
}

Config = dict[str, Any]
Steps = list[dict[str, Any]]


def _lines(path: Path) -> list[str]:
    data = path.read_bytes()
    return (gzip.decompress(data) if path.suffix == ".gz" else data).decode().splitlines()


def _read(name: str) -> tuple[dict[str, Any], Steps]:
    lines = _lines(CONNECTOR / name)
    return json.loads(lines[0]), [json.loads(x) for x in lines[1:]]


def _edited(tmp_path: Path, name: str, edit: Callable[[Config, Steps], None]) -> Path:
    header, steps = _read(name)
    edit(header["config"], steps)
    out = tmp_path / name.replace(".gz", "")
    out.write_text("".join(json.dumps(x) + "\n" for x in [header, *steps]))
    return out


def test_every_connector_and_case_is_recorded() -> None:
    """Each connector under each policy where it can fail, and between them
    every case of the protocol: hits loaded in the step and over steps,
    "ask again later", loads failed whole and losing a block (ending with an
    error under "fail"), frees held for a send, and sends reported several
    to a step (whose order the trace keeps)."""
    seen: Counter = Counter()
    for path in TRACES:
        lines = _lines(path)
        header = json.loads(lines[0])
        kind = path.name.removeprefix("big-").split("-")[0]
        assert header["kv_connector_name"] == NAMES[kind], path.name
        policy = header["config"]["kv_connector"]["kv_load_failure_policy"]
        seen[f"{kind} {policy}"] += 1
        for x in map(json.loads, lines[1:]):
            for call in x["connector_calls"]:
                if call[0] == "matched":
                    seen["unknown" if call[3] is None else "hit" if call[3] else "miss"] += 1
                    seen["async load"] += bool(call[3]) and call[4]
                    seen["sync load"] += bool(call[3]) and not call[4]
                seen["held free"] += call[0] == "finished" and call[3]
            report = x.get("kv_connector_output") or {}
            seen["failed load"] += len(report.get("failed_recving", ()))
            seen["lost block"] += len(report.get("invalid_block_ids", ()))
            seen["sends in a step"] += len(report.get("finished_sending", ())) > 1
            seen["error"] += sum(o[2] == "error" for o in x["outputs"])
    for case in ("standin fail", "standin recompute", "nixl fail", "nixl recompute"):
        assert seen[case] >= 2, (case, seen)
    assert seen["offloading fail"] and seen["offloading recompute"], seen
    for case in ("unknown", "hit", "miss", "async load", "sync load", "held free"):
        assert seen[case] >= 10, (case, seen)
    for case in ("failed load", "lost block", "sends in a step", "error"):
        assert seen[case] >= 5, (case, seen)


def _first(steps: Steps, want: Callable[[dict[str, Any]], Any]) -> Any:
    for x in steps:
        if (found := want(x)) is not None:
            return found
    raise AssertionError("the trace has no such entry")


def _shorter_hit(config: Config, steps: Steps) -> None:
    """The first external hit of two tokens or more answers one fewer."""

    def hit(x: dict[str, Any]) -> Any:
        return next(
            (c for c in x["connector_calls"] if c[0] == "matched" and (c[3] or 0) > 1), None
        )

    _first(steps, hit)[3] -= 1


def _load_done_early(config: Config, steps: Steps) -> None:
    """A load whose report came two or more steps after its allocation is
    reported one step earlier."""
    allocated: dict[str, int] = {}
    for i, x in enumerate(steps):
        for c in x["connector_calls"]:
            if c[0] == "allocated" and c[3]:
                allocated[c[1]] = i
        report = x.get("kv_connector_output") or {}
        for rid in report.get("finished_recving", ()):
            if allocated.get(rid, i) < i - 1:
                report["finished_recving"].remove(rid)
                earlier = steps[i - 1].get("kv_connector_output") or {}
                earlier.setdefault("finished_recving", []).append(rid)
                steps[i - 1]["kv_connector_output"] = earlier
                return
    raise AssertionError("no load took two steps")


def _lost_block_kept(config: Config, steps: Steps) -> None:
    """The first report of a lost block loses none."""

    def lost(x: dict[str, Any]) -> Any:
        report = x.get("kv_connector_output") or {}
        return report if report.get("invalid_block_ids") else None

    del _first(steps, lost)["invalid_block_ids"]


def _held_free_released(config: Config, steps: Steps) -> None:
    """The first held free is freed at once (the connector says no send)."""

    def held(x: dict[str, Any]) -> Any:
        return next((c for c in x["connector_calls"] if c[0] == "finished" and c[3]), None)

    call = _first(steps, held)
    call[3] = False
    for x in steps:  # and its send is never reported
        report = x.get("kv_connector_output") or {}
        if call[1] in report.get("finished_sending", ()):
            report["finished_sending"].remove(call[1])


def _sends_reordered(config: Config, steps: Steps) -> None:
    """Every report of several sends lists them the other way round."""
    for x in steps:
        sends = (x.get("kv_connector_output") or {}).get("finished_sending", [])
        sends.reverse()


def _errors_reordered(config: Config, steps: Steps) -> None:
    """A step that ends two failed loads with errors ends them the other way."""
    for x in steps:
        errors = [o for o in x["outputs"] if o[2] == "error"]
        if len(errors) > 1:
            x["outputs"] = [o for o in x["outputs"] if o[2] != "error"] + errors[::-1]
            return
    raise AssertionError("no step ends two failed loads")


def _without_connector(config: Config, steps: Steps) -> None:
    del config["kv_connector"]


def _other_policy(config: Config, steps: Steps) -> None:
    policy = config["kv_connector"]["kv_load_failure_policy"]
    config["kv_connector"]["kv_load_failure_policy"] = "recompute" if policy == "fail" else "fail"


MUTATIONS = {
    "a shorter external hit": ("standin-1012.jsonl", _shorter_hit),
    # (In nixl-1102 the first such load's request would not have been
    # reached a step earlier either; this one's is.)
    "a load reported a step early": ("nixl-1109.jsonl", _load_done_early),
    "a lost block not reported": ("nixl-1108.jsonl", _lost_block_kept),
    "a held free released at once": ("standin-1018.jsonl", _held_free_released),
    "sends in another order": ("standin-1038.jsonl", _sends_reordered),
    "failed loads ended in another order": ("nixl-1124.jsonl", _errors_reordered),
    "no connector": ("offloading-1200.jsonl", _without_connector),
    "the other failure policy": ("standin-1038.jsonl", _other_policy),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mutation", MUTATIONS)
def test_a_changed_record_differs(tmp_path: Path, backend: str, mutation: str) -> None:
    name, edit = MUTATIONS[mutation]
    assert replay(CONNECTOR / name, backend=backend).identical
    result = replay(_edited(tmp_path, name, edit), backend=backend)
    assert not result.identical, mutation


def test_a_call_the_replay_does_not_make_is_named(tmp_path: Path) -> None:
    """A recorded call the replayed scheduler never makes: the replay names
    the call, with the recorded entry and what was made in its place."""

    def extra_call(config: Config, steps: Steps) -> None:
        steps[0]["connector_calls"].insert(0, ["matched", "r-none", 0, 0, False])

    result = replay(_edited(tmp_path, "standin-1006.jsonl", extra_call))
    assert (result.step, result.field) == (0, "connector_calls[0]"), str(result)
    assert result.expected == ["matched", "r-none", 0, 0, False]


@pytest.mark.parametrize(
    ("calls", "match"),
    [
        ({"matched": 1}, "connector_calls must be a list"),
        ([["asked", "r0", 0]], r"connector_calls\[0\] must be \[kind, request_id"),
        ([["matched", "r0", 0, 3]], r"connector_calls\[0\]: a 'matched' entry is"),
        ([["matched", "r0", 0, "3", True]], "num_external_tokens has the wrong type"),
        ([["finished", "r0", [1, True], False]], "block_ids has the wrong type"),
        ([["allocated", 7, [1], 0]], "request_id must be a string"),
    ],
)
def test_a_bad_connector_record_names_its_line(tmp_path: Path, calls: Any, match: str) -> None:
    def bad(config: Config, steps: Steps) -> None:
        steps[2]["connector_calls"] = calls

    path = _edited(tmp_path, "standin-1006.jsonl", bad)
    with pytest.raises(TraceError, match=rf"line 4: .*{match}"):
        replay(path)


@pytest.mark.parametrize(
    ("report", "match"),
    [
        ([], "kv_connector_output must be an object or null"),
        ({"finished_recving": "r1"}, "kv_connector_output.finished_recving must be a list"),
        ({"invalid_block_ids": [-1]}, "is not a block id"),
    ],
)
def test_a_bad_report_names_its_line(tmp_path: Path, report: Any, match: str) -> None:
    def bad(config: Config, steps: Steps) -> None:
        steps[1]["kv_connector_output"] = report

    with pytest.raises(TraceError, match=rf"line 3: .*{match}"):
        replay(_edited(tmp_path, "standin-1006.jsonl", bad))


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        ("fail", "kv_connector must be an object or null"),
        ({"kv_load_failure_policy": "retry"}, "kv_load_failure_policy must be one of"),
    ],
)
def test_a_bad_connector_setting_names_the_header(
    tmp_path: Path, settings: Any, match: str
) -> None:
    def bad(config: Config, steps: Steps) -> None:
        config["kv_connector"] = settings

    with pytest.raises(TraceError, match=rf"line 1: the header's config: .*{match}"):
        replay(_edited(tmp_path, "standin-1006.jsonl", bad))
