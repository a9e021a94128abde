"""Configuration sweeps: a grid of scheduler settings (``--sweep
key=v1,v2,...``, repeated: every combination), each point a simulation of
the same workload, run serially, in parallel processes, or as tasks on a Ray
cluster (``--ray ADDRESS``; Ray is the optional extra ``ray``). Every way
gives the same rows: a point's result depends on its settings alone."""

from __future__ import annotations

import itertools
import multiprocessing
import os
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ironbatch.simulation.progress import counting
from ironbatch.simulation.run import simulate
from ironbatch.simulation.settings import parse_settings
from ironbatch.simulation.step_model import StepModel
from ironbatch.simulation.sweep_table import format_rows, setting_text
from ironbatch.simulation.workload import Workload

# Points of each latency's CDF a point keeps, for the comparison report.
CDF_POINTS = 101
METRIC_COLUMNS = (
    "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms",
    "e2e_p50_ms", "e2e_p99_ms", "requests_per_s", "output_tokens_per_s", "goodput_per_s",
    "goodput_fraction", "preemptions", "prefix_hit_rate", "steps",
)  # fmt: skip
GOODPUT_COLUMNS = ("goodput_per_s", "goodput_fraction")


def parse_sweep(items: Iterable[str]) -> list[tuple[str, list[Any]]]:
    """``["key=v1,v2", ...]`` as ``[(key, [v1, v2]), ...]``, each value
    checked as ``--config`` checks it; a key twice is refused."""
    axes: list[tuple[str, list[Any]]] = []
    for item in items:
        key, sep, values = item.partition("=")
        key = key.strip()
        texts = [v for v in values.split(",") if v.strip()]
        if not sep or not texts:
            raise ValueError(f"--sweep {item}: expected KEY=V1,V2,... with at least one value")
        if key in (k for k, _ in axes):
            raise ValueError(f"sweep: {key} is swept twice")
        parsed = [parse_settings([f"{key}={v}"])[key] for v in texts]
        axes.append((key, parsed))
    return axes


def grid(axes: Sequence[tuple[str, Sequence[Any]]]) -> list[dict[str, Any]]:
    """Every combination, the last axis fastest."""
    keys = [k for k, _ in axes]
    combos = itertools.product(*(v for _, v in axes))
    return [dict(zip(keys, combo, strict=True)) for combo in combos]


@dataclass
class SweepPoint:
    """One point: its swept settings, the metrics row, the full summary and
    each latency's CDF (CDF_POINTS quantiles, seconds); or, for a point the
    scheduler cannot run, ``infeasible`` (why) and metrics of None."""

    swept: dict[str, Any]
    row: dict[str, Any]
    summary: dict[str, Any]
    cdf: dict[str, list[float]] = field(default_factory=dict)
    infeasible: str = ""


@dataclass
class SweepResult:
    workload: str
    step_model: str
    points: list[SweepPoint]
    #: Whether goodput bounds were given (else no goodput columns).
    slo: bool = False

    @property
    def columns(self) -> list[str]:
        """The metric columns: goodput's only with an SLO."""
        return [c for c in METRIC_COLUMNS if self.slo or c not in GOODPUT_COLUMNS]

    @property
    def swept_keys(self) -> list[str]:
        return list(self.points[0].swept) if self.points else []

    @property
    def rows(self) -> list[dict[str, Any]]:
        """One dict per point: the swept settings, the metrics, and
        ``infeasible`` (the reason, or "")."""
        return [p.swept | {c: p.row.get(c) for c in self.columns} | {"infeasible": p.infeasible}
                for p in self.points]  # fmt: skip

    @property
    def feasible(self) -> int:
        return sum(not p.infeasible for p in self.points)

    def table(self) -> str:
        return format_rows(self.swept_keys, self.rows, slo=self.slo)


def _row(summary: Mapping[str, Any]) -> dict[str, Any]:
    lat, t, g = summary["latency_s"], summary["throughput"], summary["goodput"]
    return {
        "ttft_p50_ms": lat["ttft"]["p50"] * 1e3,
        "ttft_p90_ms": lat["ttft"]["p90"] * 1e3,
        "ttft_p99_ms": lat["ttft"]["p99"] * 1e3,
        "tpot_p50_ms": lat["tpot"]["p50"] * 1e3,
        "tpot_p99_ms": lat["tpot"]["p99"] * 1e3,
        "e2e_p50_ms": lat["e2e"]["p50"] * 1e3,
        "e2e_p99_ms": lat["e2e"]["p99"] * 1e3,
        "requests_per_s": t["requests_per_s"],
        "output_tokens_per_s": t["output_tokens_per_s"],
        "goodput_per_s": g["requests_per_s"],
        "goodput_fraction": g["fraction"],
        "preemptions": summary["preemptions"],
        "prefix_hit_rate": summary["prefix_hit_rate"],
        "steps": summary["steps"],
    }


def run_point(
    workload: Workload,
    swept: dict[str, Any],
    base: Mapping[str, Any],
    options: Mapping[str, Any],
) -> SweepPoint:
    """One point of the grid (what every executor runs); a point the
    scheduler refuses is an infeasible one, with its reason."""
    try:
        result = simulate(workload, config={**base, **swept}, record_steps=False, **options)
    except ValueError as e:
        return SweepPoint(swept, dict.fromkeys(METRIC_COLUMNS), {}, {}, infeasible=str(e))
    qs = np.linspace(0, 100, CDF_POINTS)
    cdf = {}
    for key in ("ttft", "tpot", "e2e"):
        v = result.requests[f"{key}_s"]
        v = v[~np.isnan(v)]
        cdf[key] = np.percentile(v, qs).tolist() if len(v) else []
    return SweepPoint(swept, _row(result.summary), result.summary, cdf)


def run_sweep(
    workload: Workload,
    axes: Sequence[tuple[str, Sequence[Any]]],
    *,
    config: Mapping[str, Any] | Iterable[str] | None = None,
    step_model: StepModel | None = None,
    speed: float = 1.0,
    slo: Mapping[str, float] | None = None,
    jobs: int | None = None,
    ray_address: str | None = None,
    progress: bool = False,
) -> SweepResult:
    """Every point of the grid: serially (``jobs=1``), in ``jobs`` processes
    (default: one per CPU), or on the Ray cluster at ``ray_address``
    (``"local"`` starts one here); ``progress`` counts finished points on
    stderr."""
    from ironbatch.simulation.slo import parse_slo
    from ironbatch.simulation.step_model import load_step_model

    if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
        raise ValueError(f"jobs must be an integer >= 1 (processes for the sweep), got {jobs!r}")
    if not axes:
        raise ValueError("sweep: no settings to sweep")
    model = load_step_model(step_model)
    bounds = parse_slo(slo)
    base = parse_settings(config)
    overlap = sorted(set(base) & {k for k, _ in axes})
    if overlap:
        raise ValueError(f"sweep: {overlap} both set with --config and swept")
    points = grid(axes)
    options = {"step_model": model, "speed": speed, "slo": bounds}
    with counting(f"sweeping {len(points)} configurations", len(points), progress) as tick:
        if ray_address is not None:
            done = _on_ray(ray_address, workload, points, base, options)
        elif jobs == 1 or len(points) == 1:
            done = []
            for p in points:
                done.append(run_point(workload, p, base, options))
                tick()
        else:
            workers = min(len(points), jobs or os.cpu_count() or 1)
            context = multiprocessing.get_context("spawn")  # no inherited threads or locks
            with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
                futures = [pool.submit(run_point, workload, p, base, options) for p in points]
                for f in futures:
                    f.add_done_callback(lambda _: tick())
                done = [f.result() for f in futures]
    return SweepResult(workload.name, model.description, done, slo=bool(bounds))


def _on_ray(
    address: str,
    workload: Workload,
    points: list[dict[str, Any]],
    base: Mapping[str, Any],
    options: Mapping[str, Any],
) -> list[SweepPoint]:
    try:
        import ray
    except ImportError:
        raise ValueError(
            "--ray needs Ray: pip install 'ironbatch[ray]' (on every node of the cluster)"
        ) from None
    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    task = ray.remote(run_point)
    shared = ray.put(workload)  # sent to the cluster once
    return ray.get([task.remote(shared, p, base, options) for p in points])


def write_rows(path: str | os.PathLike[str], rows: Sequence[Mapping[str, Any]]) -> None:
    """The rows as CSV: every value as ``--config`` takes it, an undefined
    or infeasible metric empty."""
    names = list(rows[0]) if rows else []
    with open(path, "w", encoding="utf-8") as f:
        f.write(",".join(names) + "\n")
        for r in rows:
            f.write(",".join(_csv(r[n]) for n in names) + "\n")


def _csv(v: Any) -> str:
    if v is None or (isinstance(v, float) and v != v):
        return ""
    if isinstance(v, str):
        return '"' + v.replace('"', '""') + '"' if any(c in v for c in ',"\n') else v
    return setting_text(v)
