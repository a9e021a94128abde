"""Scheduler settings (docs/scheduling.md §2), validated like vLLM's: the
twin of ``rust/src/scheduler_config.rs``. The settings themselves are the
API's config dataclasses, read by attribute."""

from __future__ import annotations

import enum
from typing import Any, Protocol

from ironbatch.reference.error import debug_str
from ironbatch.reference.limits import (
    MAX_BLOCK_SIZE,
    MAX_MODEL_LEN,
    MAX_NUM_BATCHED_TOKENS,
    MAX_NUM_BLOCKS,
    MAX_NUM_SEQS,
    check_range,
)


class Policy(enum.Enum):
    """Which waiting request goes first, and who is preempted."""

    #: First come, first served; the last running request is the victim.
    FCFS = "fcfs"
    #: Smallest (priority, arrival_time, id) first; the largest
    #: (priority, arrival_time) running request is the victim.
    PRIORITY = "priority"


class SchedulerSettings(Protocol):
    """The settings the scheduler reads (the API's ``SchedulerConfig``)."""

    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    enable_chunked_prefill: bool
    #: Per-request per-step token cap; 0 = off.
    long_prefill_token_threshold: int
    #: "fcfs" or "priority".
    policy: str
    #: The full-prompt admission gate (docs/scheduling.md §7.6).
    scheduler_reserve_full_isl: bool
    #: vLLM's async scheduling: the next step is scheduled before this
    #: step's output arrives (docs/scheduling.md §4.9).
    async_scheduling: bool


def validate(scheduler_config: Any, cache_config: Any) -> None:
    """Check every rule of docs/scheduling.md §2, naming the first field
    that breaks one (the core's order: the cache's fields first). Whether
    the cache holds one ``max_model_len`` sequence is the engine's start-up
    check (``ironbatch.config.check_fits``), not the scheduler's: vLLM's
    scheduler runs with whatever cache it is given."""
    c = scheduler_config
    # The binding reads the policy before the core checks the sizes.
    if c.policy not in ("fcfs", "priority"):
        raise ValueError(f"policy must be 'fcfs' or 'priority', got {debug_str(str(c.policy))}")
    check_range("block_size", cache_config.block_size, 1, MAX_BLOCK_SIZE)
    check_range("max_model_len", c.max_model_len, 1, MAX_MODEL_LEN)
    check_range("num_blocks", cache_config.num_blocks, 2, MAX_NUM_BLOCKS)
    check_scheduler(c)


def check_scheduler(c: Any) -> None:
    """The scheduler's own rules, over its fields alone (the API's
    ``SchedulerConfig`` runs these too)."""
    check_range("max_num_seqs", c.max_num_seqs, 1, MAX_NUM_SEQS)
    check_range("max_model_len", c.max_model_len, 2, MAX_MODEL_LEN)
    check_range("max_num_batched_tokens", c.max_num_batched_tokens, 1, MAX_NUM_BATCHED_TOKENS)
    if c.max_num_batched_tokens < c.max_num_seqs:
        raise ValueError(
            f"max_num_batched_tokens ({c.max_num_batched_tokens}) must be >= "
            f"max_num_seqs ({c.max_num_seqs})"
        )
    if not c.enable_chunked_prefill and c.max_num_batched_tokens < c.max_model_len:
        raise ValueError(
            f"max_num_batched_tokens ({c.max_num_batched_tokens}) must be >= "
            f"max_model_len ({c.max_model_len}) when chunked prefill is off"
        )
    if c.long_prefill_token_threshold > c.max_model_len:
        raise ValueError(
            f"long_prefill_token_threshold ({c.long_prefill_token_threshold}) must be <= "
            f"max_model_len ({c.max_model_len})"
        )
