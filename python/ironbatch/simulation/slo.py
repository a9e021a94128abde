"""Service-level objectives for goodput (``--slo ttft=500ms,tpot=50ms``): a
request counts toward goodput when every latency named is at or under its
bound. Values are seconds, or carry ``ms``/``s``."""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

METRICS = ("ttft", "tpot", "e2e", "queue")


def parse_slo(spec: str | Mapping[str, float] | None) -> dict[str, float]:
    """``"ttft=0.5,tpot=50ms"`` or ``{"ttft": 0.5}`` as ``{metric: seconds}``."""
    if spec is None:
        return {}
    if not isinstance(spec, (str, Mapping)):
        raise TypeError(
            f"slo must be a string like 'ttft=500ms,tpot=50ms' or a mapping of metric to "
            f"seconds, got {spec!r}"
        )
    items = spec.items() if isinstance(spec, Mapping) else _pairs(spec)
    out: dict[str, float] = {}
    for key, raw in items:
        if key not in METRICS:
            raise ValueError(f"slo: unknown metric {key!r}; the metrics are {list(METRICS)}")
        out[key] = _seconds(key, raw)
    return out


def _pairs(spec: str) -> list[tuple[str, str]]:
    pairs = []
    for item in filter(None, (p.strip() for p in spec.split(","))):
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"slo: expected metric=value, got {item!r}")
        pairs.append((key.strip(), value.strip()))
    return pairs


def _seconds(key: str, raw: object) -> float:
    if isinstance(raw, bool) or not isinstance(raw, (str, int, float)):
        raise TypeError(f"slo: {key} must be seconds (a number) or a time like '500ms', "
                        f"got {raw!r}")  # fmt: skip
    text = str(raw).strip()
    scale = 1.0
    if text.endswith("ms"):
        text, scale = text[:-2], 1e-3
    elif text.endswith("s"):
        text = text[:-1]
    try:
        value = float(text) * scale
    except ValueError:
        raise ValueError(f"slo: {key} must be a time like 0.5, 500ms or 2s, got {raw!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"slo: {key} must be a finite time > 0, got {raw!r}")
    return value


def meets(latencies: Mapping[str, np.ndarray], slo: Mapping[str, float]) -> np.ndarray:
    """Per request: every bound in ``slo`` met (a NaN latency, such as the
    TPOT of a one-token request, meets any bound)."""
    ok = np.ones(len(next(iter(latencies.values()))), dtype=bool)
    for key, bound in slo.items():
        values = latencies[key]
        ok &= np.isnan(values) | (values <= bound)
    return ok
