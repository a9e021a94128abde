"""The KV-cache manager (docs/scheduling.md §7.5–7.10): prefix lookups, slot
allocation with the admission gate, hash caching at allocation time, and
freeing.

It owns the block pool; requests own their ``BlockTable`` and ``Sequence``
and lend them to each call (the id-keyed registry over it is
``kv_cache_registry.KVCacheManager``). ``allocate_slots`` checks every
argument before anything changes, so a ``ValueError`` (bad input) or a
``None`` (too few free blocks) leaves the pool, the map and the table exactly
as they were."""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass

from ironbatch.reference.attention_group import (
    FULL,
    ChunkedLocal,
    GroupSpec,
    SlidingWindow,
    group_key,
    sparse_mask,
)
from ironbatch.reference.block import NULL_BLOCK, Block, cdiv
from ironbatch.reference.block_hash import BlockHasher
from ironbatch.reference.block_pool import BlockPool
from ironbatch.reference.block_table import BlockTable
from ironbatch.reference.kv_events import KvEvent
from ironbatch.reference.limits import (
    MAX_BLOCK_SIZE,
    MAX_KV_CACHE_GROUPS,
    MAX_MODEL_LEN,
    MAX_NUM_BLOCKS,
    check_range,
)
from ironbatch.reference.prefix_cache_stats import PrefixCacheStats
from ironbatch.reference.prefix_hit import PrefixHit, find_longest_hit, lookup_groups
from ironbatch.reference.sequence import Sequence


@dataclass(frozen=True)
class Admission:
    """What an admission's allocation checks besides the step's own blocks."""

    #: The whole known sequence must fit too (the admission gate, Q13).
    full_sequence_must_fit: bool = False
    #: Blocks that must stay free beyond what is taken (vLLM's watermark).
    watermark: int = 0


def check_groups(groups: Seq[GroupSpec], num_hash_lookahead_tokens: int) -> None:
    """The KV-cache groups' rules, after the cache's sizes (the core's
    ``KvCacheConfig::validate`` order): how many, each window and chunk in
    range, and no hash lookahead across several groups."""
    check_range("kv_cache_groups", len(groups), 1, MAX_KV_CACHE_GROUPS)
    for g in groups:
        if isinstance(g.kind, SlidingWindow):
            check_range("sliding_window", g.kind.window, 1, MAX_MODEL_LEN)
        elif isinstance(g.kind, ChunkedLocal):
            check_range("attention_chunk_size", g.kind.chunk, 1, MAX_MODEL_LEN)
    if len(groups) > 1 and num_hash_lookahead_tokens > 0:
        raise ValueError("num_hash_lookahead_tokens must be 0 with several KV-cache groups")


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
        groups: Seq[GroupSpec] = (FULL,),
        sparse_retention: bool = True,
    ) -> None:
        """A manager over a fresh pool, hashing under a random secret key
        unless ``hasher`` is given (fixed keys make tests reproducible).
        ``num_lookahead_tokens`` KV slots are reserved past each
        allocation's tokens (an EAGLE, MTP or draft-model drafter writes
        there); each block's hash covers ``num_hash_lookahead_tokens``
        tokens after it (docs/scheduling.md §7.4). ``groups`` are the
        KV-cache groups in vLLM's order (its layers' first appearance), all
        of ``block_size``; under ``sparse_retention`` (vLLM's default
        ``prefix_cache_retention_interval = 0``) sliding-window groups cache
        only the blocks a later request can resume from."""
        # The core's KvCacheConfig::validate order: the first bad field is named.
        check_range("block_size", block_size, 1, MAX_BLOCK_SIZE)
        check_range("max_model_len", max_model_len, 1, MAX_MODEL_LEN)
        check_range("num_blocks", num_blocks, 2, MAX_NUM_BLOCKS)
        check_range("num_lookahead_tokens", num_lookahead_tokens, 0, max_model_len)
        # A block's hash covers at most the next block.
        check_range("num_hash_lookahead_tokens", num_hash_lookahead_tokens, 0, block_size)
        check_groups(groups, num_hash_lookahead_tokens)
        self._pool = BlockPool(num_blocks)
        self._block_size = block_size
        self._max_model_len = max_model_len
        self._enable_caching = bool(enable_prefix_caching)
        self._lookahead = num_lookahead_tokens
        self._groups = list(groups)
        #: The order groups are asked for prefix hits in.
        self._lookup = lookup_groups([g.kind for g in self._groups])
        #: One full-attention group: the common case, on the fast paths.
        self._single_full = len(self._groups) == 1 and self._groups[0].kind.is_full()
        self._sparse_retention = bool(sparse_retention)
        hasher = BlockHasher() if hasher is None else hasher
        self._hasher = hasher.with_lookahead(num_hash_lookahead_tokens)
        self._stats = PrefixCacheStats()

    @property
    def hasher(self) -> BlockHasher:
        """The hasher every request of this cache must use for its chain."""
        return self._hasher

    @property
    def pool(self) -> BlockPool:
        """The block pool, for inspection."""
        return self._pool

    @property
    def block_size(self) -> int:
        return self._block_size

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

    def slot_of(self, table: BlockTable, pos: int) -> int:
        """The KV-cache slot of position ``pos`` in a request's ``table``."""
        bs = self._block_size
        return table.blocks[pos // bs].block_id * bs + pos % bs

    def get_computed_blocks(self, seq: Sequence) -> tuple[list[Block], int]:
        """The longest cached prefix of ``seq`` in whole blocks, capped at
        ``num_tokens - 1`` tokens so the last token is always computed (Q12):
        the hit blocks and the hit token count. Changes nothing."""
        if not self._enable_caching:
            return [], 0
        max_hit_blocks = max(seq.num_tokens - 1, 0) // self._block_size
        hits = []
        for block_hash in seq.block_hashes[:max_hit_blocks]:
            block = self._pool.get_cached_block(block_hash)
            if block is None:
                break  # chained hashes: once one block misses, every later one does
            hits.append(block)
        return hits, len(hits) * self._block_size

    def find_hit(self, seq: Sequence) -> PrefixHit:
        """The longest prefix hit valid for every group (docs/scheduling.md
        §7.5), capped at ``num_tokens - 1`` tokens so the last token is
        always computed (Q12), with each group's blocks (the null block
        where a window needs none), ``tokens / bs`` of them. Changes
        nothing."""
        num_groups = len(self._groups)
        if not self._enable_caching:
            return PrefixHit(blocks=[[] for _ in range(num_groups)])
        if self._single_full:
            hits, tokens = self.get_computed_blocks(seq)
            return PrefixHit(tokens, 0, [hits])
        return find_longest_hit(
            self._pool,
            self._lookup,
            seq.block_hashes,
            max(seq.num_tokens - 1, 0),
            self._block_size,
            num_groups,
        )

    def _blocks_needed(
        self, g: int, table: BlockTable, tokens: int, hits: list[Block], capped: bool
    ) -> int:
        """Blocks group ``g`` must take to cover ``tokens`` after its
        ``hits``: positions not held yet, plus hits that sit in the free
        queue (taking them shrinks the free count too). ``capped``: the
        admission check, which counts a window group's blocks only up to its
        cap."""
        required = cdiv(tokens, self._block_size)
        cap = self._groups[g].admission_cap_blocks
        if capped and cap is not None:
            required = min(required, cap)
        have = len(table) + len(hits)
        evictable_hits = sum(1 for b in hits if b.block_id != NULL_BLOCK and b.ref_cnt == 0)
        return max(required - have, 0) + evictable_hits

    def _blocks_needed_all(
        self, tables: list[BlockTable], tokens: int, hits: list[list[Block]], capped: bool
    ) -> int:
        """Blocks all groups must take (``hits``: one list per group, or none)."""
        return sum(
            self._blocks_needed(g, table, tokens, hits[g] if hits else [], capped)
            for g, table in enumerate(tables)
        )

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
        if not self._single_full:
            raise ValueError(
                "allocate_slots: a cache of several KV-cache groups allocates through the scheduler"
            )
        hits = self._check_allocation(
            table, seq, num_new_tokens, num_new_computed_tokens, new_computed_blocks
        )
        return self.allocate(
            [table],
            seq,
            num_new_tokens,
            num_new_computed_tokens,
            [hits] if hits else [],
            Admission(full_sequence_must_fit=full_sequence_must_fit),
            0,
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
        bs, max_len = self._block_size, self._max_model_len
        full_sequence_must_fit, watermark = admission.full_sequence_must_fit, admission.watermark
        if self._single_full and not hits and not full_sequence_must_fit and watermark == 0:
            # Fast path (most decode steps): the table already covers the new
            # tokens, so nothing can be refused or allocated.
            table = tables[0]
            computed = min(seq.num_computed_tokens, max_len)
            if min(computed + num_new_tokens + self._lookahead, max_len) <= len(table) * bs:
                if self._enable_caching:
                    upto = min(computed + num_new_tokens, seq.num_tokens)
                    self._cache_blocks(0, table, seq, upto)
                return 0
        computed = min(seq.num_computed_tokens + num_new_computed_tokens, max_len)
        if full_sequence_must_fit:
            full = min(seq.num_tokens, max_len)
            need = self._blocks_needed_all(tables, full, hits, True)
            if need + watermark > self._pool.num_free_blocks:
                return None
        # The lookahead slots come on top; the admission gate above ignores
        # them, as vLLM's does.
        slots = min(computed + num_new_tokens + self._lookahead, max_len)
        if not self._single_full:
            # What the steps computed for sure (not what is still in flight)
            # is all a window can have left behind.
            processed = max(computed - in_flight, 0)
            for g, table in enumerate(tables):
                self._remove_skipped_blocks(g, table, processed)
        if self._blocks_needed_all(tables, slots, hits, False) + watermark > (
            self._pool.num_free_blocks
        ):
            return None
        # Enough is free: from here on nothing can fail.
        if hits:
            for g, table in enumerate(tables):
                self._take_hits(g, table, hits[g], computed)
        k = max(cdiv(slots, bs) - len(tables[0]), 0)
        assert all(len(t) == len(tables[0]) for t in tables)
        for table in tables:
            table.blocks.extend(self._pool.take_free_blocks(k))
        if self._enable_caching:
            upto = min(computed + num_new_tokens, seq.num_tokens)
            for g, table in enumerate(tables):
                self._cache_blocks(g, table, seq, upto)
        return k

    def _take_hits(self, g: int, table: BlockTable, hits: list[Block], computed: int) -> None:
        """Adopt group ``g``'s prefix hits: the blocks a window no longer
        reads (before ``computed``'s window) stay null, the rest are taken."""
        skipped = self._groups[g].kind.num_skipped_tokens(computed) // self._block_size
        skipped = min(skipped, len(hits))
        taken = hits[skipped:]
        self._pool.add_refs([b for b in taken if b.block_id != NULL_BLOCK])
        null = self._null_block()
        del table.blocks[skipped:]
        table.blocks.extend([null] * (skipped - len(table.blocks)))
        table.blocks.extend(taken)
        table.num_cached = len(table.blocks)

    def _remove_skipped_blocks(self, g: int, table: BlockTable, processed: int) -> None:
        """Give back group ``g``'s blocks that no position after
        ``processed`` tokens reads (a window's past), last first, leaving
        nulls; stops at the first position already null."""
        skipped = self._groups[g].kind.num_skipped_tokens(processed) // self._block_size
        k = min(skipped, len(table))
        if k == 0 or table.blocks[k - 1].block_id == NULL_BLOCK:
            return  # nothing newly out of the window: most steps
        freed: list[Block] = []
        for i in range(k - 1, -1, -1):
            if table.blocks[i].block_id == NULL_BLOCK:
                break
            freed.append(table.blocks[i])
            table.blocks[i] = self._null_block()
        if freed:
            self._pool.release(freed)

    def _null_block(self) -> Block:
        null = self._pool.block(NULL_BLOCK)
        assert null is not None
        return null

    def _check_allocation(
        self,
        table: BlockTable,
        seq: Sequence,
        num_new_tokens: int,
        num_new_computed_tokens: int,
        hit_ids: list[int],
    ) -> list[Block]:
        """The checks of ``allocate_slots``; returns the hit blocks."""
        bs = self._block_size
        if num_new_tokens == 0 and num_new_computed_tokens == 0:
            raise ValueError(
                "allocate_slots: num_new_tokens and num_new_computed_tokens are both 0"
            )
        if num_new_computed_tokens != len(hit_ids) * bs:
            raise ValueError(
                f"allocate_slots: num_new_computed_tokens = {num_new_computed_tokens} must be "
                f"len(new_computed_blocks) * block_size = {len(hit_ids) * bs}"
            )
        if not hit_ids:
            return []
        if not table.is_empty() or seq.num_computed_tokens != 0:
            raise ValueError(
                "allocate_slots: new_computed_blocks are only taken by a request with an empty "
                "table and no computed tokens"
            )
        if len(hit_ids) * bs >= seq.num_tokens:
            raise ValueError(
                f"allocate_slots: {num_new_computed_tokens} hit tokens leave none of the "
                f"request's {seq.num_tokens} tokens to compute"
            )
        # A hit must be the cached block of the same position, so it holds
        # exactly this request's tokens (chained hashes imply the prefix). A
        # hit past the request's last full block has no hash to match.
        hashes = seq.block_hashes
        hits = []
        for k, block_id in enumerate(hit_ids):
            block = self._pool.block(block_id) if block_id != NULL_BLOCK else None
            if block is None or k >= len(hashes) or block.hash != hashes[k]:
                raise ValueError(
                    f"allocate_slots: new_computed_blocks[{k}] = {block_id} is not a cached "
                    f"copy of the request's block {k}"
                )
            hits.append(block)
        return hits

    def cache_full_blocks(self, tables: list[BlockTable], seq: Sequence, upto: int) -> None:
        """Hash-cache every group's full blocks up to token ``upto``, when
        prefix caching is on; the async update caches the blocks its tokens
        filled."""
        if self._enable_caching:
            for g, table in enumerate(tables):
                self._cache_blocks(g, table, seq, upto)

    def num_cached_tokens(self, tables: list[BlockTable]) -> int:
        """Tokens the request holds in hash-cached blocks, as vLLM estimates
        them: per group, where its last held cached block ends; the least
        over the groups."""
        if not self._enable_caching:
            return 0
        bs = self._block_size
        if self._single_full:
            return tables[0].num_cached * bs

        def cached_end(table: BlockTable) -> int:
            held = table.blocks[: min(table.num_cached, len(table))]
            ends = [
                (i + 1) * bs
                for i, b in enumerate(held)
                if b.block_id != NULL_BLOCK and b.hash is not None
            ]
            return ends[-1] if ends else 0

        return min(cached_end(t) for t in tables)

    def _cache_blocks(self, g: int, table: BlockTable, seq: Sequence, upto: int) -> None:
        """Hash-cache group ``g``'s full blocks up to token ``upto``
        (docs/scheduling.md §7.7): every one, except null positions and, for
        a window group under sparse retention, those no later request could
        resume from."""
        bs = self._block_size
        if upto < (table.num_cached + 1) * bs:
            return  # no new full block: the common case
        hashes = seq.block_hashes
        full = min(min(upto, len(hashes) * bs) // bs, len(table))
        start = table.num_cached
        kind = self._groups[g].kind
        keep = None
        if start < full and isinstance(kind, SlidingWindow) and self._sparse_retention:
            keep = sparse_mask(
                start,
                full,
                bs,
                kind.window,
                seq.num_prompt_tokens,
                seq.shared_prefix_boundary,
            )
        for k in range(start, full):
            block = table.blocks[k]
            if block.block_id == NULL_BLOCK or (keep is not None and not keep(k)):
                continue
            self._pool.cache_block(block, group_key(hashes[k], g))
        table.num_cached = max(table.num_cached, full)

    def free(self, tables: list[BlockTable]) -> None:
        """Release every group's table, in group order, each last block
        first: unhashed blocks go to the head of the free queue, cached ones
        to the tail (docs/scheduling.md §7.9, Q2); null positions hold
        nothing."""
        for table in tables:
            self._pool.release([b for b in reversed(table.blocks) if b.block_id != NULL_BLOCK])
            table.blocks.clear()
            table.num_cached = 0

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

    @property
    def events_enabled(self) -> bool:
        """Whether KV-cache events (routers') are logged."""
        return self._pool.events.enabled

    def log_event(self, event: KvEvent) -> None:
        """Log an event the caller knows of (stores and hits: only the caller
        knows whose table it is)."""
        self._pool.events.push(event)

    def take_events(self) -> list[KvEvent]:
        """The events since last taken, oldest first."""
        return self._pool.events.take()

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash if no block is held; returns whether it did."""
        done = self._pool.reset_prefix_cache()
        if done:
            self._stats.reset = True
        return done
