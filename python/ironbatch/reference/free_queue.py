"""The free-block queue (docs/scheduling.md §7.2): a doubly-linked list
threaded through the blocks themselves, with head and tail sentinels, so
that taking from the head, putting at either end and unlinking from the
middle are all O(1).

The head is the next block to be reused (and, if it is cached, evicted)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from ironbatch.reference.block import Block


class FreeBlockQueue:
    """Free blocks in reuse order, head first."""

    def __init__(self, blocks: list[Block]) -> None:
        """A queue holding ``blocks`` in the order given from the head."""
        self._head = Block(-1)
        self._tail = Block(-1)
        self._head.next = self._tail
        self._tail.prev = self._head
        self._len = 0
        self.append_n(blocks)

    def __len__(self) -> int:
        return self._len

    def is_empty(self) -> bool:
        return self._len == 0

    def contains(self, block: Block) -> bool:
        return block.next is not None

    def popleft(self) -> Block | None:
        """Take the head block, if any."""
        first = self._head.next
        if first is self._tail:
            return None
        assert first is not None
        self.remove(first)
        return first

    def popleft_n(self, n: int) -> list[Block]:
        """Take ``n`` blocks from the head, in queue order; the caller
        checked that ``n`` are free."""
        assert n <= self._len, f"popleft_n({n}) with only {self._len} free"
        out = []
        for _ in range(n):
            block = self.popleft()
            assert block is not None
            out.append(block)
        return out

    def remove(self, block: Block) -> None:
        """Unlink ``block`` from wherever it is."""
        prev, nxt = block.prev, block.next
        assert prev is not None and nxt is not None, f"block {block.block_id} is not queued"
        prev.next = nxt
        nxt.prev = prev
        block.prev = block.next = None
        self._len -= 1

    def _link_after(self, at: Block, block: Block) -> None:
        nxt = at.next
        assert nxt is not None and not self.contains(block), f"block {block.block_id} is queued"
        at.next = block
        block.prev = at
        block.next = nxt
        nxt.prev = block
        self._len += 1

    def append(self, block: Block) -> None:
        """Link ``block`` at the tail."""
        last = self._tail.prev
        assert last is not None
        self._link_after(last, block)

    def append_n(self, blocks: Iterable[Block]) -> None:
        """Link ``blocks`` at the tail, in order."""
        for block in blocks:
            self.append(block)

    def prepend_n(self, blocks: list[Block]) -> None:
        """Link ``blocks`` at the head, in order: ``blocks[0]`` becomes the head."""
        for block in reversed(blocks):
            self._link_after(self._head, block)

    def iter(self) -> Iterator[Block]:
        """The queued blocks from head to tail."""
        block = self._head.next
        while block is not self._tail:
            assert block is not None
            yield block
            block = block.next

    def __iter__(self) -> Iterator[Block]:
        return self.iter()
