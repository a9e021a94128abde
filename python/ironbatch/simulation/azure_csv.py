"""Azure-LLM-inference-trace-shaped CSVs (``TIMESTAMP,ContextTokens,
GeneratedTokens``) as workloads. The trace records lengths only, so no two
prompts share tokens. The reader is ``ironbatch.bench.azure_trace``'s: a
malformed row raises a ValueError naming the file, line and column."""

from __future__ import annotations

import os
from typing import IO

import numpy as np

from ironbatch.bench.azure_trace import read_trace
from ironbatch.simulation.workload import Workload, from_lengths

HEADER = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def read_azure_csv(source: str | os.PathLike[str] | IO[str], name: str = "azure") -> Workload:
    """The trace's rows; rows with no context or no generated tokens (a
    failed request) are skipped and counted in ``skipped``."""
    rows = read_trace(source)
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
