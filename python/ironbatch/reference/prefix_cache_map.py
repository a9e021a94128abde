"""The prefix-cache map (spec §7.3): block hash → the blocks cached under it.

Identical blocks are not de-duplicated (block tables never change once
written), so one hash can hold several blocks; a lookup answers with the
earliest inserted one still there."""

from __future__ import annotations

from collections.abc import Iterator

from ironbatch.reference.block import Block


class PrefixCacheMap:
    def __init__(self) -> None:
        self._map: dict[int, list[Block]] = {}

    def get(self, block_hash: int) -> Block | None:
        blocks = self._map.get(block_hash)
        return blocks[0] if blocks else None

    def insert(self, block_hash: int, block: Block) -> None:
        self._map.setdefault(block_hash, []).append(block)

    def remove(self, block_hash: int, block: Block) -> None:
        blocks = self._map[block_hash]
        blocks.remove(block)
        if not blocks:
            del self._map[block_hash]

    def clear(self) -> None:
        self._map.clear()

    def items(self) -> Iterator[tuple[int, list[Block]]]:
        return iter(self._map.items())
