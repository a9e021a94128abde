"""``benches/record_vllm.py --connector``: traces recorded from vLLM 0.33's
scheduler with each connector, this run's seeds, replay identical at block
level on both backends (docs/trace-format.md §3.7), and a recorded answer
changed makes the replay differ at the call that got it."""

from __future__ import annotations

import importlib.util
import json
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from ironbatch.trace import replay

from seeded import Workloads

RECORDER = Path(__file__).resolve().parents[2] / "benches" / "record_vllm.py"
PER_RUN, FULL = 4, 16  # traces per connector


def recorder() -> ModuleType:
    spec = importlib.util.spec_from_file_location("record_vllm", RECORDER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write(path: Path, lines: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


@pytest.mark.parametrize("connector", ["standin", "nixl", "offloading"])
def test_recorded_connector_traces_replay_identical(
    tmp_path: Path, workloads: Workloads, connector: str
) -> None:
    record = recorder().record

    def run(seed: int) -> Counter:
        lines = record(seed, connector=connector)
        path = write(tmp_path / f"{connector}-{seed}.jsonl", lines)
        for backend in ("rust", "python"):
            result = replay(path, backend=backend)
            assert result.identical, f"seed {seed}, {backend}: {result}"
            assert result.steps == len(lines) - 1
        calls = [c for x in lines[1:] for c in x["connector_calls"]]
        return Counter(
            hits=sum(1 for c in calls if c[0] == "matched" and c[3]),
            finished=sum(1 for c in calls if c[0] == "finished"),
        )

    # Every connector engaged: external hits, and every request handed back
    # (more traces while a run's seeds have none: CPU offloading hits only
    # after a preemption).
    needs = {"hits": 1, "finished": 1}
    seen = workloads.run_covering(run, needs, PER_RUN, FULL, part=connector)
    assert seen["hits"] and seen["finished"], seen


def test_a_changed_answer_differs_at_its_call(tmp_path: Path) -> None:
    """The first async hit answered as no hit: the replay differs, and not
    before the step that asked."""
    lines = recorder().record(3, connector="nixl")
    step = next(
        i
        for i, x in enumerate(lines[1:])
        if any(c[0] == "matched" and c[3] for c in x["connector_calls"])
    )
    call = next(c for c in lines[1 + step]["connector_calls"] if c[0] == "matched" and c[3])
    call[3:] = [0, False]
    result = replay(write(tmp_path / "changed.jsonl", lines))
    assert not result.identical
    assert result.step is not None and result.step >= step, str(result)
