"""The simulated deployment's scheduler settings (``--config key=value``),
named as vLLM names them, with vLLM 0.33's serving defaults: async
scheduling, chunked prefill and prefix caching on, 256 sequences, an
8,192-token step budget, block size 16.

Two settings are derived when not given: ``max_model_len`` (the workload's
longest prompt plus output, rounded up to a block) and ``num_blocks`` (from
``kv_cache_gib`` and the step model's KV bytes per token; else what a
roofline's device leaves for the KV cache, as vLLM sizes it; else room for
``max_num_seqs`` sequences of ``max_model_len`` tokens: nothing preempted).
An unknown key, a value of the wrong type or out of its range (RANGES:
infinite and NaN numbers never) raises a ValueError naming it; a derived
value the scheduler cannot take is explained in ``feasibility``."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from ironbatch.config import CacheConfig, SchedulerConfig
from ironbatch.core_scheduler import CoreScheduler
from ironbatch.reference.limits import (
    MAX_BLOCK_SIZE,
    MAX_MODEL_LEN,
    MAX_NUM_BATCHED_TOKENS,
    MAX_NUM_BLOCKS,
    MAX_NUM_SEQS,
)

# Each key's type and default (None: derived or off).
KEYS: dict[str, tuple[type, Any]] = {
    "max_num_seqs": (int, 256),
    "max_num_batched_tokens": (int, 8192),
    "max_model_len": (int, None),
    "enable_chunked_prefill": (bool, True),
    "long_prefill_token_threshold": (int, 0),
    "long_prefill_token_threshold_adaptive": (bool, False),
    "policy": (str, "fcfs"),
    "scheduler_reserve_full_isl": (bool, True),
    "async_scheduling": (bool, True),
    "max_num_scheduled_tokens": (int, None),
    "max_num_active_seqs": (int, None),
    "watermark": (float, 0.0),
    "prefill_schedule_interval": (int, 1),
    "block_size": (int, 16),
    "num_blocks": (int, None),
    "kv_cache_gib": (float, None),
    "enable_prefix_caching": (bool, True),
}
_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")
# Each number's accepted range: (lowest, highest, whether the lowest is
# excluded). The scheduler's own limits, so a value passes here exactly when
# the core would take it.
RANGES: dict[str, tuple[float, float, bool]] = {
    "max_num_seqs": (1, MAX_NUM_SEQS, False),
    "max_num_batched_tokens": (1, MAX_NUM_BATCHED_TOKENS, False),
    "max_model_len": (2, MAX_MODEL_LEN, False),
    "long_prefill_token_threshold": (0, MAX_MODEL_LEN, False),
    "max_num_scheduled_tokens": (1, MAX_NUM_BATCHED_TOKENS, False),
    "max_num_active_seqs": (1, MAX_NUM_SEQS, False),
    "watermark": (0.0, 1.0, False),
    "prefill_schedule_interval": (1, 2**31 - 1, False),
    "block_size": (1, MAX_BLOCK_SIZE, False),
    "num_blocks": (2, MAX_NUM_BLOCKS, False),
    # A pebibyte: beyond any deployment, and far inside a float's range.
    "kv_cache_gib": (0.0, float(2**20), True),
}
POLICIES = ("fcfs", "priority")


def _in_range(key: str, value: Any) -> Any:
    if key == "policy" and value not in POLICIES:
        raise ValueError(f"config policy must be one of {POLICIES}, got {value!r}")
    if key not in RANGES:
        return value
    lo, hi, open_lo = RANGES[key]
    above_lo = value > lo if open_lo else value >= lo
    # watermark is a share of the cache: 1 would hold every block back.
    below_hi = value < hi if key == "watermark" else value <= hi
    if not (math.isfinite(value) and above_lo and below_hi):
        span = span_text(lo, hi, open_lo=open_lo, open_hi=key == "watermark")
        kind = "a finite number" if KEYS[key][0] is float else "an integer"
        raise ValueError(f"config {key} must be {kind} in {span}, got {value!r}")
    return value


def span_text(lo: float, hi: float, *, open_lo: bool = False, open_hi: bool = False) -> str:
    """An accepted range as messages write it: ``[1, 2,048]``, ``(0, 1]``."""

    def num(v: float) -> str:
        return f"{int(v):,}" if float(v).is_integer() else f"{v:g}"

    return f"{'(' if open_lo else '['}{num(lo)}, {num(hi)}{')' if open_hi else ']'}"


def _value(key: str, raw: Any) -> Any:
    kind = KEYS[key][0]
    if not isinstance(raw, str):
        if kind is float and isinstance(raw, int) and not isinstance(raw, bool):
            return float(raw)
        if isinstance(raw, kind) and not (kind is int and isinstance(raw, bool)):
            return raw
        raise TypeError(f"config {key} must be a {kind.__name__}, got {raw!r}")
    text = raw.strip()
    if kind is bool:
        if text.lower() in _TRUE:
            return True
        if text.lower() in _FALSE:
            return False
        raise ValueError(f"config {key} must be true or false, got {raw!r}")
    if kind is str:
        return text
    try:
        return kind(text)
    except (ValueError, OverflowError):
        raise ValueError(
            f"config {key} must be a{'n int' if kind is int else ' number'}, got {raw!r}"
        ) from None


def parse_settings(items: Mapping[str, Any] | Iterable[str] | None) -> dict[str, Any]:
    """``{key: value}`` or ``["key=value", ...]`` checked against KEYS:
    only the keys given, their values converted."""
    if items is None:
        return {}
    if isinstance(items, (str, bytes)) or not isinstance(items, (Mapping, Iterable)):
        raise TypeError(
            f"config must be a mapping of vLLM's setting names to values or a list of "
            f"'key=value' strings, got {items!r:.60}"
        )
    pairs: list[tuple[str, Any]] = []
    if isinstance(items, Mapping):
        pairs = list(items.items())
    else:
        for item in items:
            key, sep, value = str(item).partition("=")
            if not sep:
                raise ValueError(f"config: expected key=value, got {item!r}")
            pairs.append((key.strip(), value))
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key not in KEYS:
            raise ValueError(f"config: unknown key {key!r}; the keys are {sorted(KEYS)}")
        out[key] = _in_range(key, _value(key, value))
    return out


def resolve(
    given: Mapping[str, Any],
    *,
    longest_request: int,
    kv_bytes_per_token: float | None,
    kv_cache_bytes: float | None = None,
) -> dict[str, Any]:
    """Every key's value: given, derived, or the default."""
    s = {key: default for key, (_, default) in KEYS.items()} | dict(given)
    bs = s["block_size"]
    if s["max_model_len"] is None:
        rounded = bs * math.ceil(longest_request / bs)
        s["max_model_len"] = min(MAX_MODEL_LEN, max(2, rounded))
    if s["num_blocks"] is None:
        if s["kv_cache_gib"] is not None:
            if kv_bytes_per_token is None:
                raise ValueError(
                    "config kv_cache_gib needs a step model that knows the model's KV bytes per "
                    "token (a roofline model, or a fitted one that records it); give num_blocks"
                )
            gib = s["kv_cache_gib"]
            s["num_blocks"] = min(MAX_NUM_BLOCKS, int(gib * 2**30 // (bs * kv_bytes_per_token)) + 1)
        elif kv_cache_bytes is not None and kv_bytes_per_token is not None:
            # What the device leaves for the KV cache, as vLLM sizes it.
            blocks = int(kv_cache_bytes // (bs * kv_bytes_per_token)) + 1
            s["num_blocks"] = min(MAX_NUM_BLOCKS, blocks)
        else:
            per_seq = math.ceil(s["max_model_len"] / bs)
            s["num_blocks"] = min(MAX_NUM_BLOCKS, s["max_num_seqs"] * per_seq + 1)
    return s


def build_scheduler(s: Mapping[str, Any]) -> CoreScheduler:
    """The core scheduler for resolved settings, checked as everywhere."""
    return CoreScheduler(
        SchedulerConfig(
            max_model_len=s["max_model_len"],
            max_num_seqs=s["max_num_seqs"],
            max_num_batched_tokens=s["max_num_batched_tokens"],
            enable_chunked_prefill=s["enable_chunked_prefill"],
            long_prefill_token_threshold=s["long_prefill_token_threshold"],
            long_prefill_token_threshold_adaptive=s["long_prefill_token_threshold_adaptive"],
            policy=s["policy"],
            scheduler_reserve_full_isl=s["scheduler_reserve_full_isl"],
            async_scheduling=s["async_scheduling"],
            max_num_scheduled_tokens=s["max_num_scheduled_tokens"],
            max_num_active_seqs=s["max_num_active_seqs"],
            watermark=s["watermark"],
            prefill_schedule_interval=s["prefill_schedule_interval"],
        ),
        CacheConfig(
            num_blocks=s["num_blocks"],
            block_size=s["block_size"],
            enable_prefix_caching=s["enable_prefix_caching"],
        ),
    )
