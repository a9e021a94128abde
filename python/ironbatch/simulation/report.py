"""``--report``: one self-contained HTML page (no network: the data, the
styles and a hand-written canvas renderer are inline) with the summary, a
timeline of running and waiting requests and KV-cache usage, latency CDFs,
and a per-request Gantt strip (queued, prefill, decode) that zooms and pans
in time and in requests; for a sweep, the table and every configuration's
CDFs overlaid. The page template is ``report_page.html`` beside this file."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from ironbatch.simulation.summary import json_ready

# Above these, the page gets a thinned copy (said on the page).
MAX_STEP_POINTS = 20_000
MAX_REQUESTS = 20_000
CDF_POINTS = 201


def _clean(values: np.ndarray, digits: int = 5) -> list[float | None]:
    """Rounded floats with None for NaN (JSON has no NaN)."""
    out = np.round(np.asarray(values, dtype=np.float64), digits).tolist()
    return [None if isinstance(v, float) and math.isnan(v) else v for v in out]


def _steps(steps: dict[str, np.ndarray]) -> dict[str, list[Any]]:
    start = steps.get("start_s", np.zeros(0))
    idx = np.arange(len(start))
    if len(start) > MAX_STEP_POINTS:
        # Bucket by time, keeping each bucket's busiest step (peaks stay).
        edges = np.linspace(start[0], start[-1], MAX_STEP_POINTS + 1)
        bucket = np.clip(np.searchsorted(edges, start, side="right") - 1, 0, MAX_STEP_POINTS - 1)
        busiest = {}
        for i, b in zip(idx.tolist(), bucket.tolist(), strict=True):
            if b not in busiest or steps["num_running"][i] > steps["num_running"][busiest[b]]:
                busiest[b] = i
        idx = np.array(sorted(busiest.values()), dtype=np.int64)
    return {
        "t": _clean(start[idx]),
        "running": steps["num_running"][idx].tolist() if len(idx) else [],
        "waiting": steps["num_waiting"][idx].tolist() if len(idx) else [],
        "kv": _clean(steps["kv_usage"][idx], 4) if len(idx) else [],
    }


def _cdf(values: np.ndarray) -> list[float | None]:
    v = values[~np.isnan(values)]
    return _clean(np.percentile(v, np.linspace(0, 100, CDF_POINTS))) if len(v) else []


def _run(result: Any) -> dict[str, Any]:
    r = result.requests
    n = len(r["arrival_s"])
    rows = np.arange(n)
    note = ""
    if n > MAX_REQUESTS:
        rows = np.linspace(0, n - 1, MAX_REQUESTS).round().astype(np.int64)
        note = (
            f"{MAX_REQUESTS:,} of {n:,} requests shown (about 1 in {n / MAX_REQUESTS:,.0f}, "
            "evenly spaced in arrival order)"
        )
    return {
        "name": result.workload,
        "summary": result.summary,
        "steps": _steps(result.steps),
        "requests": {
            "id": [str(x) for x in r["id"][rows].tolist()],
            "arrival": _clean(r["arrival_s"][rows]),
            "scheduled": _clean(r["first_scheduled_s"][rows]),
            "first": _clean(r["first_token_s"][rows]),
            "finish": _clean(r["finish_s"][rows]),
        },
        "requests_note": note,
        "cdf": {k: _cdf(r[f"{k}_s"]) for k in ("ttft", "tpot", "e2e")},
    }


def _settings_line(settings: dict[str, Any]) -> str:
    keys = ("max_num_seqs", "max_num_batched_tokens", "num_blocks", "block_size",
            "max_model_len", "async_scheduling", "enable_prefix_caching")  # fmt: skip
    return ", ".join(f"{k}={settings[k]}" for k in keys if k in settings)


def render(payload: dict[str, Any]) -> str:
    template = resources.files("ironbatch.simulation").joinpath("report_page.html").read_text()
    data = json.dumps(payload, separators=(",", ":"), allow_nan=False, default=_default)
    # Inside <script type="application/json">: only "</" could end it early.
    return template.replace("/*DATA*/", data.replace("</", "<\\/"))


def _default(v: Any) -> Any:
    if isinstance(v, np.generic):
        return v.item()
    raise TypeError(f"cannot write {type(v).__name__} into the report")


def write_report(path: str | Path, results: Sequence[Any]) -> Path:
    """The page for one run (``results[0]``)."""
    result = results[0]
    payload = {
        "title": f"ironbatch simulate: {result.workload}",
        "subtitle": f"{result.step_model} — {_settings_line(result.settings)}",
        "runs": [json_ready(_run(r)) for r in results],
        "sweep": None,
    }
    out = Path(path)
    out.write_text(render(payload), encoding="utf-8")
    return out


def write_sweep_report(path: str | Path, sweep: Any) -> Path:
    """The page for a sweep: its table (an infeasible point's reason in its
    row) and every feasible point's CDFs."""
    from ironbatch.simulation.sweep_table import setting_text

    swept = sweep.swept_keys
    columns = swept + sweep.columns
    rows = []
    for r in sweep.rows:
        row = {k: setting_text(r[k]) for k in swept} | {c: r[c] for c in sweep.columns}
        rows.append(row | {"infeasible": r["infeasible"]})
    runs = [
        {"name": ", ".join(f"{k}={setting_text(p.swept[k])}" for k in swept),
         "summary": p.summary, "cdf": p.cdf}
        for p in sweep.points if not p.infeasible
    ]  # fmt: skip
    payload = {
        "title": f"ironbatch simulate --sweep: {sweep.workload}",
        "subtitle": sweep.step_model,
        "runs": json_ready(runs),
        "sweep": {"columns": columns, "swept": swept, "rows": json_ready(rows)},
    }
    out = Path(path)
    out.write_text(render(payload), encoding="utf-8")
    return out
