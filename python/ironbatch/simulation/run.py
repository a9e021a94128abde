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
from ironbatch.simulation import feasibility
from ironbatch.simulation.load import load_workload
from ironbatch.simulation.out_dir import check_out_dir, check_out_file, writing
from ironbatch.simulation.progress import elapsed as progress_bar
from ironbatch.simulation.settings import build_scheduler, parse_settings, resolve
from ironbatch.simulation.slo import parse_slo
from ironbatch.simulation.step_model import StepModel, load_step_model
from ironbatch.simulation.summary import format_summary, json_ready, latencies, summarize
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
        ``report``, ``report.html``) in ``out_dir`` (made if missing; a
        ValueError naming it if it is a file or cannot be written); returns
        the paths."""
        from ironbatch.simulation.report import write_report

        out = check_out_dir(out_dir)
        with writing(out):
            out.mkdir(parents=True, exist_ok=True)
            paths = [out / "requests.csv", out / "steps.csv", out / "summary.json"]
            write_csv(paths[0], self.requests, REQUEST_COLUMNS)
            write_csv(paths[1], self.steps, tuple(self.steps))
            paths[2].write_text(self.json(indent=1) + "\n", encoding="utf-8")
            if report:
                paths.append(write_report(out / "report.html", [self]))
        return paths

    def description(self) -> dict[str, Any]:
        """The run's settings and summary, JSON-ready: an undefined value
        (the TPOT of one-token requests) is None, never NaN."""
        return json_ready({
            "workload": self.workload,
            "step_model": self.step_model,
            "settings": self.settings,
            "rejected": self.rejected,
            "summary": self.summary,
        })  # fmt: skip

    def json(self, indent: int | None = None) -> str:
        """``description()`` as strict JSON (no NaN or Infinity)."""
        return json.dumps(self.description(), indent=indent, allow_nan=False)


def write_csv(path: Path, columns: Mapping[str, np.ndarray], names: Iterable[str]) -> None:
    names = list(names)
    cols = [columns[n] for n in names]
    with open(path, "w", encoding="utf-8") as f:
        f.write(",".join(names) + "\n")
        for row in zip(*(c.tolist() for c in cols), strict=True):
            f.write(",".join(csv_cell(v) for v in row) + "\n")


def csv_cell(v: Any) -> str:
    """A CSV cell: a float in full (``repr``), NaN as empty."""
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
    progress: bool = False,
) -> SimulationResult:
    """Simulate ``workload`` (a Workload, a file, ``sample`` or
    ``synthetic:...``) under ``config`` (vLLM's scheduler settings,
    ``ironbatch.simulation.settings.KEYS``) on ``step_model``'s clock.
    ``speed`` scales the arrival rate; ``start_s``/``end_s``/``max_requests``
    slice the workload (trace seconds, before scaling); ``slo`` bounds
    goodput; ``trace`` writes an ironbatch-trace/1 file of the run
    (synchronous scheduling only); ``progress`` shows the seconds so far on
    stderr. Bad input of any kind is a ValueError or TypeError naming the
    argument, before anything runs or is written."""
    for name, flag in (("record_steps", record_steps), ("record_decisions", record_decisions),
                       ("progress", progress)):  # fmt: skip
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be True or False, got {flag!r}")
    w = load_workload(workload)
    rejected = dict(w.skipped)
    if start_s is not None or end_s is not None or max_requests is not None:
        w = w.sliced(start_s=start_s, end_s=end_s, max_requests=max_requests)
    w = w.at_speed(speed)
    if not len(w):
        raise ValueError(f"workload {w.name}: no requests to simulate")
    model = load_step_model(step_model)
    bounds = parse_slo(slo)
    given = parse_settings(config)
    w.to_core()  # the columns' structure checked before they are read here
    prompts = w.prompt_tokens
    longest = int(np.argmax(prompts + w.output_tokens))
    settings = resolve(
        given,
        longest_request=int(prompts[longest] + w.output_tokens[longest]),
        kv_bytes_per_token=model.kv_bytes_per_token,
        kv_cache_bytes=model.kv_cache_bytes,
    )
    notes = feasibility.origins(
        given,
        settings,
        longest=f"request {w.ids[longest]}: {int(prompts[longest]):,} prompt + "
        f"{int(w.output_tokens[longest]):,} output tokens",
        kv_bytes_per_token=model.kv_bytes_per_token,
        kv_cache_bytes=model.kv_cache_bytes,
    )
    fits = prompts < settings["max_model_len"]
    if not fits.all():
        rejected["prompt of max_model_len tokens or more"] = int((~fits).sum())
        w = w.select(np.flatnonzero(fits))
        if not len(w):
            raise ValueError(
                f"every prompt is at least max_model_len ({settings['max_model_len']:,}) tokens"
            )
    if trace is not None:
        clash = {k: settings[k] for k, v in TRACE_FIXED.items() if settings[k] != v}
        if clash:
            fixes = [f"--config {k}={_setting(TRACE_FIXED[k])}" if TRACE_FIXED[k] is not None
                     else f"leave {k} unset" for k in clash]  # fmt: skip
            raise ValueError(
                f"trace: an ironbatch-trace/1 file records synchronous scheduling only, and "
                f"cannot describe {', '.join(f'{k}={_setting(v)}' for k, v in clash.items())}; "
                f"add {' and '.join(fixes)} (in Python: the same keys in config=)"
            )
        check_out_file(trace, what="trace")
    feasibility.check_kv(settings, given, notes, model.kv_bytes_per_token)
    try:
        sched = build_scheduler(settings)
    except ValueError as e:
        raise ValueError(feasibility.explain(str(e), given, notes)) from None
    core_workload = w.to_core()
    started = time.perf_counter()
    with progress_bar(f"simulating {len(w):,} requests", progress):
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
    if not np.isfinite(requests["finish_s"][~np.isnan(requests["finish_s"])]).all():
        raise ValueError(
            f"step model {model.description}: the simulated clock overflowed (a step took "
            "longer than a float holds); its coefficients are too large"
        )
    for key, values in latencies(requests).items():
        requests[f"{key}_s"] = values
    requests["id"] = np.array(w.ids, dtype=object)
    summary = summarize(requests, raw["steps"], num_steps=raw["num_steps"], slo=bounds, wall_s=wall)
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


def _setting(v: Any) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)
