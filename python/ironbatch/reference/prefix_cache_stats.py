"""Prefix-cache counters (spec §7.10), recorded once per admission."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PrefixCacheStats:
    reset: bool = False
    requests: int = 0
    queries: int = 0
    hits: int = 0
    preempted_requests: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0

    def record(self, num_tokens: int, num_hit_tokens: int, preempted: bool) -> None:
        if preempted:
            self.preempted_requests += 1
            self.preempted_queries += num_tokens
            self.preempted_hits += num_hit_tokens
        else:
            self.requests += 1
            self.queries += num_tokens
            self.hits += num_hit_tokens
