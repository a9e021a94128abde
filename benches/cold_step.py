"""A steady decode step with warm caches and with cold ones: the floor under
the per-step ratios of `benches/azure_replay.py`.

In the lockstep replay each scheduler's step runs right after the others',
so it starts with its code and data evicted from the L1 and L2 caches. This
benchmark separates that cost from the work: N requests are added and
prefilled, then every timed step is preceded (cold) or not (warm) by a read
of a buffer larger than L2, and the median and p90 of `schedule()` +
`update_from_output()` are reported per scheduler. The core and vLLM's own
scheduler run alone, one after the other; the drop-in too when vLLM is
installed.

    python benches/cold_step.py [--running 1,8,64,256,1024] [--steps 2000]
                                [--evict-kib 2048] [--async-scheduling]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(var, "1")

import numpy as np  # noqa: E402

from ironbatch.bench.scheduler_steps import IronbatchDriver, TimedDriver, Workload  # noqa: E402


def drivers(async_scheduling: bool) -> dict[str, Callable[[Workload], TimedDriver]]:
    """The schedulers to time, by name: the core always, the drop-in and
    vLLM's own when vLLM is importable."""
    out: dict[str, Callable[[Workload], TimedDriver]] = {
        "core": lambda w: IronbatchDriver(w, "rust", async_scheduling),
    }
    try:
        from ironbatch.bench.vllm_driver import VllmDriver
    except ImportError:
        return out
    out["drop-in"] = lambda w: VllmDriver(w, "ironbatch", async_scheduling)
    out["vLLM"] = lambda w: VllmDriver(w, "vllm", async_scheduling)
    return out


def steady(make: Callable[[Workload], TimedDriver], running: int) -> TimedDriver:
    """A driver with `running` requests prefilled and decoding."""
    w = Workload(f"decode-{running}", max(running, 1), 8192, running, 32)
    d = make(w)
    for i in range(running):
        d.add(w.request(i))
    for _ in range(10_000):
        d.step()
        if d.is_steady():
            break
    for _ in range(20):
        d.step()
    return d


def timed_steps(d: TimedDriver, steps: int, evict: np.ndarray | None) -> list[float]:
    """Per-step seconds; each step after a read of `evict` when given."""
    times = []
    sink = 0
    for _ in range(steps):
        if evict is not None:
            sink += int(evict.sum())  # a read of every line: L1 and L2 hold none of the step's
        times.append(d.step())
    return times


def p90(xs: list[float]) -> float:
    return sorted(xs)[int(0.9 * (len(xs) - 1))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--running", default="1,8,64,256,1024", help="running requests, comma-separated"
    )
    ap.add_argument("--steps", type=int, default=2000, help="timed steps per case")
    ap.add_argument(
        "--evict-kib", type=int, default=2048, help="buffer read before a cold step (KiB)"
    )
    ap.add_argument("--async-scheduling", action="store_true")
    a = ap.parse_args()
    evict = np.ones(a.evict_kib * 1024 // 8, dtype=np.int64)
    makers = drivers(a.async_scheduling)
    results: dict[tuple[str, int], dict[str, list[float]]] = {}
    for n in (int(x) for x in a.running.split(",")):
        for name, make in makers.items():
            t0 = time.perf_counter()
            d = steady(make, n)
            # Warm and cold in alternating blocks, so drift hits both.
            warm: list[float] = []
            cold: list[float] = []
            block = max(a.steps // 10, 1)
            for _ in range(10):
                warm += timed_steps(d, block, None)
                cold += timed_steps(d, block, evict)
            results[(name, n)] = {"warm": warm, "cold": cold}
            print(f"{name} {n} running: {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    print(
        f"# {platform.processor() or platform.machine()}, Python {platform.python_version()}, "
        f"{a.steps} steps a case, cold = after reading {a.evict_kib} KiB, "
        f"{'async' if a.async_scheduling else 'sync'} scheduling"
    )
    names = list(makers)
    head = ["running"]
    for name in names:
        head += [f"{name} warm (p90)", f"{name} cold (p90)"]
    if "vLLM" in makers:
        head += [f"vLLM / {name} cold" for name in names if name != "vLLM"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for n in sorted({n for _, n in results}):
        row: list[Any] = [n]
        med: dict[str, float] = {}
        for name in names:
            r = results[(name, n)]
            for kind in ("warm", "cold"):
                m = statistics.median(r[kind]) * 1e6
                row.append(f"{m:,.1f} ({p90(r[kind]) * 1e6:,.1f})")
            med[name] = statistics.median(r["cold"])
        if "vLLM" in makers:
            row += [f"{med['vLLM'] / med[name]:.1f}×" for name in names if name != "vLLM"]
        print("| " + " | ".join(str(x) for x in row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
