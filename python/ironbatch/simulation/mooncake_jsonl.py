"""Mooncake-shaped JSONL traces as workloads: one object per line with
``timestamp`` (milliseconds), ``input_length``, ``output_length`` and
``hash_ids``, the ids of the prompt's blocks of ``block_tokens`` tokens
(512 in Mooncake's traces). Requests listing the same ids first share those
blocks' tokens, so prefix caching sees the reuse the trace records: each id
becomes one segment of ``block_tokens`` tokens (the last one the prompt's
remainder), and tokens past the listed blocks are the request's own."""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from typing import IO, Any

from ironbatch.reference.limits import MAX_MODEL_LEN
from ironbatch.simulation.text_lines import TextLines, json_object
from ironbatch.simulation.workload import OWN_KEYS, PREFIX_GROUP_KEYS, Workload, from_segments

MOONCAKE_BLOCK_TOKENS = 512
# Milliseconds: a timestamp past 2^53 would lose its last digits as seconds.
MAX_TIMESTAMP_MS = 2**53


def _int(obj: dict[str, Any], key: str, where: str, most: int = MAX_MODEL_LEN) -> int:
    if key not in obj:
        raise ValueError(f"{where}: missing {key!r}")
    v = obj[key]
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= most:
        raise ValueError(f"{where}: {key} must be an integer in [0, {most:,}], got {v!r:.40}")
    return v


def read_mooncake_jsonl(
    source: str | os.PathLike[str] | IO[str],
    name: str = "mooncake",
    block_tokens: int = MOONCAKE_BLOCK_TOKENS,
) -> Workload:
    if block_tokens < 1:
        raise ValueError(f"block_tokens must be >= 1, got {block_tokens}")
    if isinstance(source, (str, os.PathLike)):
        return _read(TextLines(source), os.fspath(source), name, block_tokens)
    return _read(source, str(getattr(source, "name", "<jsonl>")), name, block_tokens)


def _read(f: Iterable[str], path: str, name: str, block_tokens: int) -> Workload:
    arrivals: list[float] = []
    outputs: list[int] = []
    segments: list[list[tuple[int, int]]] = []
    skipped = 0
    first: int | None = None
    previous = -math.inf
    for line_number, line in enumerate(f, 1):
        if not line.strip():
            continue
        where = f"{path}: line {line_number}"
        obj = json_object(line, where)
        t = _int(obj, "timestamp", where, MAX_TIMESTAMP_MS)
        length = _int(obj, "input_length", where)
        output = _int(obj, "output_length", where)
        ids = obj.get("hash_ids", [])
        if not isinstance(ids, list) or not all(
            isinstance(h, int) and not isinstance(h, bool) and 0 <= h < PREFIX_GROUP_KEYS
            for h in ids
        ):
            raise ValueError(
                f"{where}: hash_ids must be a list of integers in [0, 2^61), got {ids!r:.80}"
            )
        if len(ids) > math.ceil(length / block_tokens):
            raise ValueError(
                f"{where}: {len(ids)} hash_ids for input_length {length} "
                f"(at most {math.ceil(length / block_tokens)} blocks of {block_tokens} tokens)"
            )
        if t < previous:
            raise ValueError(f"{where}: timestamp {t} is earlier than the line before")
        previous = t
        if length == 0 or output == 0:
            skipped += 1
            continue
        first = t if first is None else first
        prompt = [(h, min(block_tokens, length - j * block_tokens)) for j, h in enumerate(ids)]
        own = length - len(ids) * block_tokens
        if own > 0:
            prompt.append((OWN_KEYS + len(segments), own))
        arrivals.append((t - first) / 1000.0)
        outputs.append(output)
        segments.append(prompt)
    return from_segments(
        name,
        arrival_s=arrivals,
        output_tokens=outputs,
        segments=segments,
        skipped={"no input or no output tokens": skipped} if skipped else {},
    )
