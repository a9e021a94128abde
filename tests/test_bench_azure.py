"""The Azure-trace benchmark's parts (benches/azure_replay.py): the CSV
reader, the synthetic trace generator, the prompts, and the lockstep replay
on the core and the Python twin (standing in for vLLM's scheduler). No
timing is checked, only that the replay runs and the decisions agree."""

from __future__ import annotations

import gc
import importlib.util
import io
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ironbatch.bench.azure_trace import (
    CONV_CONTEXT_QUANTILES,
    CONV_GENERATED_QUANTILES,
    CONV_RATE_PER_S,
    TraceRequest,
    fit_quantiles,
    read_trace,
    synthetic_trace,
    synthetic_trace_csv,
)
from ironbatch.bench.lockstep import (
    DivergenceError,
    Lane,
    core_decisions,
    core_lane,
    replay,
)
from ironbatch.bench.step_buckets import bucket_table
from ironbatch.bench.trace_workload import (
    arrival_steps,
    deployment,
    prompt_tokens,
    system_prompt,
    trace_request,
)

# The real trace, where a checkout has the shared data beside it.
CONV_TRACE = (
    Path(__file__).resolve().parents[2]
    / "shared/data/azure-llm-2023/AzureLLMInferenceTrace_conv.csv"
)

SMALL = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:50.9951690,396,109

2023-11-16 18:15:51.2224670,879,55
"""


def test_reader_parses_rows_from_a_file_object_and_a_path(tmp_path: Path) -> None:
    rows = read_trace(io.StringIO(SMALL))
    assert [(r.context_tokens, r.generated_tokens) for r in rows] == [
        (374, 44),
        (396, 109),
        (879, 55),
    ]
    assert [r.arrival_s for r in rows] == pytest.approx([0.0, 4.314579, 4.541877], abs=1e-9)
    path = tmp_path / "trace.csv"
    path.write_text(SMALL)
    assert read_trace(path) == rows
    assert read_trace(str(path)) == rows


def test_reader_takes_the_columns_in_any_order_and_ignores_others() -> None:
    text = "GeneratedTokens,Extra,TIMESTAMP,ContextTokens\n7,x,2023-11-16 18:00:00,5\n"
    assert read_trace(io.StringIO(text)) == [TraceRequest(0.0, 5, 7)]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (SMALL.replace("396,109", "39x,109"), r"line 3, column ContextTokens: .*'39x'"),
        (SMALL.replace("879,55", "879,-5"), r"line 5, column GeneratedTokens: .*'-5'"),
        (
            SMALL.replace("18:15:50.9951690", "18:15:50,9951690"),
            r"line 3, column 4: the row has 4 fields, the header 3",
        ),
        (SMALL.replace("2023-11-16 18:15:51", "2023-11-16 18:61:51"), r"line 5, column TIMESTAMP"),
        (SMALL.replace("18:15:51.2224670", "18:15:40.0"), r"line 5, column TIMESTAMP: .*earlier"),
        (SMALL.replace(",879,55", ",879"), r"line 5, column GeneratedTokens: the row has 2"),
        ("TIMESTAMP,ContextTokens,Generated\n", r"line 1, column GeneratedTokens: missing"),
        ("", r"line 1: empty file"),
    ],
)
def test_reader_names_the_line_and_column_of_bad_input(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as e:
        read_trace(io.StringIO(text))
    assert str(e.value).startswith("<csv>: line")  # the source's name first


def test_synthetic_trace_is_deterministic_and_shaped_like_the_conversation_trace() -> None:
    text = synthetic_trace_csv(4000, seed=7)
    assert text == synthetic_trace_csv(4000, seed=7)
    assert text != synthetic_trace_csv(4000, seed=8)
    assert text.splitlines()[1].startswith("2023-11-16 18:15:46.6805900,")
    rows = read_trace(io.StringIO(text))
    assert rows == synthetic_trace(4000, seed=7)
    context = statistics.median(r.context_tokens for r in rows)
    generated = statistics.median(r.generated_tokens for r in rows)
    assert context == pytest.approx(CONV_CONTEXT_QUANTILES[7], rel=0.1)  # 1,020
    assert generated == pytest.approx(CONV_GENERATED_QUANTILES[7], rel=0.1)  # 129
    p90 = fit_quantiles([r.context_tokens for r in rows])[11]
    assert p90 == pytest.approx(CONV_CONTEXT_QUANTILES[11], rel=0.15)
    rate = (len(rows) - 1) / rows[-1].arrival_s
    assert rate == pytest.approx(CONV_RATE_PER_S, rel=0.1)


@pytest.mark.skipif(not CONV_TRACE.exists(), reason="the Azure conversation trace is not here")
def test_hard_coded_quantiles_are_the_conversation_traces() -> None:
    rows = read_trace(CONV_TRACE)
    assert fit_quantiles([r.context_tokens for r in rows]) == CONV_CONTEXT_QUANTILES
    assert fit_quantiles([r.generated_tokens for r in rows]) == CONV_GENERATED_QUANTILES
    assert len(rows) / rows[-1].arrival_s == pytest.approx(CONV_RATE_PER_S, abs=0.01)


def test_prompts_share_system_prompts_and_fit_max_model_len() -> None:
    a, b = prompt_tokens(0, 600), prompt_tokens(6, 600)
    assert a[:200] == b[:200] == system_prompt(0).tolist()  # a system prompt,
    assert a[200] != b[200]  # then their own
    assert prompt_tokens(0, 100)[:50] == a[:50]  # at most half the prompt
    assert prompt_tokens(3, 50)[0] != prompt_tokens(7, 50)[0]  # no system prompt
    assert prompt_tokens(5, 600) == prompt_tokens(5, 600)
    r = trace_request(9, TraceRequest(1.5, 14_000, 900), max_model_len=8192, rate_scale=3.0)
    assert len(r.prompt_token_ids) == 8191
    assert r.sampling_params.max_tokens == 1 and r.sampling_params.ignore_eos
    assert r.request_id == "req-9" and r.arrival_time == 0.5
    rows = [TraceRequest(t, 1, 1) for t in (0.0, 0.03, 0.0301, 0.059, 0.2)]
    assert arrival_steps(rows, step_ms=30, rate_scale=1) == [0, 1, 2, 2, 7]
    assert arrival_steps(rows, step_ms=30, rate_scale=2) == [0, 1, 1, 1, 4]


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_lockstep_replay_core_and_twin_decide_alike(async_scheduling: bool) -> None:
    deploy = deployment(max_num_batched_tokens=2048, cache_blocks=2000)
    rows = synthetic_trace(60, seed=1)
    lanes = [
        core_lane(deploy, backend="python", async_scheduling=async_scheduling),
        core_lane(deploy, backend="rust", async_scheduling=async_scheduling),
    ]
    result = replay(lanes, rows, deployment=deploy, rate_scale=20.0, max_steps=30)
    assert len(result.scheduled) == 30 and max(result.scheduled) > 16
    assert result.requests_added > 20
    for lane in lanes:
        assert len(lane.wall_ns) == len(lane.cpu_ns) == 30
    table = bucket_table(result)
    assert table.splitlines()[0].startswith("| running | steps | clock | twin p50 (µs)")
    assert "| all | 30 | wall |" in table and "twin / core (p50)" in table


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_lockstep_replay_finishes_every_request(async_scheduling: bool) -> None:
    deploy = deployment(max_num_batched_tokens=2048, cache_blocks=2000)
    rows = [TraceRequest(t, 40, 3) for t in (0.0, 0.01, 5.0)]  # an idle gap
    lanes = [
        core_lane(deploy, backend=b, async_scheduling=async_scheduling) for b in ("python", "rust")
    ]
    result = replay(lanes, rows, deployment=deploy)
    assert result.finished and result.requests_added == 3
    # Four steps for the first two (a prefill, then 2 decodes, each), three
    # for the last; the idle steps between are skipped. Async scheduling
    # learns of the last tokens a step later (an empty step).
    if async_scheduling:
        assert result.scheduled == [1, 2, 2, 1, 0, 1, 1, 1, 0]
    else:
        assert result.scheduled == [1, 2, 2, 1, 1, 1, 1]
    assert result.last_step > 5 / 0.03


def test_lockstep_replay_reports_a_divergence() -> None:
    deploy = deployment(max_num_batched_tokens=2048, cache_blocks=2000)

    def off_by_one(out: Any) -> list[tuple[str, int]]:
        decided = core_decisions(out)
        return [(rid, n + (rid == "req-2")) for rid, n in decided]

    lanes = [
        core_lane(deploy, backend="rust", async_scheduling=False),
        core_lane(deploy, backend="rust", async_scheduling=False),
    ]
    lanes[1] = Lane("skewed", lanes[1].driver, off_by_one, interface="core")
    rows = [TraceRequest(0.0, 30, 4) for _ in range(3)]
    with pytest.raises(DivergenceError, match=r"step 0: skewed .*\(req-2: 30 vs 31\)"):
        replay(lanes, rows, deployment=deploy)


def test_a_replay_freezes_the_heap_it_starts_with_as_vllms_engine_does() -> None:
    """Collections during the replay skip what existed before it (as after
    vLLM's EngineCore start-up), and the heap is unfrozen after it."""
    deploy = deployment(max_num_batched_tokens=2048, cache_blocks=2000)
    lane = core_lane(deploy, backend="rust", async_scheduling=False)
    frozen_during: list[int] = []
    schedule = lane.driver.schedule

    def schedule_noting_the_frozen_heap() -> Any:
        frozen_during.append(gc.get_freeze_count())
        return schedule()

    lane.driver.schedule = schedule_noting_the_frozen_heap  # type: ignore[method-assign]
    assert gc.get_freeze_count() == 0
    replay([lane], [TraceRequest(0.0, 40, 3)], deployment=deploy)
    assert len(frozen_during) == 3 and min(frozen_during) > 0
    assert gc.get_freeze_count() == 0


class _Clock:
    """A fake clock: reading thread CPU time costs 1,000 ns, as a system
    call does; reading the wall clock costs nothing."""

    def __init__(self) -> None:
        self.now = 0

    def wall(self) -> int:
        return self.now

    def thread_cpu(self) -> int:
        self.now += 1_000
        return self.now


class _FixedCostDriver:
    """A driver whose calls take fixed fake times: schedule 100 ns, the
    model 10,000 ns (not timed), update 200 ns."""

    def __init__(self, clock: _Clock, async_scheduling: bool) -> None:
        self.clock = clock
        self.async_scheduling = async_scheduling
        self.pending: tuple[Any, Any] | None = None
        self.name = "fixed"

    def schedule(self) -> list[tuple[str, int]]:
        self.clock.now += 100
        return []

    def run_model(self, out: Any) -> None:
        self.clock.now += 10_000

    def update(self, out: Any, result: Any) -> None:
        self.clock.now += 200


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_a_lanes_wall_time_leaves_out_the_cost_of_reading_the_clocks(
    monkeypatch: pytest.MonkeyPatch, async_scheduling: bool
) -> None:
    """Only schedule() and update() are in a step's wall time: not the
    model, and not the CPU clock's own reads (system calls that cost more
    than a fast scheduler's step)."""
    clock = _Clock()
    monkeypatch.setattr("ironbatch.bench.lockstep.time.perf_counter_ns", clock.wall)
    monkeypatch.setattr("ironbatch.bench.lockstep.time.thread_time_ns", clock.thread_cpu)
    lane = Lane("fixed", _FixedCostDriver(clock, async_scheduling), lambda out: out, "core")  # type: ignore[arg-type]
    for _ in range(3):
        lane.step()
    # Async: the first step has no output to apply yet.
    assert lane.wall_ns == ([100, 300, 300] if async_scheduling else [300, 300, 300])
    assert all(cpu >= wall for cpu, wall in zip(lane.cpu_ns, lane.wall_ns, strict=True))


def test_the_script_replays_sync_and_async_in_one_run() -> None:
    """benches/azure_replay.py runs both modes and ends with one ratio table
    (the twin stands in for vLLM where vLLM is not installed)."""
    import ironbatch

    env = dict(os.environ, PYTHONPATH=str(Path(ironbatch.__file__).resolve().parents[1]))
    script = Path(__file__).resolve().parents[1] / "benches" / "azure_replay.py"
    args = ["--synthetic", "30", "--max-steps", "40", "--rate-scale", "8", "--lanes", "core"]
    if importlib.util.find_spec("vllm") is None:
        args = args[:-2]  # the twin and the core
    run = subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, env=env, check=True
    )
    out = run.stdout
    assert "sync scheduling: 40 steps" in out and "async scheduling: 40 steps" in out
    summary = out.split("speed-up on the first (sync, async):")[1]
    assert "| 1–16 |" in summary and "| 193–256 |" in summary
