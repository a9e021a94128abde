"""BurstGPT-shaped CSVs as workloads: a header with ``Timestamp`` (seconds
from the trace's start), ``Request tokens`` and ``Response tokens`` (other
columns, such as ``Model`` and ``Log Type``, are ignored), one row per
request in arrival order. Rows with no response tokens (BurstGPT's failed
requests) or no request tokens are skipped and counted. The trace records
lengths only, so no two prompts share tokens."""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Iterable
from typing import IO

from ironbatch.reference.limits import MAX_MODEL_LEN
from ironbatch.simulation.text_lines import TextLines
from ironbatch.simulation.workload import Workload, from_lengths

COLUMNS = ("Timestamp", "Request tokens", "Response tokens")


def _count(text: str, where: str) -> int:
    stripped = text.strip()
    try:
        value = float(stripped)
    except ValueError:
        raise ValueError(f"{where}: expected a non-negative integer, got {text!r}") from None
    if not (math.isfinite(value) and value >= 0 and value == int(value)):
        raise ValueError(f"{where}: expected a non-negative integer, got {text!r}")
    if value > MAX_MODEL_LEN:
        raise ValueError(
            f"{where}: {text.strip()} tokens is more than a request can have (at most "
            f"{MAX_MODEL_LEN:,}, max_model_len's limit)"
        )
    return int(value)


def read_burstgpt_csv(source: str | os.PathLike[str] | IO[str], name: str = "burstgpt") -> Workload:
    if isinstance(source, (str, os.PathLike)):
        return _read(TextLines(source), os.fspath(source), name)
    return _read(source, str(getattr(source, "name", "<csv>")), name)


def _read(f: Iterable[str], path: str, name: str) -> Workload:
    reader = csv.reader(f)
    header = [h.strip().lstrip("\ufeff") for h in next(reader, [])]
    missing = [c for c in COLUMNS if c not in header]
    if missing:
        raise ValueError(f"{path}: line 1: the header lacks {missing} (it has {header})")
    col = {c: header.index(c) for c in COLUMNS}
    arrivals: list[float] = []
    prompts: list[int] = []
    outputs: list[int] = []
    failed = 0
    first: float | None = None
    previous = -math.inf
    for row in reader:
        line = reader.line_num
        if not row or all(not cell.strip() for cell in row):
            continue
        if len(row) != len(header):
            raise ValueError(
                f"{path}: line {line}: the row has {len(row)} fields, the header {len(header)}"
            )
        where = f"{path}: line {line}, column Timestamp"
        try:
            t = float(row[col["Timestamp"]])
        except ValueError:
            raise ValueError(f"{where}: expected seconds, got {row[col['Timestamp']]!r}") from None
        if not math.isfinite(t) or t < previous:
            raise ValueError(
                f"{where}: {row[col['Timestamp']]!r} is not a time at or after the row before"
            )
        previous = t
        prompt = _count(row[col["Request tokens"]], f"{path}: line {line}, column Request tokens")
        output = _count(row[col["Response tokens"]], f"{path}: line {line}, column Response tokens")
        if prompt == 0 or output == 0:
            failed += 1
            continue
        first = t if first is None else first
        arrivals.append(t - first)
        prompts.append(prompt)
        outputs.append(output)
    return from_lengths(
        name,
        arrival_s=arrivals,
        prompt_tokens=prompts,
        output_tokens=outputs,
        skipped={"no request or no response tokens": failed} if failed else {},
    )
