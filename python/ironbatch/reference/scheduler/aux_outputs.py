"""Auxiliary outputs (routed experts) in the scheduler (docs/scheduling.md
§7.12): the retention of the workers' per-block routing is told what vLLM's
scheduler tells its auxiliary-output connector, at the same moments, and
caps prefix hits as that connector does."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from ironbatch.reference.aux_output_retention import AuxOutputRetention, Cached
from ironbatch.reference.kv_connector import ExternalHit

if TYPE_CHECKING:
    from ironbatch.reference.scheduler import Scheduler


def enable_aux_outputs(s: Scheduler) -> None:
    """Follow auxiliary outputs from now on (vLLM's
    ``--enable-return-routed-experts``): prefix hits reach only over blocks
    whose routing the workers hold. Keyed by the first full-attention
    group's blocks, else group 0's."""
    groups = s.kv.groups
    group = next((i for i, g in enumerate(groups) if g.kind.is_full()), 0)
    block_size = s.kv.group_block_size(group) if groups else s.kv.hash_block_size
    s.aux_retention = AuxOutputRetention(group, block_size, s.kv.hash_block_size)


def aux_max_cache_hit(s: Scheduler, slot: int) -> int | None:
    """How far the prefix hit of the request in ``slot`` may reach, where
    vLLM's scheduler asks before its lookup (None: no auxiliary outputs)."""
    retention = s.aux_retention
    if retention is None:
        return None
    seq = s.requests[slot].seq
    return retention.max_cache_hit(seq.block_hashes, seq.num_tokens, _cached(s, retention))


def aux_cap_external_hit(
    s: Scheduler, slot: int, num_local: int, external: ExternalHit
) -> ExternalHit:
    """A connector's hit past ``num_local`` local tokens for the request in
    ``slot``, capped where the workers hold no routing for it."""
    retention = s.aux_retention
    if retention is None:
        return external
    seq = s.requests[slot].seq
    num_tokens = retention.cap_external_hit(
        seq.block_hashes, seq.num_tokens, num_local, external.num_tokens, _cached(s, retention)
    )
    return ExternalHit(num_tokens, external.load_async and num_tokens > 0)


def aux_request_loading(s: Scheduler, slot: int, num_tokens: int) -> None:
    """The request in ``slot`` starts loading its first ``num_tokens``
    tokens' KV from a connector."""
    if s.aux_retention is not None:
        s.aux_retention.request_loading(slot, s.requests[slot].seq.block_hashes, num_tokens)


def aux_request_finished(s: Scheduler, slot: int) -> None:
    """The request in ``slot`` gives its blocks back (finished or
    preempted), before they go."""
    retention = s.aux_retention
    if retention is None:
        return
    # The workers keep a block per KV-cache block, twice that beside a KV
    # connector (whose loads bring routing back with their KV).
    per_block = 2 if s.connector is not None else 1
    capacity = s.kv.pool.num_blocks * per_block
    seq = s.requests[slot].seq
    retention.request_finished(
        slot, seq.block_hashes, seq.num_computed_tokens, capacity, _cached(s, retention)
    )


def aux_scheduled(s: Scheduler, slots: Iterable[int]) -> None:
    """A step scheduled the requests in ``slots`` (vLLM tells its connector
    as it builds the step's metadata)."""
    if s.aux_retention is not None:
        for slot in slots:
            s.aux_retention.scheduled(slot)


def aux_reset(s: Scheduler) -> None:
    """The prefix cache was reset."""
    if s.aux_retention is not None:
        s.aux_retention.reset()


def _cached(s: Scheduler, retention: AuxOutputRetention) -> Cached:
    group = retention.group
    return lambda block_hash: s.kv.is_cached_in(block_hash, group)
