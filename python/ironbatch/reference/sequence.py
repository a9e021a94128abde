"""A request's tokens as the KV cache sees them: the known tokens, how many
of them have (or this step will have) KV in the cache, and the hash chain of
its full blocks."""

from __future__ import annotations

from collections.abc import Sequence as Seq

from ironbatch.reference.block_hash import BlockHasher, ExtraKey
from ironbatch.reference.hash_chain import BlockHashChain
from ironbatch.reference.multimodal import MultimodalInput


class Sequence:
    """The token state of one request."""

    def __init__(
        self, prompt: list[int], extras: list[ExtraKey], hasher: BlockHasher, block_size: int
    ) -> None:
        """A sequence of ``prompt`` tokens, with the hashes of its full blocks."""
        self._tokens = list(prompt)
        self._num_prompt_tokens = len(prompt)
        #: Tokens whose KV is (or, this step, will be) in the cache.
        self.num_computed_tokens = 0
        #: Where a prefix this request shares with others ends, found at its
        #: last prefix lookup when a sliding-window group had not cached it (0
        #: for none): that group then keeps the blocks before it (vLLM's
        #: ``shared_prefix_boundary``).
        self.shared_prefix_boundary = 0
        self._hashes = BlockHashChain(hasher, extras)
        self._hashes.extend(hasher, self._tokens, block_size)

    def key_by_embeds(self, digests: Seq[bytes], hasher: BlockHasher, block_size: int) -> None:
        """Key its block hashes by its prompt embeddings' digests, hashing again."""
        self._hashes.key_by_embeds(digests, hasher, self._tokens, block_size)

    def key_by_mm(self, inputs: Seq[MultimodalInput], hasher: BlockHasher, block_size: int) -> None:
        """Key its block hashes by its multimodal inputs too, hashing again."""
        self._hashes.key_by_mm(inputs, hasher, self._tokens, block_size)

    def append(self, tokens: list[int], hasher: BlockHasher, block_size: int) -> None:
        """Append output tokens, hashing every block they complete."""
        self._tokens.extend(tokens)
        self._hashes.extend(hasher, self._tokens, block_size)

    def continue_session(
        self,
        keep: int,
        chunk: list[int],
        chunk_inputs: Seq[MultimodalInput],
        hasher: BlockHasher,
        block_size: int,
    ) -> None:
        """A streaming session's next turn: keep the first ``keep`` tokens
        (all but the last sampled one), append ``chunk`` (its images, placed
        already, key the blocks it fills), and make every token prompt
        (docs/scheduling.md §4.12)."""
        assert self.num_computed_tokens <= keep <= len(self._tokens)
        self._hashes.truncate(keep // block_size, hasher, self._tokens, block_size)
        del self._tokens[keep:]
        self._hashes.add_mm(chunk_inputs)
        self.append(chunk, hasher, block_size)
        self._num_prompt_tokens = len(self._tokens)

    def rehash(self, hasher: BlockHasher, block_size: int) -> None:
        """Hash every full block again from the start (a streaming session
        admitted afresh under a hash lookahead: its kept hashes may cover a
        token it dropped)."""
        self._hashes.clear()
        self._hashes.extend(hasher, self._tokens, block_size)

    @property
    def num_tokens(self) -> int:
        """Prompt plus output tokens."""
        return len(self._tokens)

    @property
    def num_prompt_tokens(self) -> int:
        return self._num_prompt_tokens

    @property
    def tokens(self) -> list[int]:
        """All known tokens (the sequence's own list: read, don't change)."""
        return self._tokens

    @property
    def block_hashes(self) -> list[int]:
        """One hash per full block."""
        return self._hashes.hashes()
