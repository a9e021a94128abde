"""``ironbatch.simulate``: a workload through vLLM 0.33's scheduling (the
Rust core), on a step-time model's clock; the tables as NumPy columns."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ironbatch import _core
from ironbatch.simulation.load import load_workload
from ironbatch.simulation.settings import build_scheduler, parse_settings, resolve
from ironbatch.simulation.slo import parse_slo
from ironbatch.simulation.step_model import StepModel, load_step_model
from ironbatch.simulation.summary import format_summary, latencies, summarize
from ironbatch.simulation.workload import Workload

# The token every sampling row gets: lengths, not tokens, end requests.
SAMPLED_TOKEN = 5
# Settings an ironbatch-trace/1 header cannot describe, at their only value.
TRACE_FIXED = {
    "async_scheduling": False,
    "long_prefill_token_threshold_adaptive": False,
    "scheduler_reserve_full_isl": True,
    "max_num_scheduled_tokens": None,
    "max_num_active_seqs": None,
    "watermark": 0.0,
    "prefill_schedule_interval": 1,
}
REQUEST_COLUMNS = (
    "id", "arrival_s", "first_scheduled_s", "first_token_s", "finish_s", "ttft_s", "tpot_s",
    "e2e_s", "queue_s", "prompt_tokens", "output_tokens", "prefix_hit_tokens", "preemptions",
)  # fmt: skip


@dataclass
class SimulationResult:
    """A run's tables: ``requests`` (one row per request: times, latencies,
    tokens, prefix hits, preemptions), ``steps`` (one row per step: start,
    duration, tokens, queues, KV usage), ``decisions`` (with
    ``record_decisions``), and ``summary``; dicts of NumPy columns, so
    ``pandas.DataFrame(result.requests)`` works as is."""

    workload: str
    settings: dict[str, Any]
    step_model: str
    requests: dict[str, np.ndarray]
    steps: dict[str, np.ndarray]
    decisions: dict[str, np.ndarray]
    summary: dict[str, Any]
    #: Requests left out, and why (vLLM refuses a prompt of max_model_len
    #: or more; a reader skips failed rows).
    rejected: dict[str, int] = field(default_factory=dict)

    def table(self) -> str:
        return format_summary(self.summary, f"{self.workload} — {self.step_model}")

    def write(self, out_dir: str | os.PathLike[str], *, report: bool = False) -> list[Path]:
        """``requests.csv``, ``steps.csv``, ``summary.json`` (and with
        ``report``, ``report.html``) in ``out_dir``; returns the paths."""
        from ironbatch.simulation.report import write_report

        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        paths = [out / "requests.csv", out / "steps.csv", out / "summary.json"]
        write_csv(paths[0], self.requests, REQUEST_COLUMNS)
        write_csv(paths[1], self.steps, tuple(self.steps))
        paths[2].write_text(json.dumps(self.description(), indent=1, default=_json_default) + "\n")
        if report:
            paths.append(write_report(out / "report.html", [self]))
        return paths

    def description(self) -> dict[str, Any]:
        return {
            "workload": self.workload,
            "step_model": self.step_model,
            "settings": self.settings,
            "rejected": self.rejected,
            "summary": self.summary,
        }


def _json_default(v: Any) -> Any:
    if isinstance(v, np.generic):
        return v.item()
    raise TypeError(f"cannot write {type(v).__name__} as JSON")


def write_csv(path: Path, columns: Mapping[str, np.ndarray], names: Iterable[str]) -> None:
    names = list(names)
    cols = [columns[n] for n in names]
    with open(path, "w", encoding="utf-8") as f:
        f.write(",".join(names) + "\n")
        for row in zip(*(c.tolist() for c in cols), strict=True):
            f.write(",".join(_cell(v) for v in row) + "\n")


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return "" if v != v else repr(v)
    return str(v)


def simulate(
    workload: Workload | str | os.PathLike[str],
    *,
    config: Mapping[str, Any] | Iterable[str] | None = None,
    step_model: StepModel | str | os.PathLike[str] | None = None,
    speed: float = 1.0,
    start_s: float | None = None,
    end_s: float | None = None,
    max_requests: int | None = None,
    slo: str | Mapping[str, float] | None = None,
    record_steps: bool = True,
    record_decisions: bool = False,
    trace: str | os.PathLike[str] | None = None,
) -> SimulationResult:
    """Simulate ``workload`` (a Workload, a file, or ``synthetic:...``)
    under ``config`` (vLLM's scheduler settings, ``ironbatch.simulation.
    settings.KEYS``) on ``step_model``'s clock. ``speed`` scales the arrival
    rate; ``start_s``/``end_s``/``max_requests`` slice the workload (trace
    seconds, before scaling); ``slo`` bounds goodput; ``trace`` writes an
    ironbatch-trace/1 file of the run (synchronous scheduling only)."""
    w = workload if isinstance(workload, Workload) else load_workload(workload)
    rejected = dict(w.skipped)
    if start_s is not None or end_s is not None or max_requests is not None:
        w = w.sliced(start_s=start_s, end_s=end_s, max_requests=max_requests)
    w = w.at_speed(speed)
    if not len(w):
        raise ValueError(f"workload {w.name}: no requests to simulate")
    model = load_step_model(step_model)
    bounds = parse_slo(slo)
    prompts = w.prompt_tokens
    settings = resolve(
        parse_settings(config),
        longest_request=int((prompts + w.output_tokens).max()),
        kv_bytes_per_token=model.kv_bytes_per_token,
        kv_cache_bytes=model.kv_cache_bytes,
    )
    fits = prompts < settings["max_model_len"]
    if not fits.all():
        rejected["prompt of max_model_len tokens or more"] = int((~fits).sum())
        w = w.select(np.flatnonzero(fits))
        if not len(w):
            raise ValueError(
                f"every prompt is at least max_model_len ({settings['max_model_len']}) tokens"
            )
    if trace is not None:
        clash = {k: settings[k] for k, v in TRACE_FIXED.items() if settings[k] != v}
        if clash:
            raise ValueError(
                f"trace: an ironbatch-trace/1 file cannot describe {clash}; it needs "
                f"{ {k: TRACE_FIXED[k] for k in clash} }"
            )
    sched = build_scheduler(settings)
    core_workload = w.to_core()
    started = time.perf_counter()
    raw = _core.simulate(
        scheduler=sched.core,
        workload=core_workload,
        step_model=model.to_core(),
        sampled_token=SAMPLED_TOKEN,
        record_steps=record_steps,
        record_decisions=record_decisions,
        trace_path=None if trace is None else os.fspath(trace),
    )
    wall = time.perf_counter() - started
    requests = dict(raw["requests"])
    for key, values in latencies(requests).items():
        requests[f"{key}_s"] = values
    requests["id"] = np.array(w.ids, dtype=object)
    summary = summarize(
        requests, raw["steps"], num_steps=raw["num_steps"], slo=bounds, wall_s=wall
    )
    return SimulationResult(
        workload=w.name,
        settings=settings,
        step_model=model.description,
        requests=requests,
        steps=dict(raw["steps"]),
        decisions=dict(raw["decisions"]),
        summary=summary,
        rejected=rejected,
    )
