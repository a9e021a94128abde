"""A request's chain of block hashes (spec §7.4): one per full block of its
known tokens, extended as tokens arrive. A partly filled block has none."""

from __future__ import annotations

from ironbatch.reference.block_hash import BlockHasher, block_hash


class BlockHashChain:
    def __init__(self, hasher: BlockHasher, cache_salt: str | None) -> None:
        self.hashes: list[int] = []
        self.next_key = hasher.root(cache_salt)  # the next full block's key

    def extend(self, tokens: list[int], block_size: int, hasher: BlockHasher) -> None:
        """Hash every full block of ``tokens`` (the whole known sequence)
        that has no hash yet."""
        for k in range(len(self.hashes), len(tokens) // block_size):
            self.next_key = hasher.next(
                self.next_key, tokens[k * block_size : (k + 1) * block_size]
            )
            self.hashes.append(block_hash(self.next_key))
