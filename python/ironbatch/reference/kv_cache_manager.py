"""The KV-cache manager (spec §7.5–7.10): prefix lookups, slot allocation
with the admission gate, hash caching at allocation time, and freeing.

Every argument is checked before anything changes, so a ``ValueError`` or a
``None`` (too few free blocks) leaves the pool, the map and the request's
table exactly as they were."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ironbatch.reference._args import count, u32_list
from ironbatch.reference.block import NULL_BLOCK, Block
from ironbatch.reference.block_hash import BlockHasher
from ironbatch.reference.block_pool import BlockPool
from ironbatch.reference.block_table import BlockTable
from ironbatch.reference.limits import MAX_BLOCK_SIZE, MAX_MODEL_LEN, check_range, utf8_str
from ironbatch.reference.prefix_cache_stats import PrefixCacheStats
from ironbatch.reference.sequence import Sequence


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass
class _Entry:
    seq: Sequence
    table: BlockTable


class KVCacheManager:
    """The paged KV cache's bookkeeping for the requests registered with
    ``add_request``, making vLLM 0.33's decisions."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        max_model_len: int,
        enable_prefix_caching: bool = True,
    ) -> None:
        num_blocks = count("num_blocks", num_blocks)
        self._block_size = count("block_size", block_size)
        self._max_model_len = count("max_model_len", max_model_len)
        check_range("block_size", self._block_size, 1, MAX_BLOCK_SIZE)
        check_range("max_model_len", self._max_model_len, 1, MAX_MODEL_LEN)
        self._enable_prefix_caching = bool(enable_prefix_caching)
        self.pool = BlockPool(num_blocks)
        self.hasher = BlockHasher()
        self.stats = PrefixCacheStats()
        self._requests: dict[str, _Entry] = {}

    # -- requests -------------------------------------------------------------

    def add_request(
        self, request_id: str, prompt_token_ids: Iterable[int], cache_salt: str | None = None
    ) -> None:
        utf8_str("request_id", request_id)
        if cache_salt is not None:
            utf8_str("cache_salt", cache_salt)
        if request_id in self._requests:
            raise ValueError(f"request_id {request_id!r} is already registered")
        prompt = u32_list("prompt_token_ids", prompt_token_ids)
        if not prompt:
            raise ValueError("prompt_token_ids must not be empty")
        self._check_len("prompt_token_ids", len(prompt))
        seq = Sequence(prompt, cache_salt, self.hasher, self.block_size)
        self._requests[request_id] = _Entry(seq, BlockTable())

    def append_token_ids(self, request_id: str, token_ids: Iterable[int]) -> None:
        tokens = u32_list("token_ids", token_ids)
        entry = self._entry(request_id)
        self._check_len("token_ids", entry.seq.num_tokens + len(tokens))
        entry.seq.append(tokens, self.hasher, self.block_size)

    def remove_request(self, request_id: str) -> None:
        entry = self._entry(request_id)
        del self._requests[request_id]
        self.release(entry.table)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._requests

    def __len__(self) -> int:
        return len(self._requests)

    # -- the manager's work ---------------------------------------------------

    def get_computed_blocks(self, request_id: str) -> tuple[list[int], int]:
        """The longest cached prefix, in whole blocks, of at most
        ``num_tokens - 1`` tokens (the last token is always computed).
        Changes nothing."""
        hits, num_hit_tokens = self.lookup(self._entry(request_id).seq)
        return [b.block_id for b in hits], num_hit_tokens

    def lookup(self, seq: Sequence) -> tuple[list[Block], int]:
        """``get_computed_blocks`` for a request's token state."""
        if not self.enable_prefix_caching:
            return [], 0
        max_hit_blocks = (seq.num_tokens - 1) // self.block_size
        hits = []
        for block_hash in seq.block_hashes[:max_hit_blocks]:
            block = self.pool.get_cached_block(block_hash)
            if block is None:
                break  # chained hashes: every later block misses too
            hits.append(block)
        return hits, len(hits) * self.block_size

    def allocate_slots(
        self,
        request_id: str,
        num_new_tokens: int,
        num_new_computed_tokens: int | None = None,
        new_computed_blocks: Iterable[int] | None = None,
        full_sequence_must_fit: bool = False,
    ) -> list[int] | None:
        """Make room for ``num_new_tokens`` more tokens after taking the
        prefix hits ``new_computed_blocks``. Returns the new block ids, or
        None (changing nothing) when too few blocks are free."""
        n_new = count("num_new_tokens", num_new_tokens)
        n_hit = (
            0
            if num_new_computed_tokens is None
            else count("num_new_computed_tokens", num_new_computed_tokens)
        )
        hit_ids = (
            []
            if new_computed_blocks is None
            else u32_list("new_computed_blocks", new_computed_blocks)
        )
        entry = self._entry(request_id)
        hits = self._check_hits(entry.seq, entry.table, n_new, n_hit, hit_ids)
        new_blocks = self.allocate(
            entry.table, entry.seq, n_new, n_hit, hits, bool(full_sequence_must_fit)
        )
        return None if new_blocks is None else [b.block_id for b in new_blocks]

    def allocate(
        self,
        table: BlockTable,
        seq: Sequence,
        n_new: int,
        n_hit: int,
        hits: list[Block],
        full_sequence_must_fit: bool,
    ) -> list[Block] | None:
        """``allocate_slots`` for a request's table and token state, with
        arguments already checked: the new blocks, or None (nothing changed)."""
        computed = min(seq.num_computed_tokens + n_hit, self.max_model_len)
        free = self.pool.num_free_blocks
        if full_sequence_must_fit:
            full = min(seq.num_tokens, self.max_model_len)
            if self._blocks_needed(table, full, hits) > free:
                return None
        slots = min(computed + n_new, self.max_model_len)
        if self._blocks_needed(table, slots, hits) > free:
            return None
        # From here on nothing can fail.
        if hits:
            self.pool.touch_blocks(hits)
            table.blocks = list(hits)
            table.num_cached = len(hits)
        new_blocks = self.pool.take_blocks(max(cdiv(slots, self.block_size) - len(table.blocks), 0))
        table.blocks.extend(new_blocks)
        if self.enable_prefix_caching:
            self._cache_blocks(seq, table, min(computed + n_new, seq.num_tokens))
        return new_blocks

    def _blocks_needed(self, table: BlockTable, num_tokens: int, hits: list[Block]) -> int:
        """New blocks to cover ``num_tokens``, plus the hits that sit in the
        free queue: taking those also shrinks the free count."""
        required = cdiv(num_tokens, self.block_size)
        have = len(table.blocks) + len(hits)
        evictable_hits = sum(1 for b in hits if b.ref_cnt == 0)
        return max(required - have, 0) + evictable_hits

    def cache_full_blocks(self, seq: Sequence, table: BlockTable, upto: int) -> None:
        """Hash-cache the table's full blocks up to token ``upto`` when prefix
        caching is on; the async update caches the blocks its tokens filled."""
        if self.enable_prefix_caching:
            self._cache_blocks(seq, table, upto)

    def num_cached_tokens(self, table: BlockTable) -> int:
        """Tokens held in the table's hash-cached blocks."""
        return table.num_cached * self.block_size if self.enable_prefix_caching else 0

    def _cache_blocks(self, seq: Sequence, table: BlockTable, upto: int) -> None:
        """Hash-cache the table's full blocks up to token ``upto`` (spec §7.7)."""
        full = min(
            min(upto, len(seq.block_hashes) * self.block_size) // self.block_size, len(table.blocks)
        )
        for k in range(table.num_cached, full):
            self.pool.cache_block(table.blocks[k], seq.block_hashes[k])
        table.num_cached = max(table.num_cached, full)

    def _check_hits(
        self, seq: Sequence, table: BlockTable, n_new: int, n_hit: int, hit_ids: list[int]
    ) -> list[Block]:
        if n_new == 0 and n_hit == 0:
            raise ValueError(
                "allocate_slots: num_new_tokens and num_new_computed_tokens are both 0"
            )
        if n_hit != len(hit_ids) * self.block_size:
            raise ValueError(
                f"allocate_slots: num_new_computed_tokens = {n_hit} must be "
                f"len(new_computed_blocks) * block_size = {len(hit_ids) * self.block_size}"
            )
        if not hit_ids:
            return []
        if table.blocks or seq.num_computed_tokens != 0:
            raise ValueError(
                "allocate_slots: new_computed_blocks are only taken by a request with an empty "
                "table and no computed tokens"
            )
        if n_hit >= seq.num_tokens:
            raise ValueError(
                f"allocate_slots: {n_hit} hit tokens leave none of the request's "
                f"{seq.num_tokens} tokens to compute"
            )
        # A hit must be a cached copy of the same block of this request.
        # A hit past the request's last full block has no hash to match.
        for k, block_id in enumerate(hit_ids):
            ok = (
                k < len(seq.block_hashes)
                and NULL_BLOCK < block_id < self.pool.num_blocks
                and self.pool.blocks[block_id].hash == seq.block_hashes[k]
            )
            if not ok:
                raise ValueError(
                    f"allocate_slots: new_computed_blocks[{k}] = {block_id} is not a cached "
                    f"copy of the request's block {k}"
                )
        return [self.pool.blocks[b] for b in hit_ids]

    def free(self, request_id: str) -> None:
        """Release the request's blocks. It stays registered with no computed
        tokens, as a preempted request is."""
        entry = self._entry(request_id)
        self.release(entry.table)
        entry.seq.num_computed_tokens = 0

    def release(self, table: BlockTable) -> None:
        """Free a request's table (``free`` for its table)."""
        # Last block first: see BlockPool.release for where each block goes.
        self.pool.release(list(reversed(table.blocks)))
        table.blocks = []
        table.num_cached = 0

    # -- statistics and reset -------------------------------------------------

    def record_prefix_cache_stats(
        self, request_id: str, num_hit_tokens: int, preempted: bool = False
    ) -> None:
        hits = count("num_hit_tokens", num_hit_tokens)
        num_tokens = self._entry(request_id).seq.num_tokens
        if hits > num_tokens:
            raise ValueError(f"num_hit_tokens = {hits} exceeds the request's {num_tokens} tokens")
        self.record_prefix_cache_stats_for(num_tokens, hits, bool(preempted))

    def record_prefix_cache_stats_for(
        self, num_tokens: int, num_hit_tokens: int, preempted: bool
    ) -> None:
        """Count one admission (spec §7.10); only with prefix caching on."""
        if self.enable_prefix_caching:
            self.stats.record(num_tokens, num_hit_tokens, preempted)

    def make_prefix_cache_stats(self) -> PrefixCacheStats:
        stats, self.stats = self.stats, PrefixCacheStats()
        return stats

    def reset_prefix_cache(self) -> bool:
        done = self.pool.reset_prefix_cache()
        if done:
            self.stats.reset = True
        return done

    # -- inspection -----------------------------------------------------------

    def get_block_ids(self, request_id: str) -> list[int]:
        return self._entry(request_id).table.block_ids()

    def num_cached_blocks(self, request_id: str) -> int:
        return self._entry(request_id).table.num_cached

    def num_tokens(self, request_id: str) -> int:
        return self._entry(request_id).seq.num_tokens

    def num_computed_tokens(self, request_id: str) -> int:
        return self._entry(request_id).seq.num_computed_tokens

    def set_num_computed_tokens(self, request_id: str, num_computed_tokens: int) -> None:
        n = count("num_computed_tokens", num_computed_tokens)
        entry = self._entry(request_id)
        limit = min(entry.seq.num_tokens, len(entry.table.blocks) * self.block_size)
        if n > limit:
            raise ValueError(
                f"num_computed_tokens = {n} exceeds the {limit} tokens request {request_id!r} "
                f"has slots for"
            )
        entry.seq.num_computed_tokens = n

    def block_hashes(self, request_id: str) -> list[int]:
        return list(self._entry(request_id).seq.block_hashes)

    def free_block_ids(self) -> list[int]:
        return self.pool.free_block_ids()

    def block_ref_cnts(self) -> list[int]:
        return self.pool.block_ref_cnts()

    def block_hash(self, block_id: int) -> int | None:
        b = count("block_id", block_id)
        if b >= self.pool.num_blocks:
            raise ValueError(f"block_id = {b} is not in the pool")
        return self.pool.blocks[b].hash

    def cached_blocks(self) -> dict[int, list[int]]:
        return {h: [b.block_id for b in blocks] for h, blocks in self.pool.cached.items()}

    @property
    def block_size(self) -> int:
        return self._block_size

    @property
    def max_model_len(self) -> int:
        return self._max_model_len

    @property
    def enable_prefix_caching(self) -> bool:
        return self._enable_prefix_caching

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def usage(self) -> float:
        return self.pool.usage

    def _entry(self, request_id: str) -> _Entry:
        utf8_str("request_id", request_id)
        entry = self._requests.get(request_id)
        if entry is None:
            raise ValueError(f"request_id {request_id!r} is not a known request")
        return entry

    def _check_len(self, field: str, num_tokens: int) -> None:
        if num_tokens > self.max_model_len:
            raise ValueError(
                f"{field}: {num_tokens} tokens exceed max_model_len = {self.max_model_len}"
            )

    def __repr__(self) -> str:
        return (
            f"KVCacheManager(num_blocks={self.num_blocks}, block_size={self.block_size}, "
            f"max_model_len={self.max_model_len}, "
            f"enable_prefix_caching={self.enable_prefix_caching}, "
            f"num_free_blocks={self.num_free_blocks}, requests={len(self)})"
        )
