"""A run's summary: latency percentiles, throughput, goodput under SLOs,
the scheduler's counts; and the table the terminal shows."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from ironbatch.simulation.slo import meets

PERCENTILES = (50, 90, 99)
LATENCIES = ("ttft", "tpot", "e2e", "queue")


def latencies(requests: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Per request: TTFT, TPOT (mean time between output tokens after the
    first; NaN with one token), end-to-end and queue time, in seconds."""
    arrival = requests["arrival_s"]
    first = requests["first_token_s"]
    finish = requests["finish_s"]
    out = requests["output_tokens"].astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(out > 1, (finish - first) / (out - 1), np.nan)
    return {
        "ttft": first - arrival,
        "tpot": tpot,
        "e2e": finish - arrival,
        "queue": requests["first_scheduled_s"] - arrival,
    }


def _stats(values: np.ndarray) -> dict[str, float]:
    v = values[~np.isnan(values)]
    if not len(v):
        return {"mean": float("nan"), **{f"p{p}": float("nan") for p in PERCENTILES}}
    qs = np.percentile(v, PERCENTILES)
    out = {"mean": float(v.mean())}
    out.update({f"p{p}": float(q) for p, q in zip(PERCENTILES, qs, strict=True)})
    return out


def summarize(
    requests: Mapping[str, np.ndarray],
    steps: Mapping[str, np.ndarray],
    *,
    num_steps: int,
    slo: Mapping[str, float],
    wall_s: float,
) -> dict[str, Any]:
    """The summary as a flat-ish dict (JSON-ready)."""
    lat = latencies(requests)
    done = ~np.isnan(requests["finish_s"])
    n = len(done)
    arrival = requests["arrival_s"]
    end = float(np.nanmax(requests["finish_s"])) if done.any() else 0.0
    span = max(end - (float(arrival[0]) if n else 0.0), 1e-12)
    prompt = requests["prompt_tokens"].astype(np.float64)
    output = requests["output_tokens"].astype(np.float64)
    good = meets(lat, slo) & done if slo else done
    summary: dict[str, Any] = {
        "requests": n,
        "finished": int(done.sum()),
        "simulated_s": span,
        "steps": int(num_steps),
        "wall_s": wall_s,
        "speed_x": span / wall_s if wall_s > 0 else float("inf"),
        "throughput": {
            "requests_per_s": float(done.sum()) / span,
            "output_tokens_per_s": float(output[done].sum()) / span,
            "total_tokens_per_s": float((prompt + output)[done].sum()) / span,
        },
        "latency_s": {key: _stats(lat[key][done]) for key in LATENCIES},
        "goodput": {
            "slo": dict(slo),
            "requests_per_s": float(good.sum()) / span,
            "fraction": float(good.sum()) / n if n else float("nan"),
        },
        "prefix_hit_rate": float(requests["prefix_hit_tokens"].sum() / max(prompt.sum(), 1)),
        "preemptions": int(requests["preemptions"].sum()),
    }
    if len(steps.get("num_scheduled_reqs", ())):
        summary["mean_batch_requests"] = float(np.mean(steps["num_scheduled_reqs"]))
        summary["peak_kv_usage"] = float(np.max(steps["kv_usage"]))
    return summary


def json_ready(obj: Any) -> Any:
    """``obj`` as strict JSON takes it: NumPy scalars as Python numbers, NaN
    and infinities as None (JSON has neither), tuples as lists."""
    if isinstance(obj, Mapping):
        return {str(k): json_ready(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_ready(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return [json_ready(v) for v in obj.tolist()]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def _ms(v: float | None) -> str:
    return "-" if v is None or v != v else f"{v * 1e3:,.1f}"


COLUMNS = ("mean", "p50", "p90", "p99")


def format_summary(summary: Mapping[str, Any], title: str = "") -> str:
    """The terminal table: latencies in ms (each column as wide as its
    widest value), then throughput and goodput."""
    lines = [title] if title else []
    cells = {k: [_ms(summary["latency_s"][k][c]) for c in COLUMNS] for k in LATENCIES}
    widths = [max(len(h), *(len(cells[k][i]) for k in LATENCIES)) for i, h in enumerate(COLUMNS)]
    lines.append("ms   " + "".join(f"  {h:>{w}}" for h, w in zip(COLUMNS, widths, strict=True)))
    for key in LATENCIES:
        row = "".join(f"  {v:>{w}}" for v, w in zip(cells[key], widths, strict=True))
        lines.append(f"{key.upper():<5}{row}")
    t = summary["throughput"]
    g = summary["goodput"]
    lines.append(
        f"{summary['finished']:,} of {summary['requests']:,} requests in "
        f"{summary['simulated_s']:,.1f} simulated s ({summary['steps']:,} steps): "
        f"{t['requests_per_s']:,.2f} req/s, {t['output_tokens_per_s']:,.0f} output tok/s, "
        f"{t['total_tokens_per_s']:,.0f} total tok/s"
    )
    if g["slo"]:
        bounds = ", ".join(f"{k} <= {v * 1e3:g} ms" for k, v in g["slo"].items())
        lines.append(
            f"goodput ({bounds}): {g['requests_per_s']:,.2f} req/s, "
            f"{g['fraction'] * 100:.1f}% of requests"
        )
    lines.append(
        f"prefix-cache hits {summary['prefix_hit_rate'] * 100:.1f}% of prompt tokens, "
        f"{summary['preemptions']:,} preemptions"
        + (
            f", peak KV usage {summary['peak_kv_usage'] * 100:.1f}%"
            if "peak_kv_usage" in summary
            else ""
        )
    )
    lines.append(
        f"simulated {summary['simulated_s']:,.1f} s in {summary['wall_s']:,.2f} s of wall time "
        f"({summary['speed_x']:,.0f}x real time)"
    )
    return "\n".join(lines)
