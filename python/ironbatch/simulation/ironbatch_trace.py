"""An ironbatch-trace/1 file (docs/trace-format.md) as a workload: its
requests with their own prompt tokens and arrival times, each generating as
many tokens as it did in the trace (a request the trace aborted, or that
never produced a token, is skipped and counted)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ironbatch.simulation.workload import Workload, _offsets
from ironbatch.trace.replay import open_trace


def read_ironbatch_trace(path: str | Path, name: str = "trace") -> Workload:
    adds: list[dict[str, Any]] = []
    produced: dict[str, int] = {}
    aborted: set[str] = set()
    with open_trace(path) as (_header, steps):
        for rec in steps:
            for d in rec["add"]:
                adds.append(d)
                produced[d["request_id"]] = 0
            aborted.update(rec["abort"])
            for rid, tokens, _reason, _stop in rec["outputs"]:
                produced[rid] = produced.get(rid, 0) + len(tokens)
    kept = [d for d in adds if d["request_id"] not in aborted and produced[d["request_id"]] > 0]
    # Arrival order; ties keep the trace's order.
    kept.sort(key=lambda d: float(d.get("arrival_time", 0.0)))
    prompts = [d["prompt_token_ids"] for d in kept]
    arrivals = np.array([float(d.get("arrival_time", 0.0)) for d in kept], dtype=np.float64)
    if len(arrivals):
        arrivals -= arrivals[0]
    lengths = np.array([len(p) for p in prompts], dtype=np.int64)
    tokens = np.array([t for p in prompts for t in p], dtype=np.int64)
    vocab = int(tokens.max()) + 1 if len(tokens) else 4
    return Workload(
        name=name,
        arrival_s=arrivals,
        output_tokens=np.array([produced[d["request_id"]] for d in kept], dtype=np.int64),
        segment_offsets=np.zeros(len(kept) + 1, dtype=np.int64),
        segment_keys=np.zeros(0, dtype=np.uint64),
        segment_lengths=np.zeros(0, dtype=np.int64),
        literal_offsets=_offsets(lengths),
        literal_tokens=tokens,
        ids=tuple(d["request_id"] for d in kept),
        vocab_size=max(vocab, 4),
        skipped={"aborted or without output": len(adds) - len(kept)}
        if len(kept) < len(adds)
        else {},
    )
