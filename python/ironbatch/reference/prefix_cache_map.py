"""The prefix-cache map (docs/scheduling.md §7.3): block hash → the blocks
cached under it.

Identical blocks are not de-duplicated (block tables never change once
written), so one hash can hold several blocks; a lookup answers with the
earliest inserted one still there."""

from __future__ import annotations

from collections.abc import Iterator

from ironbatch.reference.block import Block


class PrefixCacheMap:
    """Hash → cached blocks, in insertion order per hash."""

    def __init__(self) -> None:
        self._map: dict[int, list[Block]] = {}
        self._num_blocks = 0

    def get(self, block_hash: int) -> Block | None:
        """The earliest inserted block still cached under ``block_hash``."""
        blocks = self._map.get(block_hash)
        return blocks[0] if blocks else None

    def insert(self, block_hash: int, block: Block) -> None:
        """Add ``block`` under ``block_hash``, after any blocks already there."""
        self._map.setdefault(block_hash, []).append(block)
        self._num_blocks += 1

    def remove(self, block_hash: int, block: Block) -> bool:
        """Remove the exact pair; returns whether it was there."""
        blocks = self._map.get(block_hash)
        if blocks is None or block not in blocks:
            return False
        blocks.remove(block)
        if not blocks:
            del self._map[block_hash]
        self._num_blocks -= 1
        return True

    def num_blocks(self) -> int:
        """Number of (hash, block) pairs."""
        return self._num_blocks

    def clear(self) -> None:
        self._map.clear()
        self._num_blocks = 0

    def iter(self) -> Iterator[tuple[int, list[Block]]]:
        """Every (hash, blocks in insertion order)."""
        return iter(self._map.items())
