"""Hybrid KV-cache traces (docs/trace-format.md §3.6): the recorded ones
cover every layout with vLLM's groups and admission caps, record block ids
per group, and a replay without the groups, with another window, retention
or cap, or with a changed block id of one group, differs, on both backends.
(tests/test_trace_replay.py replays them all identical.)"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ironbatch.trace import TraceError, replay

from scheduler_helpers import BACKENDS

HYBRID = Path(__file__).parent / "data" / "recorded-hybrid"
TRACES = sorted(HYBRID.glob("*.jsonl*"))
# The layouts vLLM's engine groups these models' layers into: the number of
# groups and the kind of the groups before the last, full-attention one.
LAYOUTS = {"gpt-oss": (2, "sliding_window"), "gemma3": (6, "sliding_window")}
LAYOUTS["llama4"] = (4, "chunked_local")

Config = dict[str, Any]
Steps = list[dict[str, Any]]


def _lines(path: Path) -> list[str]:
    data = path.read_bytes()
    return (gzip.decompress(data) if path.suffix == ".gz" else data).decode().splitlines()


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _admission_cap(config: Config, group: dict[str, Any]) -> int:
    """vLLM 0.33's ``max_admission_blocks_per_request`` for a window or
    chunked group; the tokens in flight of a synchronous engine without
    speculation are one step's budget."""
    in_flight, bs = config["max_num_batched_tokens"], config["block_size"]
    if group["kind"] == "sliding_window":
        return _cdiv(min(group["size"] - 1 + in_flight, config["max_model_len"]), bs) + 1
    return _cdiv(min(group["size"] + in_flight, config["max_model_len"]), bs)


def test_each_layout_is_recorded_with_vllms_groups() -> None:
    """Every layout's traces are there (several, one big), most with prefix
    caching, some with a tight cache and preemptions, both retentions; each
    header carries the layout's groups with vLLM's admission caps, and every
    scheduled entry one block list per group."""
    by_layout: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for path in TRACES:
        lines = _lines(path)
        header = json.loads(lines[0])
        layout, config = header["kv_layout"], header["config"]
        assert path.name.removeprefix("big-").startswith(layout + "-"), path.name
        groups = config["kv_cache_groups"]
        num_groups, kind = LAYOUTS[layout]
        assert [g["kind"] for g in groups] == [kind] * (num_groups - 1) + ["full"], path.name
        assert len({json.dumps(g) for g in groups[:-1]}) == 1, path.name  # alike groups
        for g in groups[:-1]:
            assert g["admission_cap_blocks"] == _admission_cap(config, g), path.name
        steps = [json.loads(x) for x in lines[1:]]
        entries = [e for s in steps for e in s["schedule"]["scheduled"]]
        assert all(len(e[4]) == num_groups for e in entries), path.name
        # The groups grow alike: every group's list has the same length.
        assert all(len({len(ids) for ids in e[4]}) == 1 for e in entries), path.name
        per_group = (config["num_blocks"] - 1) // num_groups
        by_layout[layout].append(
            {
                "big": path.name.startswith("big-"),
                "caching": config["enable_prefix_caching"],
                "sparse": config["sparse_retention"],
                "tight": per_group <= 3 * _cdiv(config["max_model_len"], config["block_size"]),
                "preempted": sum(len(s["schedule"]["preempted"]) for s in steps),
                # Admissions whose prefix hit the window group reads in part.
                "window_hits": sum(e[2] != "running" and 0 in e[4][0] for e in entries),
                "window_crossings": max(
                    len(r["prompt_token_ids"]) // groups[0]["size"] for s in steps for r in s["add"]
                ),
            }
        )
    assert set(by_layout) == set(LAYOUTS)
    for layout, traces in by_layout.items():
        assert len(traces) >= 4 and any(t["big"] for t in traces), layout
        assert sum(t["caching"] for t in traces) > len(traces) // 2, layout
        assert any(t["tight"] and t["preempted"] for t in traces), layout
        assert sum(t["window_hits"] for t in traces) > 0, layout
    windows = by_layout["gpt-oss"] + by_layout["gemma3"]
    assert {t["sparse"] for t in windows} == {True, False}
    # Long prompts that cross the window many times.
    assert sum(t["window_crossings"] >= 30 for t in windows) >= 2


def _edited(tmp_path: Path, name: str, edit: Callable[[Config, Steps], None]) -> Path:
    """A copy of the recorded trace ``name`` with ``edit`` applied to its
    config and step lines."""
    lines = _lines(HYBRID / name)
    header = json.loads(lines[0])
    steps = [json.loads(x) for x in lines[1:]]
    edit(header["config"], steps)
    out = tmp_path / f"edited-{name}"
    out.write_text("\n".join(json.dumps(x) for x in [header, *steps]) + "\n")
    return out


def _without_groups(config: Config, steps: Steps) -> None:
    del config["kv_cache_groups"], config["sparse_retention"]


def _flat_block_ids(config: Config, steps: Steps) -> None:
    """The groups gone and the block ids those of full attention: what a
    one-group recording's shape would be."""
    _without_groups(config, steps)
    for s in steps:
        for e in s["schedule"]["scheduled"]:
            e[4] = e[4][-1]


def _window_plus(tokens: Callable[[Config], int]) -> Callable[[Config, Steps], None]:
    def edit(config: Config, steps: Steps) -> None:
        for g in config["kv_cache_groups"]:
            if g["kind"] != "full":
                g["size"] += tokens(config)

    return edit


def _flip_retention(config: Config, steps: Steps) -> None:
    config["sparse_retention"] = not config["sparse_retention"]


def _without_caps(config: Config, steps: Steps) -> None:
    for g in config["kv_cache_groups"]:
        g.pop("admission_cap_blocks", None)


# (trace, edit, level, the step that differs): each setting changes what
# vLLM decided, or at least which blocks it used. Without its groups even a
# trace whose block ids are reshaped to full attention's differs at its first
# admission: alone, full attention takes the blocks the window group took.
SETTINGS = {
    "no groups": ("gpt-oss-0728.jsonl", _without_groups, "decisions", 1),
    "no groups, flat block ids": ("gpt-oss-0728.jsonl", _flat_block_ids, "blocks", 0),
    "window + 1": ("gpt-oss-0728.jsonl", _window_plus(lambda c: 1), "decisions", 3),
    "gemma3 window + 1": ("gemma3-0767.jsonl", _window_plus(lambda c: 1), "decisions", 10),
    "chunk + a block": ("llama4-0819.jsonl", _window_plus(lambda c: c["block_size"]), "blocks", 1),
    "dense retention": ("gpt-oss-0728.jsonl", _flip_retention, "blocks", 3),
    "sparse retention": ("gemma3-0767.jsonl", _flip_retention, "decisions", 5),
    "no admission caps": ("gpt-oss-0706.jsonl", _without_caps, "decisions", 23),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("setting", SETTINGS)
def test_the_groups_settings_matter(tmp_path: Path, backend: str, setting: str) -> None:
    name, edit, level, step = SETTINGS[setting]
    assert replay(HYBRID / name, backend=backend, level=level).identical
    result = replay(_edited(tmp_path, name, edit), backend=backend, level=level)
    assert (result.step, result.field) == (step, "scheduled"), str(result)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_block_ids_are_compared_per_group(tmp_path: Path, backend: str) -> None:
    """The groups as one flat list are not a match (the shape is compared
    too), nor is one changed id of the window group, found at block level
    only."""
    name = "gpt-oss-0705.jsonl"
    steps = [json.loads(x) for x in _lines(HYBRID / name)[1:]]
    i, j = next(
        (i, j)
        for i, s in enumerate(steps)
        for j, e in enumerate(s["schedule"]["scheduled"])
        if e[2] == "new" and e[4][0]
    )

    def change_one_id(config: Config, steps: Steps) -> None:
        window_ids = steps[i]["schedule"]["scheduled"][j][4][0]
        window_ids[-1] = config["num_blocks"] + 1  # no such block

    path = _edited(tmp_path, name, change_one_id)
    result = replay(path, backend=backend)
    assert (result.step, result.field) == (steps[i]["step"], "scheduled"), str(result)
    assert result.expected[j][4][1] == result.actual[j][4][1]  # full attention's agree
    assert result.expected[j][4][0] != result.actual[j][4][0]
    assert replay(path, backend=backend, level="decisions").identical

    def flatten_one_entry(config: Config, steps: Steps) -> None:
        entry = steps[i]["schedule"]["scheduled"][j]
        entry[4] = [b for ids in entry[4] for b in ids]

    result = replay(_edited(tmp_path, name, flatten_one_entry), backend=backend)
    assert (result.step, result.field) == (steps[i]["step"], "scheduled"), str(result)


@pytest.mark.parametrize(
    ("groups", "match"),
    [
        ({"kind": "full"}, "kv_cache_groups must be a list"),
        (["full"], r"kv_cache_groups\[0\] must be an object"),
        ([{"kind": "recurrent"}, {"kind": "full"}], "kind"),
        ([{"kind": "mamba"}, {"kind": "full"}], "size"),
        ([{"kind": "mamba", "size": 128, "speculative_blocks": -1}], "speculative_blocks"),
        ([{"kind": "sliding_window"}, {"kind": "full"}], "size"),
        ([{"kind": "full", "admission_cap_blocks": 3}], "admission_cap_blocks"),
        ([], "kv_cache_groups"),
    ],
)
def test_bad_groups_are_refused(tmp_path: Path, groups: Any, match: str) -> None:
    """A header whose groups the scheduler cannot take is the header line's
    TraceError, naming the file and the field."""

    def edit(config: Config, steps: Steps) -> None:
        config["kv_cache_groups"] = groups

    path = _edited(tmp_path, "gpt-oss-0728.jsonl", edit)
    with pytest.raises(TraceError, match=match) as refused:
        replay(path)
    assert str(refused.value).startswith(f"{path}: line 1: the header's config: ")


def test_one_group_keeps_the_flat_shape(tmp_path: Path) -> None:
    """A list of one full-attention group is the default: an old trace
    with it added replays as before, its block ids flat."""
    old = Path(__file__).parent / "data" / "recorded" / "recorded-0102.jsonl"
    lines = old.read_text().splitlines()
    header = json.loads(lines[0])
    header["config"]["kv_cache_groups"] = [{"kind": "full"}]
    out = tmp_path / "one-group.jsonl"
    out.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    result = replay(out)
    assert result.identical and result.steps == len(lines) - 1, str(result)
