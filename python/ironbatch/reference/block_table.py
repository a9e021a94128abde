"""A request's block table (spec §7.1): block ``k`` holds its tokens
``[k*bs, (k+1)*bs)``; the first ``num_cached`` blocks are hash-cached."""

from __future__ import annotations

from dataclasses import dataclass, field

from ironbatch.reference.block import Block


@dataclass
class BlockTable:
    blocks: list[Block] = field(default_factory=list)
    num_cached: int = 0

    def block_ids(self) -> list[int]:
        return [b.block_id for b in self.blocks]
