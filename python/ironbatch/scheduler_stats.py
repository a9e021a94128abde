"""SchedulerStats: what make_stats() reports."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class SchedulerStats:
    num_running_reqs: int
    num_waiting_reqs: int  # not counting the skipped ones
    num_skipped_waiting_reqs: int  # skipped by a waiting pass, not admitted since
    kv_cache_usage: float
    prefix_cache_stats: Any  # PrefixCacheStats, taken and reset
    num_preempted_reqs: int  # preemptions since the stats were last taken
