"""KV-cache events (docs/scheduling.md §7.12): what vLLM publishes to KV-aware
routers as ``BlockStored``, ``BlockRemoved`` and ``AllBlocksCleared``, logged
where and in the order vLLM creates them. The core's block hashes are its
own, so a ``Stored`` names the request and its blocks; the caller, who has
vLLM's hashes of that request's tokens, builds vLLM's event from it.

A second kind, off unless asked for separately, follows each block's life
(handed out, hit) for vLLM's KV-cache residency metrics, which sample blocks
and time them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Stored:
    """The request in ``owner`` hash-cached group ``group``'s full blocks
    ``first_block..first_block + len(block_ids)`` (vLLM's ``BlockStored``
    from caching full blocks, one per group in group order); ``block_ids``
    holds each one's id, or the null block where a window group holds none
    or keeps it out of the cache (§7.13)."""

    owner: int
    group: int
    first_block: int
    block_ids: list[int]


@dataclass(frozen=True)
class StoredKey:
    """The request in ``owner`` keyed group ``group``'s block ``block_id``
    by the hash at ``num_hash_blocks`` hash blocks, inside the block or
    where it ends (vLLM's ``BlockStored`` from ``cache_partial_block``: a
    prompt's recurrent state, a full-attention prompt tail beside groups of
    different block sizes, §7.15–7.16). A block keyed already gets it as a
    second key; its ``Removed`` then ends both."""

    owner: int
    group: int
    num_hash_blocks: int
    block_id: int


@dataclass(frozen=True)
class Hit:
    """A lookup found the first ``num_blocks`` hash blocks of the request in
    ``owner`` cached; logged only for requests that ask (vLLM's
    ``kv_cache_report_mode="full"``), at every lookup with a hit."""

    owner: int
    num_blocks: int


@dataclass(frozen=True)
class Removed:
    """A cached block lost its keys: evicted to be reused, or re-keyed
    (vLLM's ``BlockRemoved``, one per key)."""

    block_id: int


@dataclass(frozen=True)
class Cleared:
    """The prefix cache was reset (vLLM's ``AllBlocksCleared``; the residency
    metrics start over)."""


@dataclass(frozen=True)
class Allocated:
    """A block was handed out by ``get_new_blocks`` (evicted first when
    cached): a residency-metrics event."""

    block_id: int


@dataclass(frozen=True)
class Accessed:
    """A cached block was hit (vLLM's ``touch``): a residency-metrics event."""

    block_id: int


@dataclass(frozen=True)
class Evicted:
    """A block's residency ends without its being handed out again: a
    prefill checkpoint's state that no later request can resume from
    (vLLM's ``_maybe_evict_cached_block``, which ends it whether or not the
    block is cached): a residency-metrics event."""

    block_id: int


@dataclass(frozen=True)
class Lookup:
    """The waiting pass looked up the prefix of the request in ``owner``,
    which had computed nothing (where vLLM's scheduler asks its
    auxiliary-output connector how far a hit may reach): a request event."""

    owner: int


@dataclass(frozen=True)
class Released:
    """The request in ``owner`` gives its blocks back, finished or
    preempted, having computed ``num_computed_tokens`` (where vLLM's
    scheduler tells its auxiliary-output connector that the request
    finished): a request event."""

    owner: int
    num_computed_tokens: int


@dataclass(frozen=True)
class Loading:
    """The request in ``owner`` starts loading its KV from a KV connector,
    ``num_computed_tokens`` tokens once loaded (where vLLM's scheduler tells
    its auxiliary-output connector the request is loading): a request
    event."""

    owner: int
    num_computed_tokens: int


KvEvent = (
    Stored
    | StoredKey
    | Hit
    | Removed
    | Cleared
    | Allocated
    | Accessed
    | Evicted
    | Lookup
    | Released
    | Loading
)


class KvEventLog:
    """The events since they were last taken; each kind off unless enabled."""

    def __init__(self) -> None:
        self._events: list[KvEvent] = []
        #: Routers' events: stored, hit, removed, cleared.
        self._routing = False
        #: Blocks' lives for the residency metrics: allocated, accessed, cleared.
        self._lifecycle = False
        #: Requests' lookups and releases, in order among the others: what an
        #: auxiliary-output connector follows (§7.12).
        self._requests = False

    def enable(self) -> None:
        """Log routers' events from now on."""
        self._routing = True

    def enable_lifecycle(self) -> None:
        """Log blocks' lives (residency metrics) from now on."""
        self._lifecycle = True

    def enable_requests(self) -> None:
        """Log requests' lookups and releases from now on."""
        self._requests = True

    @property
    def enabled(self) -> bool:
        """Whether routers' events are logged."""
        return self._routing

    @property
    def lifecycle_enabled(self) -> bool:
        """Whether blocks' lives are logged."""
        return self._lifecycle

    def push(self, event: KvEvent) -> None:
        """Log ``event`` when its kind is enabled."""
        if isinstance(event, (Allocated, Accessed, Evicted)):
            on = self._lifecycle
        elif isinstance(event, Cleared):
            on = self._routing or self._lifecycle
        elif isinstance(event, (Lookup, Released, Loading)):
            on = self._requests
        else:
            on = self._routing
        if on:
            self._events.append(event)

    def take(self) -> list[KvEvent]:
        """The events so far, oldest first, leaving none."""
        events, self._events = self._events, []
        return events
