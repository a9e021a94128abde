"""The block pool (docs/scheduling.md §7.1–7.3, 7.8, 7.9): every block, the
free queue threaded through them, and the prefix-cache map.

Invariants (docs/scheduling.md §10): a non-null block is in the free queue
exactly when its ``ref_cnt`` is 0; a block has a hash exactly when the map
holds it under that hash; the null block is never queued, hashed or handed
out.

The public methods take block ids and check them (they are what
``ironbatch.BlockPool`` offers); the core's own callers use the unchecked
twins that take ``Block`` objects (``take_free_blocks``, ``add_refs``,
``release``)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator

from ironbatch.reference.args import count, u32_list
from ironbatch.reference.block import NULL_BLOCK, Block
from ironbatch.reference.free_queue import FreeBlockQueue
from ironbatch.reference.kv_events import Accessed, Allocated, Cleared, KvEventLog, Removed
from ironbatch.reference.limits import MAX_NUM_BLOCKS, check_range
from ironbatch.reference.prefix_cache_map import PrefixCacheMap


class BlockPool:
    """All KV-cache blocks and their free queue (block 0 is the null block)."""

    def __init__(self, num_blocks: int) -> None:
        num_blocks = count("num_blocks", num_blocks)
        # One block is the null block alone: a model without a KV cache.
        check_range("num_blocks", num_blocks, 1, MAX_NUM_BLOCKS)
        self._blocks = [Block(i) for i in range(num_blocks)]
        self._free_queue = FreeBlockQueue(self._blocks)
        null = self._free_queue.popleft()
        assert null is not None and null.block_id == NULL_BLOCK
        self._cached = PrefixCacheMap()
        #: KV-cache events (evictions and resets here; the manager adds its
        #: stores, its callers their hits), off unless enabled.
        self.events = KvEventLog()
        #: Keys a cached block carries besides its own, while events are
        #: on: a prompt tail's inside a block keyed to its end (vLLM's
        #: secondary partial keys, §7.16). No lookup asks for them; they are
        #: kept so that each is stored once, and end with the block's own.
        self._second_keys: dict[int, list[int]] = {}

    @property
    def num_blocks(self) -> int:
        """Blocks in the pool, the null block included."""
        return len(self._blocks)

    @property
    def num_free_blocks(self) -> int:
        """Blocks with ``ref_cnt == 0`` (cached or not), the null block excluded."""
        return len(self._free_queue)

    @property
    def usage(self) -> float:
        """Fraction of usable blocks held by requests."""
        usable = self.num_blocks - 1
        if usable == 0:
            return 0.0  # the null block alone: nothing to use
        return 1.0 - self.num_free_blocks / usable

    def block(self, block_id: int) -> Block | None:
        """A block's state, or None for an id outside the pool."""
        return self._blocks[block_id] if 0 <= block_id < len(self._blocks) else None

    def free_block_ids(self) -> list[int]:
        """The free queue, head (next to reuse or evict) first."""
        return [b.block_id for b in self._free_queue]

    def block_ref_cnts(self) -> list[int]:
        """Every block's reference count, indexed by block id."""
        return [b.ref_cnt for b in self._blocks]

    def cached_blocks(self) -> Iterator[tuple[int, list[int]]]:
        """The prefix-cache map's (hash, block ids) pairs."""
        return ((h, [b.block_id for b in blocks]) for h, blocks in self._cached.iter())

    def get_cached_block(self, block_hash: int) -> Block | None:
        """The earliest cached block under ``block_hash`` (evictable ones too)."""
        return self._cached.get(block_hash)

    def get_new_blocks(self, num_blocks: int) -> list[int]:
        """Take ``num_blocks`` blocks from the head of the free queue,
        evicting their cached hashes, with ``ref_cnt`` 1."""
        k = count("num_blocks", num_blocks)
        if k > self.num_free_blocks:
            raise ValueError(f"cannot get {k} blocks: only {self.num_free_blocks} are free")
        return [b.block_id for b in self.take_free_blocks(k)]

    def take_free_blocks(self, k: int) -> list[Block]:
        """``get_new_blocks`` for a ``k`` the caller checked against the free count."""
        blocks = self._free_queue.popleft_n(k)
        for block in blocks:
            block.partial_tokens = 0
            if block.hash is not None:
                # Lazy eviction: a freed cached block stayed findable until now.
                self._cached.remove(block.hash, block)
                block.hash = None
                self.events.push(Removed(block.block_id))
                self._second_keys.pop(block.block_id, None)
            self.events.push(Allocated(block.block_id))
            assert block.ref_cnt == 0
            block.ref_cnt = 1
        return blocks

    def uncache(self, block_ids: Iterable[int]) -> None:
        """Take each block out of the prefix cache if it is cached (vLLM's
        ``evict_blocks``: blocks whose KV failed to load); held or free, the
        blocks stay where they are."""
        for block_id in block_ids:
            block = self._blocks[block_id]
            block.partial_tokens = 0
            if block.hash is not None:
                self._cached.remove(block.hash, block)
                block.hash = None
                self.events.push(Removed(block_id))
                self._second_keys.pop(block_id, None)

    def add_second_key(self, block: Block, block_hash: int) -> bool:
        """Give the cached ``block`` the key ``block_hash`` besides its own;
        False (nothing changes) when it has that key already."""
        assert block.hash is not None
        if block.hash == block_hash:
            return False
        keys = self._second_keys.setdefault(block.block_id, [])
        if block_hash in keys:
            return False
        keys.append(block_hash)
        return True

    def touch(self, block_ids: Iterable[int]) -> None:
        """Add a reference to each block, taking free ones out of the queue
        (prefix-cache hits)."""
        self.add_refs(self._check_ids("touch", block_ids))

    def add_refs(self, blocks: list[Block]) -> None:
        """``touch`` for blocks known to be usable (checked hits)."""
        for block in blocks:
            if block.ref_cnt == 0:
                self._free_queue.remove(block)
            block.ref_cnt += 1
            self.events.push(Accessed(block.block_id))

    def free_blocks(self, block_ids: Iterable[int]) -> None:
        """Drop one reference per listed block, in the order given (see
        ``release``). Every listed block must hold at least as many
        references as it is listed, so no count goes below 0."""
        blocks = self._check_ids("free_blocks", block_ids)
        listed: Counter[int] = Counter()
        for i, block in enumerate(blocks):
            listed[block.block_id] += 1
            if listed[block.block_id] > block.ref_cnt:
                raise ValueError(
                    f"free_blocks: block_ids[{i}] = {block.block_id} is not held "
                    f"(ref_cnt {block.ref_cnt})"
                )
        self.release(blocks)

    def release_ids(self, block_ids: Iterable[int]) -> None:
        """``release`` by block id (the Rust pool's ``release``)."""
        self.release(self._blocks[b] for b in block_ids)

    def release(self, blocks: Iterable[Block]) -> None:
        """``free_blocks`` for blocks known to be held (a request's own
        table). Blocks reaching ``ref_cnt`` 0 go back to the queue: unhashed
        ones to the head (reused first), cached ones to the tail (evicted
        last), each group in the order given. Callers pass a table last
        block first (docs/scheduling.md §7.9)."""
        to_head: list[Block] = []
        to_tail: list[Block] = []
        for block in blocks:
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                (to_head if block.hash is None else to_tail).append(block)
        self._free_queue.prepend_n(to_head)
        self._free_queue.append_n(to_tail)

    def cache_block(self, block: Block, block_hash: int) -> None:
        """Mark a held, unhashed block as the full block ``block_hash`` and
        add it to the prefix-cache map."""
        assert block.ref_cnt > 0 and block.hash is None and block.block_id != NULL_BLOCK
        block.hash = block_hash
        block.partial_tokens = 0
        self._cached.insert(block_hash, block)

    def cache_partial_block(self, block: Block, block_hash: int, tokens: int) -> None:
        """``cache_block`` with a partial key: ``block_hash`` is the hash at
        ``tokens`` tokens, fewer than the block may hold (§7.16)."""
        self.cache_block(block, block_hash)
        block.partial_tokens = tokens

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash. Refused (False, nothing changed) while
        any block is held."""
        if self.num_free_blocks != self.num_blocks - 1:
            return False
        self._cached.clear()
        self._second_keys.clear()
        for block in self._blocks:
            block.hash = None
            block.partial_tokens = 0
        self.events.push(Cleared())
        return True

    def _check_ids(self, what: str, block_ids: Iterable[int]) -> list[Block]:
        ids = u32_list("block_ids", block_ids)
        for i, b in enumerate(ids):
            if b == NULL_BLOCK or b >= self.num_blocks:
                raise ValueError(
                    f"{what}: block_ids[{i}] = {b} is not a usable block id "
                    f"(1..{self.num_blocks - 1})"
                )
        return [self._blocks[b] for b in ids]

    def __repr__(self) -> str:
        return f"BlockPool(num_blocks={self.num_blocks}, num_free_blocks={self.num_free_blocks})"
