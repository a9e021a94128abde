"""Prefix-cache counters (docs/scheduling.md §7.10), recorded once per
admission."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PrefixCacheStats:
    """Counters since the last time they were taken."""

    #: Whether the prefix cache was reset meanwhile.
    reset: bool = False
    #: Admissions of requests never preempted, the tokens they looked up,
    #: and the tokens found cached.
    requests: int = 0
    queries: int = 0
    hits: int = 0
    #: The same for re-admissions of preempted requests.
    preempted_requests: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0

    def record(self, num_tokens: int, num_hit_tokens: int, preempted: bool) -> None:
        """Count one admission of a request with ``num_tokens`` known
        tokens, of which ``num_hit_tokens`` were prefix-cache hits."""
        if preempted:
            self.preempted_requests += 1
            self.preempted_queries += num_tokens
            self.preempted_hits += num_hit_tokens
        else:
            self.requests += 1
            self.queries += num_tokens
            self.hits += num_hit_tokens
