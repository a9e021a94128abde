"""How fast ``ironbatch simulate`` runs: the Azure 2023 conversation trace's
shape (19,366 requests over about an hour, generated with the trace's
statistics: ``ironbatch.bench.azure_trace.synthetic_trace_csv``) at its own
rate and at 8×, on the default step model (a roofline of Llama-3.1-8B on an
H100) and vLLM's serving defaults; simulated seconds per wall second and
steps per second (median of ``--repeat`` runs). Then a sweep of 100
configurations of the same workload (max_num_batched_tokens × KV-cache size
× max_num_seqs) in ``--jobs`` processes, timed whole.

    python benches/simulate_speed.py                 # the table in benches/RESULTS.md
    python benches/simulate_speed.py --sweep         # and the 100-configuration sweep
    python benches/simulate_speed.py --trace AzureLLMInferenceTrace_conv.csv   # the real trace
"""

from __future__ import annotations

import argparse
import io
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from ironbatch.bench.azure_trace import synthetic_trace_csv
from ironbatch.simulation import load_workload, simulate
from ironbatch.simulation.azure_csv import read_azure_csv
from ironbatch.simulation.machine_load import others_share, snapshot
from ironbatch.simulation.sweep import run_sweep

SWEEP = [
    ("max_num_batched_tokens", [1024, 2048, 4096, 8192, 16384]),
    ("kv_cache_gib", [4.0, 8.0, 16.0, 32.0]),
    ("max_num_seqs", [32, 64, 128, 256, 512]),
]


def commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            cwd=Path(__file__).parent,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--requests", type=int, default=19_366)
    ap.add_argument("--trace", help="an Azure-trace CSV instead of the generated one")
    ap.add_argument("--speeds", default="1,8")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--sweep", action="store_true", help="also time the 100-configuration sweep")
    ap.add_argument("--jobs", type=int, default=os.cpu_count())
    args = ap.parse_args()
    if args.trace:
        w = load_workload(args.trace)
    else:
        text = synthetic_trace_csv(args.requests, seed=0)
        w = read_azure_csv(io.StringIO(text), f"azure-conv-shaped ({args.requests:,} requests)")
    print(f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"commit {commit()}, {time.strftime('%Y-%m-%d')}")  # fmt: skip
    print(f"workload: {w.name}, {w.arrival_s[-1]:,.0f} s of arrivals")
    # The loop runs in this thread (the GIL released), so the thread's CPU
    # time is the run's own, whatever else the machine does; the wall clock
    # is what a user waits. Others' share: how busy the machine was.
    print(
        "| rate | simulated s | wall s | × real time | CPU s | × real time per CPU s "
        "| steps | steps/s | TTFT p50 / p99 ms | others' share of the CPUs |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for speed in (float(s) for s in args.speeds.split(",")):
        walls, cpus, shares, r = [], [], [], None
        for _ in range(args.repeat):
            start, c0 = snapshot(), time.thread_time()
            r = simulate(w, speed=speed, record_steps=False)
            cpus.append(time.thread_time() - c0)
            shares.append(others_share(start, snapshot()))
            walls.append(r.summary["wall_s"])
        assert r is not None
        s = r.summary
        wall, cpu = statistics.median(walls), statistics.median(cpus)
        ttft = s["latency_s"]["ttft"]
        print(f"| {speed:g}× | {s['simulated_s']:,.0f} | {wall:.2f} "
              f"| {s['simulated_s'] / wall:,.0f} | {cpu:.2f} | {s['simulated_s'] / cpu:,.0f} "
              f"| {s['steps']:,} | {s['steps'] / wall:,.0f} "
              f"| {ttft['p50'] * 1e3:,.1f} / {ttft['p99'] * 1e3:,.1f} "
              f"| {statistics.median(shares):.0%} |")  # fmt: skip
        sys.stdout.flush()
    if args.sweep:
        started, before = time.perf_counter(), snapshot()
        result = run_sweep(w, SWEEP, jobs=args.jobs)
        wall = time.perf_counter() - started
        # This process waits on its workers: the others' share includes them.
        share = others_share(before, snapshot())
        print(
            f"sweep: {len(result.points)} configurations of the real-rate workload in "
            f"{wall:,.1f} s with {args.jobs} processes ({wall / len(result.points):.2f} s "
            f"each; every process on the machine used {share:.0%} of the CPUs)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
