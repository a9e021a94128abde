"""Scheduler step benchmarks: the same workloads for every scheduler, timed
in one run (``ironbatch bench``; ``benches/compare_vllm.py`` adds vLLM)."""

from ironbatch.bench.scheduler_steps import (
    WORKLOADS,
    IronbatchDriver,
    Workload,
    format_table,
    run,
)

__all__ = ["WORKLOADS", "IronbatchDriver", "Workload", "format_table", "run"]
