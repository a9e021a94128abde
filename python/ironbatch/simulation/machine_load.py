"""How much of this machine other processes used over an interval (Linux:
``/proc/stat`` for the whole machine, ``/proc/self/stat`` for this process):
a timing measurement on a shared machine is only as good as the quiet it
ran in. A CPU-bound neighbour slows a step even without taking its core
(caches, memory bandwidth), which no per-process clock shows."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Snapshot:
    wall_s: float
    machine_busy_s: float  # all CPUs, every process
    own_busy_s: float  # this process, every thread


def _ticks() -> float:
    return float(os.sysconf("SC_CLK_TCK"))


def snapshot() -> Snapshot | None:
    """Now, or None where /proc is not there to read."""
    try:
        with open("/proc/stat") as f:
            cpu = f.readline().split()[1:]
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    # user nice system idle iowait irq softirq steal ...
    busy = sum(float(cpu[i]) for i in (0, 1, 2, 5, 6, 7) if i < len(cpu))
    own = float(fields[11]) + float(fields[12])  # utime, stime
    return Snapshot(time.perf_counter(), busy / _ticks(), own / _ticks())


def others_share(start: Snapshot | None, end: Snapshot | None) -> float:
    """The share of the machine's CPU capacity other processes used between
    the two snapshots (0: only this process ran; 0 where unknown)."""
    if start is None or end is None or end.wall_s <= start.wall_s:
        return 0.0
    others = (end.machine_busy_s - start.machine_busy_s) - (end.own_busy_s - start.own_busy_s)
    capacity = (end.wall_s - start.wall_s) * (os.cpu_count() or 1)
    return max(0.0, others / capacity)


def wait_for_quiet(threshold: float, *, within_s: float, sample_s: float = 1.0) -> float:
    """Wait (up to ``within_s``) for a ``sample_s`` interval in which other
    processes use at most ``threshold`` of the machine; returns the last
    share seen."""
    deadline = time.perf_counter() + within_s
    while True:
        start = snapshot()
        time.sleep(sample_s)
        share = others_share(start, snapshot())
        if share <= threshold or time.perf_counter() >= deadline:
            return share
