"""A request's tokens as the KV cache sees them: the known tokens, how many
of them have (or this step will have) KV in the cache, and the hashes of its
full blocks."""

from __future__ import annotations

from ironbatch.reference.block_hash import BlockHasher
from ironbatch.reference.hash_chain import BlockHashChain


class Sequence:
    def __init__(
        self, prompt: list[int], cache_salt: str | None, hasher: BlockHasher, block_size: int
    ) -> None:
        self.tokens = list(prompt)
        self.num_prompt_tokens = len(prompt)
        self.num_computed_tokens = 0
        self.chain = BlockHashChain(hasher, cache_salt)
        self.chain.extend(self.tokens, block_size, hasher)

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    @property
    def block_hashes(self) -> list[int]:
        return self.chain.hashes

    def append(self, tokens: list[int], hasher: BlockHasher, block_size: int) -> None:
        self.tokens.extend(tokens)
        self.chain.extend(self.tokens, block_size, hasher)
