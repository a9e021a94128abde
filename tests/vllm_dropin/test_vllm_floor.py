"""The object floor of benches/azure_replay.py (``--floor``): it must build
what vLLM's scheduler returned, equal and afresh (a shared container would
make the floor cheaper than any real scheduler could be), and replay in
lockstep with vLLM's scheduler, deciding as it did."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ironbatch.bench.azure_trace import synthetic_trace
from ironbatch.bench.lockstep import replay, vllm_lane
from ironbatch.bench.trace_workload import deployment
from ironbatch.bench.vllm_floor import (
    Recording,
    build_engine_core_outputs,
    build_scheduler_output,
    floor_lane,
    record,
)

ROWS = synthetic_trace(120, seed=3)
DEPLOY = deployment(max_num_batched_tokens=2048, cache_blocks=None)
STEPS = 150


@pytest.fixture(scope="module", params=["sync", "async"])
def rec(request: pytest.FixtureRequest) -> Recording:
    return record(
        ROWS,
        deployment=DEPLOY,
        async_scheduling=request.param == "async",
        step_ms=30.0,
        rate_scale=8.0,
        max_steps=STEPS,
    )


def _containers(so: Any) -> list[Any]:
    """Every container of a SchedulerOutput that a step fills in."""
    c = so.scheduled_cached_reqs
    found = [
        so.scheduled_new_reqs,
        so.num_scheduled_tokens,
        so.finished_req_ids,
        so.scheduled_spec_decode_tokens,
        c,
        c.req_ids,
        c.new_block_ids,
        c.num_computed_tokens,
        c.num_output_tokens,
        c.resumed_req_ids,
    ]
    for d in so.scheduled_new_reqs:
        found += [d, d.block_ids, *d.block_ids]
    for tables in c.new_block_ids:
        if tables is not None:
            found += [tables, *tables]
    return found


def test_the_recording_holds_admissions_decodes_and_finishes(
    rec: Recording,
) -> None:
    assert len(rec.outputs) == len(rec.unfinished) == STEPS
    assert any(so.scheduled_new_reqs for so in rec.outputs)
    assert any(
        any(b is not None for b in so.scheduled_cached_reqs.new_block_ids) for so in rec.outputs
    )
    assert any(
        o.finish_reason is not None for u in rec.updates for e in u.values() for o in e.outputs
    )


def test_scheduler_outputs_are_built_equal_and_afresh(rec: Recording) -> None:
    for so in rec.outputs:
        built = build_scheduler_output(so)
        assert built == so
        for mine, theirs in zip(_containers(built), _containers(so), strict=True):
            assert mine is not theirs, f"{type(theirs).__name__} shared with vLLM's output"


def test_engine_core_outputs_are_built_equal_and_afresh(rec: Recording) -> None:
    for update in rec.updates:
        built = build_engine_core_outputs(update)
        assert built == update
        for client, eco in update.items():
            mine = built[client]
            assert mine is not eco and mine.outputs is not eco.outputs
            assert mine.scheduler_stats is not eco.scheduler_stats
            for a, b in zip(mine.outputs, eco.outputs, strict=True):
                assert a is not b and a.new_token_ids is not b.new_token_ids
                if b.prefill_stats is not None:
                    assert a.prefill_stats is not b.prefill_stats


def test_the_floor_replays_in_lockstep_with_vllm(rec: Recording) -> None:
    lanes = [
        vllm_lane(DEPLOY, kind="vllm", async_scheduling=rec.async_scheduling),
        floor_lane(rec),
    ]
    # Diverging decisions or unfinished counts would raise DivergenceError.
    out = replay(lanes, ROWS, deployment=DEPLOY, rate_scale=8.0, max_steps=STEPS)
    assert len(out.scheduled) == STEPS
    assert len(lanes[1].wall_ns) == STEPS


def test_the_script_times_the_floor_beside_vllm() -> None:
    """``benches/azure_replay.py --floor`` records, then replays the floor
    beside the lanes asked for, in both modes, and reports its ratio."""
    script = Path(__file__).resolve().parents[2] / "benches" / "azure_replay.py"
    args = ["--synthetic", "30", "--max-steps", "40", "--rate-scale", "8"]
    run = subprocess.run(
        [sys.executable, str(script), *args, "--lanes", "vllm", "--floor"],
        capture_output=True,
        text=True,
        check=True,
    )
    out = run.stdout
    assert "sync scheduling: 40 steps" in out and "async scheduling: 40 steps" in out
    assert "(vLLM 0.33.0, floor)" in out
    summary = out.split("speed-up on the first (sync, async):")[1]
    assert summary.count("**vLLM 0.33.0 / floor**") == 2
