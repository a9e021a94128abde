"""The KV-cache manager (docs/scheduling.md §7.5–7.10): prefix lookups, slot
allocation with the admission gate, hash caching at allocation time, and
freeing.

It owns the block pool; requests own their ``BlockTable`` and ``Sequence``
and lend them to each call (the id-keyed registry over it is
``kv_cache_registry.KVCacheManager``). ``allocate_slots`` checks every
argument before anything changes, so a ``ValueError`` (bad input) or a
``None`` (too few free blocks) leaves the pool, the map and the table exactly
as they were.

Here: the manager, its lookups, freeing, stats and events; ``config`` holds
its settings' checks, ``allocation`` the allocation path, ``caching`` the
hash caching (the core's modules). Their functions take the manager as
their first argument and share its state attributes (``_pool``,
``_block_size``, ...); callers outside this package use the methods."""

from __future__ import annotations

from collections.abc import Sequence as Seq

from ironbatch.reference.attention_group import FULL, GroupSpec, SlidingWindow, group_key
from ironbatch.reference.block import NULL_BLOCK, Block
from ironbatch.reference.block_hash import BlockHasher
from ironbatch.reference.block_pool import BlockPool
from ironbatch.reference.block_table import BlockTable, StateSlots
from ironbatch.reference.kv_cache_manager import allocation, caching
from ironbatch.reference.kv_cache_manager.allocation import Admission
from ironbatch.reference.kv_cache_manager.boundary_states import BoundaryState, BoundaryStates
from ironbatch.reference.kv_cache_manager.config import (
    check_groups,
    group_block_sizes,
    hash_block_size,
    scheduler_block_size,
    validate,
)
from ironbatch.reference.kv_cache_manager.prefill_checkpoints import (
    StateCheckpoint,
    StateCheckpoints,
)
from ironbatch.reference.kv_events import KvEvent
from ironbatch.reference.prefix_cache_stats import PrefixCacheStats
from ironbatch.reference.prefix_hit import (
    GroupHits,
    HitQuery,
    PrefixHit,
    find_hit_per_group,
    find_longest_hit,
    lookup_groups,
)
from ironbatch.reference.sequence import Sequence

__all__ = ["Admission", "KvCacheManager", "check_groups"]


class KvCacheManager:
    """The paged KV cache's bookkeeping."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        max_model_len: int,
        enable_prefix_caching: bool,
        hasher: BlockHasher | None = None,
        *,
        num_lookahead_tokens: int = 0,
        num_hash_lookahead_tokens: int = 0,
        drop_eagle_block: bool = False,
        groups: Seq[GroupSpec] = (FULL,),
        sparse_retention: bool = True,
        retention_interval: int = 0,
        eagle_groups: Seq[int] | None = None,
        mixed_precision: bool = False,
    ) -> None:
        """A manager over a fresh pool, hashing under a random secret key
        unless ``hasher`` is given (fixed keys make tests reproducible).
        ``num_lookahead_tokens`` KV slots are reserved past each
        allocation's tokens (an EAGLE, MTP or draft-model drafter writes
        there); each block's hash covers ``num_hash_lookahead_tokens``
        tokens after it (docs/scheduling.md §7.4); without them, under
        ``drop_eagle_block`` a hit gives up its last block, which an
        EAGLE-style drafter recomputes, in the ``eagle_groups`` (vLLM's groups
        holding the drafter's layers; None or empty: every group, vLLM's
        fallback) and the groups of their kinds. ``groups`` are the
        KV-cache groups in vLLM's order (its layers' first appearance), of
        ``block_size`` unless they set their own (§7.16); under ``sparse_retention`` (vLLM's default
        ``prefix_cache_retention_interval = 0``) sliding-window groups cache
        only the blocks a later request can resume from, and with a
        ``retention_interval`` above 0 also each segment's tail. With
        ``mixed_precision`` (or a recurrent group) new attention blocks are
        listed for zeroing."""
        validate(
            num_blocks,
            block_size,
            max_model_len,
            num_lookahead_tokens,
            num_hash_lookahead_tokens,
            groups,
            enable_prefix_caching,
            drop_eagle_block,
            sparse_retention=sparse_retention,
            retention_interval=retention_interval,
            eagle_groups=eagle_groups,
        )
        self._pool = BlockPool(num_blocks)
        #: Tokens per block hash (the groups' blocks' greatest common
        #: divisor; their one block size when alike).
        self._hash_block_size = hash_block_size(groups, block_size, enable_prefix_caching)
        #: The unit hits and hash caching are aligned to (the groups'
        #: blocks' least common multiple).
        self._scheduler_block_size = scheduler_block_size(groups, block_size, enable_prefix_caching)
        #: Tokens per block of each group.
        self._group_block_sizes = group_block_sizes(groups, block_size)
        self._max_model_len = max_model_len
        self._enable_caching = bool(enable_prefix_caching)
        self._lookahead = num_lookahead_tokens
        self._groups = list(groups)
        # Per group, whether its hits give up an EAGLE block (vLLM's
        # ``drop_eagle_group_ids``): every group when none is flagged.
        n = len(self._groups)
        flagged = set(eagle_groups or range(n)) if drop_eagle_block else set()
        #: The order groups are asked for prefix hits in.
        self._lookup = lookup_groups(
            [g.kind for g in self._groups],
            self._group_block_sizes,
            [g in flagged for g in range(n)],
        )
        #: Per group, whether its hits give up an EAGLE block (its kind's
        #: lookup group's flag: vLLM gives every manager of a spec group the
        #: bit); a window caches the blocks such a hit reads (§7.13).
        self._drops_eagle = [False] * n
        for lg in self._lookup:
            for g in lg.group_ids:
                self._drops_eagle[g] = lg.drops_eagle_block
        #: One full-attention group: the common case, on the fast paths.
        self._single_full = len(self._groups) == 1 and self._groups[0].kind.is_full()
        self._drop_eagle_block = bool(drop_eagle_block)
        self._sparse_retention = bool(sparse_retention)
        self._retention_interval = retention_interval
        #: Computed tokens at a sequence's end that are not hash cached: a
        #: multi-module drafter may prefill them again (§4.13).
        self._reprefillable = 0
        hasher = BlockHasher() if hasher is None else hasher
        self._hasher = hasher.with_lookahead(num_hash_lookahead_tokens)
        self._stats = PrefixCacheStats()
        # Attention groups' blocks handed out since the last step's output,
        # group by group, when a recurrent group shares the pool or the KV
        # has mixed precisions (vLLM's ``new_block_ids_to_zero``); None
        # otherwise.
        zeroes = mixed_precision or any(g.kind.is_recurrent() for g in self._groups)
        self._blocks_to_zero: list[list[int]] | None = (
            [[] for _ in self._groups] if zeroes else None
        )
        #: Recurrent groups cache their states (vLLM's cache mode "align"):
        #: prefix caching on beside a recurrent group.
        self._align = self._enable_caching and any(g.kind.is_recurrent() for g in self._groups)
        #: The recurrent groups' keys cached this step: a state is written by
        #: the step's forward pass, so no request may hit it before the next
        #: step (vLLM's ``cached_blocks_this_step``).
        self._states_cached_this_step: set[int] = set()
        #: Cached recurrent states offered to a KV connector (§4.19.2).
        self._boundary_states = BoundaryStates()
        #: The prefill checkpoint the allocation in progress writes, if any
        #: (§7.15): its caching keys the checkpoint's block.
        self._step_checkpoint: StateCheckpoint | None = None
        #: Each request's latest planned checkpoint, which its caching keys
        #: until its next allocation (an output's caching between steps).
        self._state_checkpoints = StateCheckpoints()

    def with_reprefillable_tokens(self, tokens: int) -> KvCacheManager:
        """The same manager, minding the last ``tokens`` computed tokens of
        each sequence (multi-module MTP's re-prefilled tokens: its
        drafter's read-ahead less one, §4.13): one group leaves them out of
        the hash cache, a window keeps their blocks (§7.7, §7.13)."""
        self._reprefillable = tokens
        return self

    @property
    def hasher(self) -> BlockHasher:
        """The hasher every request of this cache must use for its chain."""
        return self._hasher

    @property
    def pool(self) -> BlockPool:
        """The block pool, for inspection."""
        return self._pool

    def is_cached_in(self, block_hash: int, group: int) -> bool:
        """Whether a block ending at ``block_hash`` is cached in group
        ``group`` now."""
        return self._pool.get_cached_block(group_key(block_hash, group)) is not None

    @property
    def hash_block_size(self) -> int:
        """Tokens per block hash: what a request's hash chain is cut at
        (vLLM's ``hash_block_size``; the block size when the groups' are
        alike)."""
        return self._hash_block_size

    @property
    def scheduler_block_size(self) -> int:
        """The unit prefix hits and hash caching are aligned to (vLLM's
        ``scheduler_block_size``; the block size when the groups' are
        alike)."""
        return self._scheduler_block_size

    @property
    def group_block_sizes(self) -> list[int]:
        """Tokens per block of each group."""
        return self._group_block_sizes

    @property
    def groups(self) -> list[GroupSpec]:
        """The KV-cache groups."""
        return self._groups

    @property
    def max_model_len(self) -> int:
        return self._max_model_len

    @property
    def enable_prefix_caching(self) -> bool:
        return self._enable_caching

    @property
    def num_free_blocks(self) -> int:
        """Free blocks (cached-but-unreferenced ones included)."""
        return self._pool.num_free_blocks

    @property
    def usage(self) -> float:
        """Fraction of usable blocks held by requests."""
        return self._pool.usage

    def record_blocks_for_zeroing(self, tables: list[BlockTable], start_token: int) -> None:
        """List group by group the blocks from token ``start_token`` on for
        zeroing again, where zeroing applies: blocks a failed asynchronous
        load left unwritten, whose zeroing was skipped (vLLM's
        ``record_blocks_for_zeroing``)."""
        if self._blocks_to_zero is None:
            return
        for g, table in enumerate(tables):
            if not self._groups[g].kind.is_recurrent():
                start = min(start_token // self._group_block_sizes[g], len(table))
                self._blocks_to_zero[g].extend(b.block_id for b in table.blocks[start:])

    def take_blocks_to_zero(self) -> list[int]:
        """The attention groups' blocks handed out since the last call, group
        by group in allocation order; empty without recurrent groups."""
        if self._blocks_to_zero is None:
            return []
        out = [b for group in self._blocks_to_zero for b in group]
        self._blocks_to_zero = [[] for _ in self._groups]
        return out

    def caches_states(self) -> bool:
        """Whether recurrent groups cache their states (vLLM's cache mode
        "align": prefix caching on beside a recurrent group)."""
        return self._align

    def state_checkpoint(self, num_tokens: int, unit: int) -> int:
        """The last multiple of ``unit`` tokens whose state a later request
        with the same ``num_tokens`` tokens could resume from (vLLM's
        ``get_mamba_prefill_checkpoint_position``): its last token is always
        computed, and a lookahead hash needs its tokens known; an EAGLE-style
        drafter's hit gives up a unit more. vLLM asks it at the scheduler
        block, where hits land (the prompt's checkpoint), and at the hash
        block (how far a chunk may run, which state the prompt's last
        caching keys); the two differ only when the groups' block sizes do
        (§7.16)."""
        if self._drop_eagle_block:
            return max(num_tokens // unit * unit - unit, 0)
        proof_limit = max(num_tokens - max(self._hasher.lookahead, 1), 0)
        return proof_limit // unit * unit

    def checkpoint_alignment(self) -> int | None:
        """The query offsets at which the recurrent groups write a prefill
        checkpoint from inside a chunk, when they cache states and can."""
        if not self._align:
            return None
        recurrent = next(g for g in self._groups if g.kind.is_recurrent())
        return recurrent.kind.prefill_checkpoint_alignment()

    def new_step_starts(self) -> None:
        """A step begins: states cached by the last one are readable now."""
        self._states_cached_this_step.clear()

    def group_block_size(self, g: int) -> int:
        """Tokens per block of group ``g``."""
        return self._group_block_sizes[g]

    def group_block_hash(self, hashes: list[int], g: int, k: int) -> int | None:
        """Group ``g``'s block ``k``'s hash: the chain's hash where the block
        ends (a block of several hash blocks is keyed by its last one, which
        chains its whole prefix: vLLM's ``BlockHashListWithBlockSize``)."""
        i = (k + 1) * (self._group_block_sizes[g] // self._hash_block_size) - 1
        return hashes[i] if i < len(hashes) else None

    def skipped_blocks(self, g: int, processed: int) -> int:
        """Group ``g``'s leading blocks no position after ``processed``
        tokens reads. A window also keeps the blocks of the last tokens
        that multi-module MTP may prefill again (vLLM's
        ``extra_retained_tokens`` on every sliding-window spec), though it
        no longer attends to them."""
        return self.skipped_tokens(g, processed) // self.group_block_size(g)

    def skipped_tokens(self, g: int, processed: int) -> int:
        """Group ``g``'s leading tokens no position after ``processed``
        tokens reads (vLLM's ``get_num_skipped_tokens``), not rounded to
        blocks."""
        kind = self._groups[g].kind
        if isinstance(kind, SlidingWindow):
            processed = max(processed - self._reprefillable, 0)
        return kind.num_skipped_tokens(processed)

    def cached_positions(self, tables: list[BlockTable]) -> list[list[int]]:
        """Per table, the positions whose block has a block hash (what a KV
        connector reading vLLM's blocks sees as cached)."""
        return [
            [i for i, b in enumerate(t.blocks) if b.block_id != NULL_BLOCK and b.hash is not None]
            for t in tables
        ]

    def slot_of(self, g: int, table: BlockTable, pos: int) -> int:
        """The KV-cache slot of position ``pos`` in a request's group ``g``
        ``table``."""
        bs = self._group_block_sizes[g]
        return table.blocks[pos // bs].block_id * bs + pos % bs

    def get_computed_blocks(self, seq: Sequence) -> tuple[list[Block], int]:
        """The longest cached prefix of ``seq`` in whole blocks, capped at
        ``num_tokens - 1`` tokens so the last token is always computed (Q12):
        the hit blocks and the hit token count. Changes nothing."""
        if not self._enable_caching:
            return [], 0
        # One group: its blocks are the hash blocks.
        max_hit_blocks = max(seq.num_tokens - 1, 0) // self._hash_block_size
        hits = []
        for block_hash in seq.block_hashes[:max_hit_blocks]:
            block = self._pool.get_cached_block(block_hash)
            if block is None:
                break  # chained hashes: once one block misses, every later one does
            hits.append(block)
        return hits, len(hits) * self._hash_block_size

    def find_hit(self, seq: Sequence, max_tokens: int | None = None) -> PrefixHit:
        """The longest prefix hit valid for every group (docs/scheduling.md
        §7.5), capped at ``num_tokens - 1`` tokens so the last token is
        always computed (Q12), and at ``max_tokens`` when given (an
        auxiliary-output retention's reach; one full-attention group never
        reaches past it), with each group's blocks (the null block where a
        window needs none), ``tokens / bs`` of them. Changes nothing."""
        num_groups = len(self._groups)
        if not self._enable_caching:
            return PrefixHit(blocks=[[] for _ in range(num_groups)])
        if self._single_full:
            hits, tokens = self.get_computed_blocks(seq)
            if self._drop_eagle_block and tokens > 0:
                # The drafter recomputes the hit's last block (§7.4).
                hits.pop()
                tokens -= self._hash_block_size  # one group: its block
            return PrefixHit(tokens, 0, [hits])
        return find_longest_hit(
            self._pool, self._lookup, self._hit_query(seq, max_tokens), num_groups
        )

    def _hit_query(self, seq: Sequence, max_tokens: int | None) -> HitQuery:
        """The lookup of ``seq``'s prefix: short of its last token, and no
        further than ``max_tokens`` when given."""
        max_len = max(seq.num_tokens - 1, 0)
        if max_tokens is not None:
            max_len = min(max_len, max_tokens)
        return HitQuery(
            seq.block_hashes, max_len, self._hash_block_size, self._scheduler_block_size
        )

    def find_hit_per_group(self, seq: Sequence, max_tokens: int | None = None) -> GroupHits | None:
        """The local hit told to a KV connector that completes divergent
        hybrid hits (vLLM's ``get_computed_blocks_for_connector``, §4.19.2),
        beside cached recurrent states and full attention: each group's own
        hit, the full-attention one the hit. None where vLLM takes
        :meth:`find_hit` instead: no such layout, or a group that hit past
        full attention (whose blocks then went). Changes nothing."""
        if not self._lookup or not self._lookup[0].kind.is_full():
            return None
        if not self._align or len(self._groups) < 2:
            return None
        blocks: list[list[Block]] = [[] for _ in self._groups]
        query = self._hit_query(seq, max_tokens)
        by_group = find_hit_per_group(self._pool, self._lookup, query, blocks)
        tokens = by_group[self._lookup[0].group_ids[0]]
        if any(t > tokens for t in by_group):
            return None
        return GroupHits(tokens, any(t < tokens for t in by_group), blocks)

    def allocate_slots(
        self,
        table: BlockTable,
        seq: Sequence,
        num_new_tokens: int,
        num_new_computed_tokens: int,
        new_computed_blocks: list[int],
        full_sequence_must_fit: bool,
    ) -> int | None:
        """Make room for ``num_new_tokens`` more tokens of ``seq``, after
        taking the ``new_computed_blocks`` prefix hits (covering
        ``num_new_computed_tokens``).

        Returns how many new blocks the table grew by (its last ones), None
        when too few blocks are free, and raises ``ValueError`` for arguments
        no correct scheduler passes; nothing changes unless it returns a
        count. With ``full_sequence_must_fit`` the whole known sequence must
        fit too (the admission gate, Q13). One full-attention group only."""
        return allocation.allocate_slots(
            self,
            table,
            seq,
            num_new_tokens,
            num_new_computed_tokens,
            new_computed_blocks,
            full_sequence_must_fit,
        )

    def allocate(
        self,
        tables: list[BlockTable],
        seq: Sequence,
        num_new_tokens: int,
        num_new_computed_tokens: int,
        hits: list[list[Block]],
        admission: Admission,
        in_flight: int,
    ) -> int | None:
        """``allocate_slots`` over every group's table, with arguments the
        caller guarantees (the scheduler's own): the number of new blocks
        per group, or None. ``hits`` holds one list per group (or none);
        ``in_flight`` of the computed tokens are still being computed.
        Before the step's own check, window groups give back the blocks no
        position reads any more (whether or not the allocation succeeds, as
        vLLM's does); nothing else changes on None."""
        return allocation.allocate(
            self, tables, seq, num_new_tokens, num_new_computed_tokens, hits, admission, in_flight
        )

    def blocks_to_hold(self, tables: list[BlockTable], slots: int, seq: Sequence) -> int:
        """Blocks a running request's ``tables`` still take to hold
        ``slots`` tokens, each window group's up to its admission cap."""
        return allocation.blocks_to_hold(self, tables, slots, seq)

    def draft_step_blocks(self, tokens: int) -> int:
        """The blocks one step of ``tokens`` drafted tokens takes in each
        group with per-token slots."""
        return allocation.draft_step_blocks(self, tokens)

    def remove_blocks_out_of_window(self, tables: list[BlockTable], processed: int) -> None:
        """Give back every window group's blocks that no position after
        ``processed`` tokens reads."""
        allocation.remove_blocks_out_of_window(self, tables, processed)

    def cache_full_blocks(
        self, tables: list[BlockTable], seq: Sequence, upto: int, owner: int
    ) -> None:
        """Hash-cache every group's full blocks up to token ``upto``, when
        prefix caching is on; the async update caches the blocks its tokens
        filled, a KV connector's load those it wrote, once reported
        (§4.19). The stores' events name ``owner``, the request's slot."""
        caching.cache_full_blocks(self, tables, seq, upto, owner)

    def num_cached_tokens(self, tables: list[BlockTable]) -> int:
        """Tokens the request holds in hash-cached blocks, as vLLM estimates
        them: per group, where its last held cached block ends; the least
        over the groups."""
        return caching.num_cached_tokens(self, tables)

    def free(self, tables: list[BlockTable]) -> None:
        """Release every group's table, in group order, each last block
        first: unhashed blocks go to the head of the free queue, cached ones
        to the tail (docs/scheduling.md §7.9, Q2); null positions hold
        nothing."""
        for table in tables:
            self._pool.release([b for b in reversed(table.blocks) if b.block_id != NULL_BLOCK])
            table.blocks.clear()
            table.num_cached = 0
            table.states = StateSlots()

    def take_blocks(self, tables: list[BlockTable]) -> list[int]:
        """Empty every group's table without returning its blocks to the
        pool; returns them in allocation order, group by group (vLLM's
        ``pop_blocks_for_free``), for ``release_blocks_last_first``."""
        blocks: list[int] = []
        for table in tables:
            blocks += [b.block_id for b in table.blocks if b.block_id != NULL_BLOCK]
            table.blocks.clear()
            table.num_cached = 0
            table.states = StateSlots()
        return blocks

    def touch_blocks(self, block_ids: list[int]) -> None:
        """Add a reference to each listed usable block from outside any
        request (vLLM's ``BlockPool.touch``), checked: a free one leaves the
        queue."""
        self._pool.touch(block_ids)

    def free_touched_blocks(self, block_ids: list[int]) -> None:
        """Drop references ``touch_blocks`` took, in the order given
        (vLLM's ``BlockPool.free_blocks``), checked."""
        self._pool.free_blocks(block_ids)

    def release_blocks_last_first(self, block_ids: list[int]) -> None:
        """Return blocks taken by ``take_blocks`` to the pool, the last first."""
        self._pool.release_ids(list(reversed(block_ids)))

    def uncache_blocks(self, block_ids: list[int]) -> None:
        """Take blocks out of the prefix cache (ids checked by the caller)."""
        self._pool.uncache(block_ids)

    def record_prefix_cache_stats(
        self, num_tokens: int, num_hit_tokens: int, preempted: bool
    ) -> None:
        """Count one admission (docs/scheduling.md §7.10); only with prefix
        caching on."""
        if self._enable_caching:
            self._stats.record(num_tokens, num_hit_tokens, preempted)

    def make_prefix_cache_stats(self) -> PrefixCacheStats:
        """Take the counters, leaving zeros."""
        stats, self._stats = self._stats, PrefixCacheStats()
        return stats

    def enable_events(self) -> None:
        """Log KV-cache events from now on (docs/scheduling.md §7.12)."""
        self._pool.events.enable()

    def enable_lifecycle_events(self) -> None:
        """Log blocks' lives (residency metrics) from now on."""
        self._pool.events.enable_lifecycle()

    def enable_boundary_states(self) -> None:
        """Offer each state block a recurrent group caches in mode "align"
        to a KV connector from now on (§4.19.2)."""
        self._boundary_states.enable()

    def take_boundary_states(self) -> list[BoundaryState]:
        """The state blocks offered since last taken, oldest first."""
        return self._boundary_states.take()

    def withdraw_boundary_states(self, owner: int) -> None:
        """Withdraw the offers of the request in ``owner``, whose blocks go
        back."""
        self._boundary_states.withdraw(owner)

    def enable_request_events(self) -> None:
        """Log requests' lookups and releases from now on (§7.12)."""
        self._pool.events.enable_requests()

    @property
    def events_enabled(self) -> bool:
        """Whether KV-cache events (routers') are logged."""
        return self._pool.events.enabled

    def log_event(self, event: KvEvent) -> None:
        """Log an event the caller knows of (hits: only the caller knows whose
        lookup it is; stores are logged as the tables are cached)."""
        self._pool.events.push(event)

    def take_events(self) -> list[KvEvent]:
        """The events since last taken, oldest first."""
        return self._pool.events.take()

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash if no block is held; returns whether it
        did. Without a KV cache there is no pool to reset: it succeeds, and
        no event says so (vLLM's coordinator resets none)."""
        done = not self._groups or self._pool.reset_prefix_cache()
        if done:
            self._stats.reset = True
        return done
