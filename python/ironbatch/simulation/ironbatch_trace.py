"""An ironbatch-trace/1 file (docs/trace-format.md) as a workload: its
requests with their own prompt tokens and arrival times, each generating as
many tokens as it did in the trace (a request the trace aborted, or that
never produced a token, is skipped and counted). Only the keys a workload
needs are read; a line that lacks one, or holds one of the wrong type, is a
ValueError naming the file, the line and the key."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from ironbatch.reference.limits import MAX_MODEL_LEN
from ironbatch.simulation.text_lines import TextLines, json_object
from ironbatch.simulation.workload import Workload, _offsets

FORMAT = "ironbatch-trace/1"
# The vocabulary (the largest id + 1) must fit the core's u32.
MAX_TOKEN_ID = 2**32 - 2


def _list(obj: dict[str, Any], key: str, where: str) -> list[Any]:
    if key not in obj:
        raise ValueError(f"{where}: the step lacks {key!r}")
    v = obj[key]
    if not isinstance(v, list):
        raise ValueError(f"{where}: {key} must be a list, got {type(v).__name__}")
    return v


def _request(d: Any, where: str) -> tuple[str, list[int], float]:
    if not isinstance(d, dict):
        raise ValueError(f"{where}: each of add's requests must be an object, got {d!r:.60}")
    rid = d.get("request_id")
    if not isinstance(rid, str):
        raise ValueError(f"{where}: add: request_id must be a string, got {rid!r:.60}")
    prompt = d.get("prompt_token_ids")
    if not isinstance(prompt, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) and 0 <= t <= MAX_TOKEN_ID for t in prompt
    ):
        raise ValueError(
            f"{where}: add {rid!r}: prompt_token_ids must be a list of token ids "
            f"(integers in [0, {MAX_TOKEN_ID}])"
        )
    if not 1 <= len(prompt) <= MAX_MODEL_LEN:
        raise ValueError(f"{where}: add {rid!r}: prompt_token_ids must hold 1 to "
                         f"{MAX_MODEL_LEN:,} tokens, got {len(prompt):,}")  # fmt: skip
    at = d.get("arrival_time", 0.0)
    if isinstance(at, bool) or not isinstance(at, (int, float)) or not math.isfinite(at):
        raise ValueError(f"{where}: add {rid!r}: arrival_time must be a finite number, got {at!r}")
    return rid, prompt, float(at)


def read_ironbatch_trace(path: str | Path, name: str = "trace") -> Workload:
    lines = TextLines(path)
    adds: list[tuple[str, list[int], float]] = []
    produced: dict[str, int] = {}
    aborted: set[str] = set()
    header_seen = False
    for line in lines:
        if not line.strip():
            continue
        where = lines.where()
        rec = json_object(line, where)
        if not header_seen:
            if rec.get("format") != FORMAT:
                raise ValueError(f"{where}: not an {FORMAT} trace (format = "
                                 f"{rec.get('format')!r:.40})")  # fmt: skip
            header_seen = True
            continue
        for d in _list(rec, "add", where):
            adds.append(_request(d, where))
            produced[adds[-1][0]] = 0
        for rid in _list(rec, "abort", where):
            if not isinstance(rid, str):
                raise ValueError(f"{where}: abort must list request ids (strings), got {rid!r:.60}")
            aborted.add(rid)
        for out in _list(rec, "outputs", where):
            if not (isinstance(out, list) and len(out) == 4 and isinstance(out[0], str)
                    and isinstance(out[1], list)):  # fmt: skip
                raise ValueError(
                    f"{where}: each output must be [request_id, [tokens], reason, stop], "
                    f"got {out!r:.60}"
                )
            produced[out[0]] = produced.get(out[0], 0) + len(out[1])
    if not header_seen:
        raise ValueError(f"{lines.name}: empty file, not an {FORMAT} trace")
    kept = [d for d in adds if d[0] not in aborted and produced[d[0]] > 0]
    # Arrival order; ties keep the trace's order.
    kept.sort(key=lambda d: d[2])
    arrivals = np.array([d[2] for d in kept], dtype=np.float64)
    if len(arrivals):
        arrivals -= arrivals[0]
    lengths = np.array([len(d[1]) for d in kept], dtype=np.int64)
    tokens = np.array([t for d in kept for t in d[1]], dtype=np.int64)
    vocab = int(tokens.max()) + 1 if len(tokens) else 4
    return Workload(
        name=name,
        arrival_s=arrivals,
        output_tokens=np.array([produced[d[0]] for d in kept], dtype=np.int64),
        segment_offsets=np.zeros(len(kept) + 1, dtype=np.int64),
        segment_keys=np.zeros(0, dtype=np.uint64),
        segment_lengths=np.zeros(0, dtype=np.int64),
        literal_offsets=_offsets(lengths),
        literal_tokens=tokens,
        ids=tuple(d[0] for d in kept),
        vocab_size=max(vocab, 4),
        skipped={"aborted or without output": len(adds) - len(kept)}
        if len(kept) < len(adds)
        else {},
    )
