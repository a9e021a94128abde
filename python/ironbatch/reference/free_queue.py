"""The free-block queue (spec §7.2): a doubly-linked list threaded through
the blocks themselves, with head and tail sentinels, so that taking from the
head, putting at either end and unlinking from the middle are all O(1).

The head is the next block to be reused (and, if it is cached, evicted)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from ironbatch.reference.block import Block


class FreeBlockQueue:
    def __init__(self, blocks: list[Block]) -> None:
        self._head = Block(-1)
        self._tail = Block(-1)
        self._head.next = self._tail
        self._tail.prev = self._head
        self._len = 0
        self.append_n(blocks)

    def __len__(self) -> int:
        return self._len

    def popleft(self) -> Block:
        first = self._head.next
        if first is self._tail:
            raise IndexError("the free queue is empty")
        assert first is not None
        self.remove(first)
        return first

    def popleft_n(self, n: int) -> list[Block]:
        if n > self._len:
            raise ValueError(f"cannot take {n} blocks: only {self._len} are free")
        return [self.popleft() for _ in range(n)]

    def remove(self, block: Block) -> None:
        prev, nxt = block.prev, block.next
        if prev is None or nxt is None:
            raise ValueError(f"block {block.block_id} is not in the free queue")
        prev.next = nxt
        nxt.prev = prev
        block.prev = block.next = None
        self._len -= 1

    def _link_after(self, at: Block, block: Block) -> None:
        nxt = at.next
        assert nxt is not None and block.prev is None
        at.next = block
        block.prev = at
        block.next = nxt
        nxt.prev = block
        self._len += 1

    def append_n(self, blocks: Iterable[Block]) -> None:
        """Link ``blocks`` at the tail, in order."""
        for block in blocks:
            last = self._tail.prev
            assert last is not None
            self._link_after(last, block)

    def prepend_n(self, blocks: list[Block]) -> None:
        """Link ``blocks`` at the head, in order: ``blocks[0]`` becomes the head."""
        for block in reversed(blocks):
            self._link_after(self._head, block)

    def __iter__(self) -> Iterator[Block]:
        block = self._head.next
        while block is not self._tail:
            assert block is not None
            yield block
            block = block.next
