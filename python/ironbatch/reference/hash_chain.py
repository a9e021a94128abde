"""A request's chain of block hashes (docs/scheduling.md §7.4): one hash per
**full** block of its known tokens, extended as tokens arrive."""

from __future__ import annotations

from ironbatch.reference.block_hash import BlockHasher, CacheSalt, block_hash


class BlockHashChain:
    """The hashes of a token sequence's full blocks, in block order, and the
    chain key the next full block will be hashed under."""

    def __init__(self, hasher: BlockHasher, cache_salt: str | None) -> None:
        """An empty chain rooted in the hasher's secret and ``cache_salt``."""
        self._hashes: list[int] = []
        self.next_key = hasher.root([] if cache_salt is None else [CacheSalt(cache_salt)])
        #: The key the first block is hashed under, to hash again from the start.
        self._root = self.next_key

    def hashes(self) -> list[int]:
        """The hashes so far."""
        return self._hashes

    def truncate(
        self, num_blocks: int, hasher: BlockHasher, tokens: list[int], block_size: int
    ) -> None:
        """Keep the hashes of the first ``num_blocks`` blocks only (a
        streaming session drops its last sampled token). The chain key is
        rebuilt from the root over ``tokens``, whose first ``num_blocks``
        blocks are those hashed."""
        if num_blocks >= len(self._hashes):
            return
        self._hashes.clear()
        self.next_key = self._root
        self.extend(hasher, tokens[: num_blocks * block_size], block_size)

    def extend(self, hasher: BlockHasher, tokens: list[int], block_size: int) -> None:
        """Hash every full block of ``tokens`` not hashed yet. ``tokens`` is
        the whole known sequence; a partly filled last block gets no hash."""
        if len(tokens) < (len(self._hashes) + 1) * block_size:
            return  # no new full block: the common case
        for k in range(len(self._hashes), len(tokens) // block_size):
            block = tokens[k * block_size : (k + 1) * block_size]
            self.next_key = hasher.next(self.next_key, block)
            self._hashes.append(block_hash(self.next_key))
