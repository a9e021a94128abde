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

from ironbatch.reference.block import NULL_BLOCK, Block, cdiv
from ironbatch.reference.block_hash import BlockHasher
from ironbatch.reference.block_pool import BlockPool
from ironbatch.reference.block_table import BlockTable
from ironbatch.reference.kv_events import KvEvent
from ironbatch.reference.limits import MAX_BLOCK_SIZE, MAX_MODEL_LEN, MAX_NUM_BLOCKS, check_range
from ironbatch.reference.prefix_cache_stats import PrefixCacheStats
from ironbatch.reference.sequence import Sequence


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
    ) -> None:
        """A manager over a fresh pool, hashing under a random secret key
        unless ``hasher`` is given (fixed keys make tests reproducible).
        ``num_lookahead_tokens`` KV slots are reserved past each
        allocation's tokens (an EAGLE, MTP or draft-model drafter writes
        there); each block's hash covers ``num_hash_lookahead_tokens``
        tokens after it (docs/scheduling.md §7.4)."""
        # The core's KvCacheConfig::validate order: the first bad field is named.
        check_range("block_size", block_size, 1, MAX_BLOCK_SIZE)
        check_range("max_model_len", max_model_len, 1, MAX_MODEL_LEN)
        check_range("num_blocks", num_blocks, 2, MAX_NUM_BLOCKS)
        check_range("num_lookahead_tokens", num_lookahead_tokens, 0, max_model_len)
        # A block's hash covers at most the next block.
        check_range("num_hash_lookahead_tokens", num_hash_lookahead_tokens, 0, block_size)
        self._pool = BlockPool(num_blocks)
        self._block_size = block_size
        self._max_model_len = max_model_len
        self._enable_caching = bool(enable_prefix_caching)
        self._lookahead = num_lookahead_tokens
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

    def _blocks_needed(self, table: BlockTable, tokens: int, hits: list[Block]) -> int:
        """New blocks to cover ``tokens``, plus the hits that sit in the free
        queue: taking those shrinks the free count too."""
        required = cdiv(tokens, self._block_size)
        have = len(table) + len(hits)
        evictable_hits = sum(1 for b in hits if b.ref_cnt == 0)
        return max(required - have, 0) + evictable_hits

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
        fit too (the admission gate, Q13)."""
        hits = self._check_allocation(
            table, seq, num_new_tokens, num_new_computed_tokens, new_computed_blocks
        )
        return self.allocate(
            table, seq, num_new_tokens, num_new_computed_tokens, hits, full_sequence_must_fit, 0
        )

    def allocate(
        self,
        table: BlockTable,
        seq: Sequence,
        num_new_tokens: int,
        num_new_computed_tokens: int,
        hits: list[Block],
        full_sequence_must_fit: bool,
        watermark: int,
    ) -> int | None:
        """``allocate_slots`` with arguments the caller guarantees (the
        scheduler's own): the number of new blocks, or None with nothing
        changed. ``watermark`` blocks must stay free beyond what is taken
        (vLLM's watermark, for admissions while others run)."""
        bs, max_len = self._block_size, self._max_model_len
        if not hits and not full_sequence_must_fit and watermark == 0:
            # Fast path (most decode steps): the table already covers the new
            # tokens, so nothing can be refused or allocated.
            computed = min(seq.num_computed_tokens, max_len)
            if min(computed + num_new_tokens + self._lookahead, max_len) <= len(table) * bs:
                if self._enable_caching:
                    upto = min(computed + num_new_tokens, seq.num_tokens)
                    self._cache_blocks(table, seq, upto)
                return 0
        computed = min(seq.num_computed_tokens + num_new_computed_tokens, max_len)
        free = self._pool.num_free_blocks
        if full_sequence_must_fit:
            full = min(seq.num_tokens, max_len)
            if self._blocks_needed(table, full, hits) + watermark > free:
                return None
        # The lookahead slots come on top; the admission gate above ignores
        # them, as vLLM's does.
        slots = min(computed + num_new_tokens + self._lookahead, max_len)
        if self._blocks_needed(table, slots, hits) + watermark > free:
            return None
        # Enough is free: from here on nothing can fail.
        if hits:
            self._pool.add_refs(hits)
            table.blocks.extend(hits)
            table.num_cached = len(hits)
        k = max(cdiv(slots, bs) - len(table), 0)
        table.blocks.extend(self._pool.take_free_blocks(k))
        if self._enable_caching:
            self._cache_blocks(table, seq, min(computed + num_new_tokens, seq.num_tokens))
        return k

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

    def cache_full_blocks(self, table: BlockTable, seq: Sequence, upto: int) -> None:
        """Hash-cache the table's full blocks up to token ``upto``, when
        prefix caching is on; the async update caches the blocks its tokens
        filled."""
        if self._enable_caching:
            self._cache_blocks(table, seq, upto)

    def num_cached_tokens(self, table: BlockTable) -> int:
        """Tokens held in the table's hash-cached blocks."""
        return table.num_cached * self._block_size if self._enable_caching else 0

    def _cache_blocks(self, table: BlockTable, seq: Sequence, upto: int) -> None:
        """Hash-cache the table's full blocks up to token ``upto``
        (docs/scheduling.md §7.7)."""
        bs = self._block_size
        if upto < (table.num_cached + 1) * bs:
            return  # no new full block: the common case
        hashes = seq.block_hashes
        full = min(min(upto, len(hashes) * bs) // bs, len(table))
        for k in range(table.num_cached, full):
            self._pool.cache_block(table.blocks[k], hashes[k])
        table.num_cached = max(table.num_cached, full)

    def free(self, table: BlockTable) -> None:
        """Release a table, last block first: unhashed blocks go to the head
        of the free queue, cached ones to the tail (docs/scheduling.md §7.9,
        Q2)."""
        self._pool.release(reversed(table.blocks))
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
