"""A request's chain of block hashes (docs/scheduling.md §7.4): one hash per
**full** block of its known tokens (and the hasher's lookahead tokens after
it), extended as tokens arrive."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ironbatch.reference.block_hash import BlockHasher, ExtraKey, MmKey, block_hash
from ironbatch.reference.multimodal import MultimodalInput


@dataclass(frozen=True)
class MmSpan:
    """Where a multimodal input's placeholders lie, for the hashes of the
    blocks they fall in."""

    offset: int
    end: int
    identifier: str


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
        #: The request's multimodal inputs, sorted; None for text.
        self._mm: tuple[MmSpan, ...] | None = None
        #: A prompt given as embeddings: each block's digest of them, for the
        #: blocks the prompt overlaps (later ones are keyed as past it); None
        #: for a prompt of tokens.
        self._embeds: tuple[bytes, ...] | None = None

    def key_by_embeds(
        self, digests: Sequence[bytes], hasher: BlockHasher, tokens: list[int], block_size: int
    ) -> None:
        """Key every block by the digest of its prompt embeddings (§7.4):
        the ``k``-th digest for block ``k``, an empty one past them; hashing
        ``tokens`` again from the root."""
        self._embeds = tuple(bytes(d) for d in digests)
        self.clear()
        self.extend(hasher, tokens, block_size)

    def key_by_mm(
        self,
        inputs: Sequence[MultimodalInput],
        hasher: BlockHasher,
        tokens: list[int],
        block_size: int,
    ) -> None:
        """Key every block by the multimodal inputs it holds (§7.4), hashing
        ``tokens`` again from the root."""
        self._mm = tuple(MmSpan(m.offset, m.end(), m.identifier) for m in inputs) or None
        self.clear()
        self.extend(hasher, tokens, block_size)

    def add_mm(self, inputs: Sequence[MultimodalInput]) -> None:
        """Key the blocks not hashed yet by ``inputs`` too (a streaming
        session's next chunk brings them, placed after everything the chain
        holds)."""
        if not inputs:
            return
        spans = tuple(MmSpan(m.offset, m.end(), m.identifier) for m in inputs)
        self._mm = (self._mm or ()) + spans

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
            if self._mm is None and self._embeds is None:
                self.next_key = hasher.next(self.next_key, message)
            else:
                # An input is in the block when their ranges overlap.
                # The lookahead tokens' items key the block too (vLLM's
                # lookahead extra keys).
                start, end = k * block_size, (k + 1) * block_size + lookahead
                keys = [
                    MmKey(m.offset - start, m.identifier)
                    for m in self._mm or ()
                    if m.offset < end and start < m.end
                ]
                embeds = None
                if self._embeds is not None:
                    embeds = self._embeds[k] if k < len(self._embeds) else b""
                self.next_key = hasher.next_with_keys(self.next_key, message, keys, embeds)
            self._hashes.append(block_hash(self.next_key))
