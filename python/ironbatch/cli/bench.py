"""``ironbatch bench``: the scheduler step table, Rust core vs Python twin."""

from __future__ import annotations

import platform
import sys

from ironbatch.bench import WORKLOADS, IronbatchDriver, format_table, run


def bench_main(workloads: list[str], steps: int, backends: list[str], turn: int = 1) -> int:
    unknown = [w for w in workloads if w not in WORKLOADS]
    if unknown:
        print(f"unknown workloads {unknown}; choose from {sorted(WORKLOADS)}", file=sys.stderr)
        return 2
    drivers = [lambda w, b=b: IronbatchDriver(w, b) for b in backends]
    rows = run(
        drivers,
        [WORKLOADS[w] for w in workloads],
        steps=steps,
        turn=turn,
        log=lambda s: print(s, file=sys.stderr),
    )
    print(
        f"{platform.machine()}, Python {platform.python_version()}, {steps} timed steps per "
        f"workload, turns of {turn} step(s); median per step, Python boundary included"
    )
    print(format_table(rows))
    return 0
