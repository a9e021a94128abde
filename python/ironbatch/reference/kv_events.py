"""KV-cache events (docs/scheduling.md §7.12): what vLLM publishes to KV-aware
routers as ``BlockStored``, ``BlockRemoved`` and ``AllBlocksCleared``, logged
where and in the order vLLM creates them. The core's block hashes are its
own, so a ``Stored`` names the request and its blocks; the caller, who has
vLLM's hashes of that request's tokens, builds vLLM's event from it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Stored:
    """The request in ``owner`` hash-cached its blocks ``first_block..``,
    whose ids are ``block_ids`` (vLLM's ``BlockStored`` from caching)."""

    owner: int
    first_block: int
    block_ids: list[int]


@dataclass(frozen=True)
class Hit:
    """A lookup found the first ``num_blocks`` blocks of the request in
    ``owner`` cached; logged only for requests that ask (vLLM's
    ``kv_cache_report_mode="full"``), at every lookup with a hit."""

    owner: int
    num_blocks: int


@dataclass(frozen=True)
class Removed:
    """A cached block was evicted to be reused (vLLM's ``BlockRemoved``)."""

    block_id: int


@dataclass(frozen=True)
class Cleared:
    """The prefix cache was reset (vLLM's ``AllBlocksCleared``)."""


KvEvent = Stored | Hit | Removed | Cleared


class KvEventLog:
    """The events since they were last taken; off unless enabled."""

    def __init__(self) -> None:
        self._events: list[KvEvent] | None = None

    def enable(self) -> None:
        """Start logging."""
        if self._events is None:
            self._events = []

    @property
    def enabled(self) -> bool:
        return self._events is not None

    def push(self, event: KvEvent) -> None:
        """Log ``event`` when enabled."""
        if self._events is not None:
            self._events.append(event)

    def take(self) -> list[KvEvent]:
        """The events so far, oldest first, leaving none."""
        if self._events is None:
            return []
        events, self._events = self._events, []
        return events
