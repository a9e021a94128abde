"""The block pool (spec §7.1–7.3, 7.8, 7.9): every block, the free queue
threaded through them, and the prefix-cache map.

Invariants (spec §10): a non-null block is in the free queue exactly when its
``ref_cnt`` is 0; a block has a hash exactly when the map holds it under that
hash; the null block is never queued, hashed or handed out."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from ironbatch.reference._args import count, u32_list
from ironbatch.reference.block import NULL_BLOCK, Block
from ironbatch.reference.free_queue import FreeBlockQueue
from ironbatch.reference.limits import MAX_NUM_BLOCKS, check_range
from ironbatch.reference.prefix_cache_map import PrefixCacheMap

#: Beyond any accelerator's memory; a mistyped size fails fast instead.


class BlockPool:
    """All KV-cache blocks and their free queue (block 0 is the null block)."""

    def __init__(self, num_blocks: int) -> None:
        num_blocks = count("num_blocks", num_blocks)
        check_range("num_blocks", num_blocks, 2, MAX_NUM_BLOCKS)
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_queue = FreeBlockQueue(self.blocks)
        self.free_queue.popleft()  # the null block
        self.cached = PrefixCacheMap()

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / (self.num_blocks - 1)

    def get_cached_block(self, block_hash: int) -> Block | None:
        return self.cached.get(block_hash)

    def get_new_blocks(self, num_blocks: int) -> list[int]:
        """Take blocks from the head of the free queue; a cached one loses
        its hash only now (lazy eviction)."""
        return [b.block_id for b in self.take_blocks(count("num_blocks", num_blocks))]

    def take_blocks(self, n: int) -> list[Block]:
        if n > self.num_free_blocks:
            raise ValueError(f"cannot get {n} blocks: only {self.num_free_blocks} are free")
        blocks = self.free_queue.popleft_n(n)
        for block in blocks:
            if block.hash is not None:
                self.cached.remove(block.hash, block)
                block.hash = None
            block.ref_cnt = 1
        return blocks

    def touch(self, block_ids: Iterable[int]) -> None:
        """Add a reference to each block, taking free ones off the queue."""
        self.touch_blocks(self._blocks_of("touch", block_ids))

    def touch_blocks(self, blocks: list[Block]) -> None:
        for block in blocks:
            if block.ref_cnt == 0:
                self.free_queue.remove(block)
            block.ref_cnt += 1

    def free_blocks(self, block_ids: Iterable[int]) -> None:
        """Drop one reference per listed block, in the order given."""
        blocks = self._blocks_of("free_blocks", block_ids)
        listed: Counter[Block] = Counter()
        for i, block in enumerate(blocks):  # a count may not go below 0
            listed[block] += 1
            if listed[block] > block.ref_cnt:
                raise ValueError(
                    f"free_blocks: block_ids[{i}] = {block.block_id} is not held "
                    f"(ref_cnt {block.ref_cnt})"
                )
        self.release(blocks)

    def release(self, blocks: list[Block]) -> None:
        """Blocks reaching ``ref_cnt`` 0 go back to the queue: unhashed ones
        to the head (reused first), cached ones to the tail (evicted last),
        each group in the order given. Callers pass a table last block first,
        so among cached blocks the deeper prefix blocks are evicted first."""
        to_head, to_tail = [], []
        for block in blocks:
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                (to_head if block.hash is None else to_tail).append(block)
        self.free_queue.prepend_n(to_head)
        self.free_queue.append_n(to_tail)

    def cache_block(self, block: Block, block_hash: int) -> None:
        block.hash = block_hash
        self.cached.insert(block_hash, block)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash; refused while any block is held."""
        if self.num_free_blocks != self.num_blocks - 1:
            return False
        self.cached.clear()
        for block in self.blocks:
            block.hash = None
        return True

    def free_block_ids(self) -> list[int]:
        return [b.block_id for b in self.free_queue]

    def block_ref_cnts(self) -> list[int]:
        return [b.ref_cnt for b in self.blocks]

    def _blocks_of(self, what: str, block_ids: Iterable[int]) -> list[Block]:
        ids = u32_list("block_ids", block_ids)
        for i, b in enumerate(ids):
            if b == NULL_BLOCK or b >= self.num_blocks:
                raise ValueError(
                    f"{what}: block_ids[{i}] = {b} is not a usable block id "
                    f"(1..{self.num_blocks - 1})"
                )
        return [self.blocks[b] for b in ids]

    def __repr__(self) -> str:
        return f"BlockPool(num_blocks={self.num_blocks}, num_free_blocks={self.num_free_blocks})"
