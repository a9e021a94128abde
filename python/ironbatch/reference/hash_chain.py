"""A request's chain of block hashes (docs/scheduling.md §7.4): one hash per
**full** block of its known tokens (and the hasher's lookahead tokens after
it), extended as tokens arrive."""

from __future__ import annotations

from collections.abc import Sequence

from ironbatch.reference.block_hash import BlockHasher, ExtraKey, block_hash


class BlockHashChain:
    """The hashes of a token sequence's full blocks, in block order, and the
    chain key the next full block will be hashed under."""

    def __init__(self, hasher: BlockHasher, extras: Sequence[ExtraKey]) -> None:
        """An empty chain rooted in the hasher's secret and the request's
        extra keys (its ``cache_salt``, its LoRA adapter)."""
        self._hashes: list[int] = []
        self.next_key = hasher.root(extras)
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
        rebuilt from the root over ``tokens``, the sequence those hashes were
        taken over: with a lookahead, a kept block's hash still covers the
        tokens after it as they were (vLLM keeps those hashes too, until it
        hashes again)."""
        if num_blocks >= len(self._hashes):
            return
        self.clear()
        end = num_blocks * block_size + hasher.lookahead
        self.extend(hasher, tokens[:end], block_size)

    def clear(self) -> None:
        """Forget every hash, to hash tokens afresh from the root."""
        self._hashes.clear()
        self.next_key = self._root

    def extend(self, hasher: BlockHasher, tokens: list[int], block_size: int) -> None:
        """Hash every full block of ``tokens`` not hashed yet whose lookahead
        tokens are known too. ``tokens`` is the whole known sequence; a partly
        filled last block gets no hash."""
        lookahead = hasher.lookahead
        if len(tokens) < (len(self._hashes) + 1) * block_size + lookahead:
            return  # no new full block: the common case
        for k in range(len(self._hashes), (len(tokens) - lookahead) // block_size):
            message = tokens[k * block_size : (k + 1) * block_size + lookahead]
            self.next_key = hasher.next(self.next_key, message)
            self._hashes.append(block_hash(self.next_key))
