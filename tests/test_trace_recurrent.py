"""Traces of Mamba and linear-attention hybrids recorded from vLLM 0.33
(docs/scheduling.md §7.15): Qwen3-Next's three linear-attention groups and
Jamba's Mamba group beside full attention, prefix caching off
(recorded-recurrent/) and on (recorded-recurrent-align/: vLLM's cache mode
"align"). The recorded ones carry vLLM's groups, one block list per group
in every scheduled row, and a replay with the recurrent groups told wrong
differs, on both backends. (tests/test_trace_replay.py replays them all
identical.)"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from ironbatch.trace import replay

from scheduler_helpers import BACKENDS

RECURRENT = Path(__file__).parent / "data" / "recorded-recurrent"
TRACES = sorted(RECURRENT.glob("*.jsonl*"))
ALIGNED = sorted((Path(__file__).parent / "data" / "recorded-recurrent-align").glob("*.jsonl*"))
# Each layout's recurrent groups, before its full-attention group.
LAYOUTS = {"qwen3-next": 3, "jamba": 1}


def _lines(path: Path) -> list[str]:
    data = path.read_bytes()
    return (gzip.decompress(data) if path.suffix == ".gz" else data).decode().splitlines()


def _recorded(path: Path) -> tuple[str, dict[str, Any], list[dict[str, Any]]]:
    """A recurrent trace's layout, config and steps, its name and groups
    checked: the layout's recurrent groups, then full attention."""
    lines = _lines(path)
    header = json.loads(lines[0])
    layout, config = header["kv_layout"], header["config"]
    assert path.name.removeprefix("big-").startswith(layout + "-"), path.name
    kinds = [g["kind"] for g in config["kv_cache_groups"]]
    assert kinds == ["mamba"] * LAYOUTS[layout] + ["full"], path.name
    return layout, config, [json.loads(x) for x in lines[1:]]


def test_each_layout_is_recorded_with_vllms_groups() -> None:
    """Every layout has traces (one big), some with preemptions; each header
    has the layout's groups, state blocks of max_model_len (vLLM's default
    without prefix caching), and prefix caching off; every scheduled row a
    block list per group, a recurrent group's a state block on admission."""
    seen: dict[str, list[int]] = {layout: [] for layout in LAYOUTS}
    for path in TRACES:
        layout, config, steps = _recorded(path)
        states = LAYOUTS[layout]
        groups = config["kv_cache_groups"]
        assert all(g["size"] == config["max_model_len"] for g in groups[:states]), path.name
        assert not config["enable_prefix_caching"], path.name
        for e in (e for s in steps for e in s["schedule"]["scheduled"]):
            assert len(e[4]) == states + 1, path.name
            if e[2] != "running":  # admitted or resumed: the whole tables
                assert all(len(ids) == 1 for ids in e[4][:states]), (path.name, e)
        seen[layout].append(sum(len(s["schedule"]["preempted"]) for s in steps))
    for layout, preemptions in seen.items():
        assert len(preemptions) >= 4 and sum(p > 0 for p in preemptions) >= 3, layout
    assert any(p.name.startswith("big-") for p in TRACES)


def _changed(tmp_path: Path, path: Path, change: dict[str, Any]) -> Path:
    lines = _lines(path)
    header = json.loads(lines[0])
    for g in header["config"]["kv_cache_groups"]:
        if g["kind"] == "mamba":
            g.update(change)
    out = tmp_path / f"changed-{path.name.removesuffix('.gz')}"
    out.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    return out


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("path", TRACES, ids=[p.name.split(".")[0] for p in TRACES])
def test_a_recurrent_trace_needs_its_state_blocks(tmp_path: Path, path: Path, backend: str) -> None:
    """Each trace replays identical only with vLLM's recurrent groups: with
    a scratch state per group and request more, or with state blocks of
    half the model's length (a second one taken, the first given back, as
    tokens pass the middle), its replay differs."""
    half = json.loads(_lines(path)[0])["config"]["max_model_len"] // 2
    for change in ({"speculative_blocks": 1}, {"size": half}):
        result = replay(_changed(tmp_path, path, change), backend=backend, level="blocks")
        assert not result.identical, (change, path.name)


def test_each_layout_is_recorded_with_cached_states() -> None:
    """With prefix caching on, every layout has traces (one big), most with
    preemptions, prefill checkpoints in some and not in others; each header
    has the layout's groups with states of the block size; a recurrent
    group's rows hold nulls before a state."""
    seen: dict[str, list[tuple[int, bool]]] = {layout: [] for layout in LAYOUTS}
    nulls = 0
    for path in ALIGNED:
        layout, config, steps = _recorded(path)
        states = LAYOUTS[layout]
        groups = config["kv_cache_groups"]
        assert all(g["size"] == config["block_size"] for g in groups[:states]), path.name
        assert config["enable_prefix_caching"], path.name
        rows = [e for s in steps for e in s["schedule"]["scheduled"]]
        nulls += sum(0 in e[4][0] for e in rows)
        checkpoints = groups[0].get("prefill_checkpoint_alignment") is not None
        seen[layout].append((sum(len(s["schedule"]["preempted"]) for s in steps), checkpoints))
    for layout, traces in seen.items():
        assert len(traces) >= 4 and sum(p > 0 for p, _ in traces) >= 3, layout
        assert {c for _, c in traces} == {True, False}, layout
    assert nulls > 0
    assert any(p.name.startswith("big-") for p in ALIGNED)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("path", ALIGNED, ids=[p.name.split(".")[0] for p in ALIGNED])
def test_a_cached_states_trace_needs_its_settings(tmp_path: Path, path: Path, backend: str) -> None:
    """Each trace with cached states replays identical only as vLLM ran it:
    with a scratch state per group and request more, or with Mamba2's
    prefill checkpoints told the other way round, its replay differs."""
    groups = json.loads(_lines(path)[0])["config"]["kv_cache_groups"]
    flipped = None if groups[0].get("prefill_checkpoint_alignment") else 1
    for change in ({"speculative_blocks": 1}, {"prefill_checkpoint_alignment": flipped}):
        result = replay(_changed(tmp_path, path, change), backend=backend, level="blocks")
        assert not result.identical, (change, path.name)
