"""Azure LLM inference traces (Microsoft's public 2023 traces, published with
the Splitwise paper, CC-BY-4.0): a reader for CSVs of their shape, and a
generator of synthetic CSVs with the conversation trace's shape, so a
benchmark runs without the real files.

The format: a header ``TIMESTAMP,ContextTokens,GeneratedTokens`` and one row
per request, in arrival order, timestamps like ``2023-11-16 18:15:46.6805900``
(seconds with up to 9 fractional digits; the traces have 7). The reader
gives each row as a ``TraceRequest``: its arrival in seconds after the first
row's, its context (prompt) tokens and its generated tokens.

The generator draws lengths from a piecewise log-linear quantile function
through the conversation trace's percentiles (lognormal-like between knots;
a single lognormal misses the trace's lumps, such as generated lengths
jumping from ~130 to ~390 tokens between the 50th and 70th percentiles) and
arrivals from a Poisson process at a given rate, deterministically by seed
(``random.Random``, whose stream Python keeps stable)."""

from __future__ import annotations

import bisect
import csv
import io
import math
import os
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import IO

COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")

# The percentiles (0-100) at which the synthetic lengths' quantile function
# has knots.
PERCENTILES = (0, 1, 5, 10, 20, 30, 40, 50, 60, 70, 80, 90, 95, 99, 100)

# Fitted from AzureLLMInferenceTrace_conv.csv (Azure Public Dataset,
# AzureLLMInferenceDataset2023: 19,366 requests over 3,502 s on 2023-11-16)
# with ``fit_quantiles`` (linear interpolation between order statistics, as
# numpy.percentile's default), at PERCENTILES. Medians: 1,020 context
# tokens, 129 generated; 90th percentiles: 2,734.5 and 424.
CONV_CONTEXT_QUANTILES = (
    2.0, 29.0, 181.0, 207.0, 387.0, 403.0, 703.0, 1020.0,
    1071.0, 1130.0, 1315.0, 2734.5, 4083.0, 4142.0, 14050.0,
)  # fmt: skip
CONV_GENERATED_QUANTILES = (
    7.0, 16.0, 41.0, 54.0, 77.0, 91.0, 103.0, 129.0,
    177.0, 384.0, 400.0, 424.0, 451.0, 601.0, 1000.0,
)  # fmt: skip
# The same file's mean arrival rate (19,366 requests / 3,501.7 s); its
# inter-arrival gaps have a coefficient of variation of 1.09, close to a
# Poisson process's 1.
CONV_RATE_PER_S = 5.53

# Where synthetic timestamps start: the conversation trace's first row.
SYNTHETIC_START = datetime(2023, 11, 16, 18, 15, 46, 680590, tzinfo=timezone.utc)

_TIMESTAMP = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?"
)  # fmt: skip
_TICKS_PER_S = 10_000_000  # the traces' resolution: 100 ns


@dataclass(frozen=True)
class TraceRequest:
    """One row: when the request arrived (seconds after the trace's first
    row), its context (prompt) tokens and the tokens it generated."""

    arrival_s: float
    context_tokens: int
    generated_tokens: int


def _where(name: str, line: int, column: str) -> str:
    return f"{name}: line {line}, column {column}"


def _parse_timestamp(text: str, name: str, line: int) -> tuple[int, float]:
    """Whole seconds since the epoch (as UTC) and the fraction, apart so a
    difference keeps the traces' 100 ns resolution."""
    m = _TIMESTAMP.fullmatch(text.strip())
    if m is None:
        raise ValueError(
            f"{_where(name, line, 'TIMESTAMP')}: expected a timestamp like "
            f"'2023-11-16 18:15:46.6805900', got {text!r}"
        )
    year, month, day, hour, minute, second = (int(g) for g in m.groups()[:6])
    try:
        at = datetime(year, month, day, hour, minute, second, tzinfo=timezone.utc)
    except ValueError as e:
        raise ValueError(f"{_where(name, line, 'TIMESTAMP')}: {e} in {text!r}") from None
    fraction = float("0." + m.group(7)) if m.group(7) else 0.0
    return int(at.timestamp()), fraction


def _parse_count(text: str, name: str, line: int, column: str) -> int:
    stripped = text.strip()
    if not stripped.isdigit() or not stripped.isascii():
        raise ValueError(
            f"{_where(name, line, column)}: expected a non-negative integer, got {text!r}"
        )
    return int(stripped)


def _source_name(source: str | os.PathLike[str] | IO[str]) -> str:
    if isinstance(source, (str, os.PathLike)):
        return os.fspath(source)
    return str(getattr(source, "name", "<csv>"))


def read_trace(source: str | os.PathLike[str] | IO[str]) -> list[TraceRequest]:
    """The rows of an Azure-trace-shaped CSV (a path or an open text file),
    in order. The header must name the three columns (in any order; other
    columns are ignored); blank lines are skipped. Bad input raises a
    ValueError naming the file, the line and the column: a missing column,
    a row with too few or too many fields, a malformed timestamp or count, or a row
    earlier than the one before it."""
    name = _source_name(source)
    if isinstance(source, (str, os.PathLike)):
        with open(source, newline="", encoding="utf-8") as f:
            return _read_rows(f, name)
    return _read_rows(source, name)


def _read_rows(f: IO[str], name: str) -> list[TraceRequest]:
    reader = csv.reader(f)
    header = next(reader, None)
    if header is None:
        raise ValueError(f"{name}: line 1: empty file; expected the header {','.join(COLUMNS)}")
    fields = [h.strip().lstrip("\ufeff") for h in header]
    index: dict[str, int] = {}
    for column in COLUMNS:
        if column not in fields:
            raise ValueError(
                f"{_where(name, reader.line_num, column)}: missing from the header {header!r}"
            )
        index[column] = fields.index(column)
    width = max(index.values()) + 1
    out: list[TraceRequest] = []
    first: tuple[int, float] | None = None
    previous = -math.inf
    for row in reader:
        line = reader.line_num
        if not row or all(not cell.strip() for cell in row):
            continue
        if len(row) < width:
            missing = next(c for c in COLUMNS if index[c] >= len(row))
            raise ValueError(
                f"{_where(name, line, missing)}: the row has {len(row)} fields, "
                f"the header {len(fields)}"
            )
        if len(row) > len(fields):
            raise ValueError(
                f"{_where(name, line, str(len(fields) + 1))}: the row has {len(row)} fields, "
                f"the header {len(fields)}"
            )
        whole, fraction = _parse_timestamp(row[index["TIMESTAMP"]], name, line)
        context = _parse_count(row[index["ContextTokens"]], name, line, "ContextTokens")
        generated = _parse_count(row[index["GeneratedTokens"]], name, line, "GeneratedTokens")
        if first is None:
            first = (whole, fraction)
        arrival = (whole - first[0]) + (fraction - first[1])
        if arrival < previous:
            raise ValueError(
                f"{_where(name, line, 'TIMESTAMP')}: {row[index['TIMESTAMP']]!r} is earlier "
                "than the row before it (rows must be in arrival order)"
            )
        previous = arrival
        out.append(TraceRequest(arrival, context, generated))
    return out


def fit_quantiles(
    values: Sequence[float], percentiles: Sequence[float] = PERCENTILES
) -> tuple[float, ...]:
    """The values' percentiles (linear interpolation between order
    statistics, as numpy.percentile's default): the knots of the synthetic
    lengths' quantile function."""
    if not values:
        raise ValueError("fit_quantiles needs at least one value")
    ordered = sorted(values)
    last = len(ordered) - 1
    knots = []
    for p in percentiles:
        rank = p / 100 * last
        low = math.floor(rank)
        high = min(low + 1, last)
        knots.append(ordered[low] + (ordered[high] - ordered[low]) * (rank - low))
    return tuple(float(k) for k in knots)


def sample_length(rng: random.Random, quantiles: Sequence[float]) -> int:
    """One length from the quantile function through ``quantiles`` (at
    PERCENTILES), log-linear between knots, at least 1."""
    u = rng.random() * 100
    i = min(bisect.bisect_right(PERCENTILES, u), len(PERCENTILES) - 1)
    p0, p1 = PERCENTILES[i - 1], PERCENTILES[i]
    lo, hi = math.log(max(quantiles[i - 1], 1.0)), math.log(max(quantiles[i], 1.0))
    return max(1, round(math.exp(lo + (hi - lo) * (u - p0) / (p1 - p0))))


def format_timestamp(ticks: int) -> str:
    """The trace timestamp ``ticks`` × 100 ns after SYNTHETIC_START."""
    whole, sub = divmod(SYNTHETIC_START.microsecond * 10 + ticks, _TICKS_PER_S)
    at = SYNTHETIC_START.replace(microsecond=0) + timedelta(seconds=whole)
    return f"{at:%Y-%m-%d %H:%M:%S}.{sub:07d}"


def synthetic_trace_csv(
    num_requests: int,
    *,
    seed: int,
    rate_per_s: float = CONV_RATE_PER_S,
    context_quantiles: Sequence[float] = CONV_CONTEXT_QUANTILES,
    generated_quantiles: Sequence[float] = CONV_GENERATED_QUANTILES,
) -> str:
    """A CSV of ``num_requests`` rows in the traces' format: Poisson
    arrivals at ``rate_per_s`` (the first at the start), context and
    generated lengths from the quantile functions (the conversation
    trace's by default). The same arguments give the same text."""
    if num_requests < 0:
        raise ValueError(f"num_requests must be >= 0, got {num_requests}")
    if not rate_per_s > 0:
        raise ValueError(f"rate_per_s must be > 0, got {rate_per_s}")
    for knots in (context_quantiles, generated_quantiles):
        if len(knots) != len(PERCENTILES):
            raise ValueError(f"quantiles need {len(PERCENTILES)} knots (at PERCENTILES)")
    rng = random.Random(seed)
    out = io.StringIO()
    out.write(",".join(COLUMNS) + "\n")
    ticks = 0
    for i in range(num_requests):
        if i:
            gap_s = -math.log(1.0 - rng.random()) / rate_per_s
            ticks += round(gap_s * _TICKS_PER_S)
        context = sample_length(rng, context_quantiles)
        generated = sample_length(rng, generated_quantiles)
        out.write(f"{format_timestamp(ticks)},{context},{generated}\n")
    return out.getvalue()


def synthetic_trace(
    num_requests: int, *, seed: int, rate_per_s: float = CONV_RATE_PER_S
) -> list[TraceRequest]:
    """``synthetic_trace_csv``'s rows, read back with ``read_trace``."""
    text = synthetic_trace_csv(num_requests, seed=seed, rate_per_s=rate_per_s)
    return read_trace(io.StringIO(text))
