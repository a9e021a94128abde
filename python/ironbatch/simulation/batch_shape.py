"""A step's batch shape as the step-time models read it, from a scheduler
output's columns: the same sums as ``BatchShape::of`` in
``rust/src/simulate/step_time.rs``, for the profiler (which times real
steps) and for drivers that compute shapes from another scheduler."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

FEATURES = (
    "num_requests", "num_prefill_requests", "num_prefill_tokens", "num_decode_tokens",
    "num_sampled", "context_tokens", "attention_pairs",
)  # fmt: skip


@dataclass(frozen=True)
class BatchShape:
    num_requests: int
    num_prefill_requests: int
    num_prefill_tokens: int
    num_decode_tokens: int
    num_sampled: int
    context_tokens: int
    attention_pairs: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def batch_shape(num_tokens: Any, num_computed: Any, samples: Any) -> BatchShape:
    """The shape of rows scheduling ``num_tokens`` after ``num_computed``,
    ``samples`` telling which sample a token."""
    n = np.asarray(num_tokens, dtype=np.int64)
    c = np.asarray(num_computed, dtype=np.int64)
    s = np.asarray(samples, dtype=bool)
    decode = (n == 1) & s
    nf, cf = n.astype(np.float64), c.astype(np.float64)
    pairs = 0.0
    for a, b in zip(nf.tolist(), cf.tolist(), strict=True):  # the Rust loop's order
        pairs += a * b + a * (a + 1.0) / 2.0
    return BatchShape(
        num_requests=len(n),
        num_prefill_requests=int((~decode).sum()),
        num_prefill_tokens=int(n[~decode].sum()),
        num_decode_tokens=int(decode.sum()),
        num_sampled=int(s.sum()),
        context_tokens=int((n + c).sum()),
        attention_pairs=pairs,
    )
