"""A request's chain of block hashes (spec §7.4): one per full block of its
known tokens, extended as tokens arrive. A partly filled block has none."""

from __future__ import annotations

from ironbatch.reference.block_hash import BlockHasher


def extend_block_hashes(
    hashes: list[int],
    tokens: list[int],
    block_size: int,
    hasher: BlockHasher,
    cache_salt: str | None,
) -> None:
    """Append to ``hashes`` the hash of every full block of ``tokens`` (the
    whole known sequence) that has none yet. The salt enters block 0 only."""
    for k in range(len(hashes), len(tokens) // block_size):
        parent = hashes[k - 1] if k > 0 else None
        block = tokens[k * block_size : (k + 1) * block_size]
        hashes.append(hasher.hash_block(parent, block, cache_salt if k == 0 else None))
