"""Azure-LLM-inference-trace-shaped CSVs (``TIMESTAMP,ContextTokens,
GeneratedTokens``) as workloads. The trace records lengths only, so no two
prompts share tokens. The reader is ``ironbatch.bench.azure_trace``'s: a
malformed row raises a ValueError naming the file, line and column; so does
a count larger than any request can be (``max_model_len``'s limit)."""

from __future__ import annotations

import csv
import os
from typing import IO, Any, cast

import numpy as np

from ironbatch.bench.azure_trace import read_trace
from ironbatch.reference.limits import MAX_MODEL_LEN
from ironbatch.simulation.text_lines import TextLines
from ironbatch.simulation.workload import Workload, from_lengths

HEADER = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def read_azure_csv(source: str | os.PathLike[str] | IO[str], name: str = "azure") -> Workload:
    """The trace's rows; rows with no context or no generated tokens (a
    failed request) are skipped and counted in ``skipped``."""
    lines: Any = TextLines(source) if isinstance(source, (str, os.PathLike)) else source
    rows = read_trace(cast(IO[str], lines))
    for i, r in enumerate(rows):
        for column, count in (("ContextTokens", r.context_tokens),
                              ("GeneratedTokens", r.generated_tokens)):  # fmt: skip
            if count > MAX_MODEL_LEN:
                raise ValueError(
                    f"{_where(lines, i)}, column {column}: {count:,} tokens is more than a "
                    f"request can have (at most {MAX_MODEL_LEN:,}, max_model_len's limit)"
                )
    kept = [r for r in rows if r.context_tokens > 0 and r.generated_tokens > 0]
    failed = len(rows) - len(kept)
    skipped = {"no context or no generated tokens": failed} if failed else {}
    return from_lengths(
        name,
        arrival_s=np.array([r.arrival_s for r in kept], dtype=np.float64),
        prompt_tokens=[r.context_tokens for r in kept],
        output_tokens=[r.generated_tokens for r in kept],
        skipped=skipped,
    )


def _where(lines: Any, row: int) -> str:
    """Row ``row``'s file and line: read again (only on an error), blank rows
    skipped as the reader skips them."""
    name = str(getattr(lines, "name", "<csv>"))
    if not isinstance(lines, TextLines):
        return f"{name}: row {row + 1}"
    reader = csv.reader(lines)
    next(reader, None)
    seen = -1
    for cells in reader:
        if cells and any(c.strip() for c in cells):
            seen += 1
            if seen == row:
                return f"{name}: line {reader.line_num}"
    return f"{name}: row {row + 1}"
