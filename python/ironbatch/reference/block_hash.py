"""Block hashes (spec §7.4) as a keyed chain: each full block's 256-bit chain
key is a keyed hash, keyed by its parent's chain key, over the block's
tokens; the first key comes from a secret per-cache key and the request's
extra keys (such as ``cache_salt``). The prefix-cache map uses the first 128
bits.

    key[-1] = H_secret("ironbatch-root" | count:u32 | (tag:u8 | len:u32 | bytes)*)
    key[k]  = H_key[k-1](tokens of block k as u32 little-endian)
    hash[k] = the first 16 bytes of key[k]

With a secret root the chain is a pseudo-random function, so a crafted
prompt cannot aim a collision at another request's blocks and a hit needs no
token check. The twin uses keyed BLAKE2b; the Rust core keyed BLAKE3 with the
same structure (one compression per 16-token block). They share decisions,
never hash values.
"""

from __future__ import annotations

import hashlib
import os
import struct

#: Tag of the cache-salt extra key (later: LoRA, multimodal items).
CACHE_SALT_TAG = 1
ROOT_TAG = b"ironbatch-root"


class BlockHasher:
    def __init__(self, secret: bytes | None = None) -> None:
        self._secret = os.urandom(32) if secret is None else secret

    def root(self, cache_salt: str | None = None) -> bytes:
        """The chain key a request's first block is hashed under."""
        extras = [] if cache_salt is None else [(CACHE_SALT_TAG, cache_salt.encode())]
        h = hashlib.blake2b(key=self._secret, digest_size=32)
        h.update(ROOT_TAG + struct.pack("<I", len(extras)))
        for tag, data in extras:
            h.update(struct.pack("<BI", tag, len(data)) + data)
        return h.digest()

    def next(self, parent: bytes, tokens: list[int]) -> bytes:
        """The chain key of a full block, given its parent's chain key."""
        return hashlib.blake2b(
            struct.pack(f"<{len(tokens)}I", *tokens), key=parent, digest_size=32
        ).digest()


def block_hash(key: bytes) -> int:
    """The map's 128-bit hash of a chain key."""
    return int.from_bytes(key[:16], "little")
