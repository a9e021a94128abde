"""Block hashes (spec §7.4): 128-bit keyed BLAKE2b over an unambiguous byte
encoding of (parent hash, the block's tokens, extra keys).

The key is secret and per cache, so a crafted prompt cannot aim for another
request's hash (the hash is a pseudo-random function to the attacker), and a
hit never needs to re-check tokens. The encoding (little-endian):

    parent:  0x00 (root) | 0x01 hash:u128
    tokens:  count:u32, token:u32 * count
    extras:  count:u32, (tag:u8, len:u32, bytes) * count

The Rust core uses keyed BLAKE3 over the same encoding; the two never share
hashes, only decisions, which any collision-free hash makes identical.
"""

from __future__ import annotations

import hashlib
import os
import struct

#: Tag of the cache-salt extra key (later: LoRA, multimodal items).
CACHE_SALT_TAG = 1


class BlockHasher:
    def __init__(self, key: bytes | None = None) -> None:
        self._key = os.urandom(32) if key is None else key

    def hash_block(
        self, parent: int | None, tokens: list[int], cache_salt: str | None = None
    ) -> int:
        h = hashlib.blake2b(key=self._key, digest_size=16)
        h.update(b"\x00" if parent is None else b"\x01" + parent.to_bytes(16, "little"))
        h.update(struct.pack("<I", len(tokens)))
        h.update(struct.pack(f"<{len(tokens)}I", *tokens))
        extras = [] if cache_salt is None else [(CACHE_SALT_TAG, cache_salt.encode())]
        h.update(struct.pack("<I", len(extras)))
        for tag, data in extras:
            h.update(struct.pack("<BI", tag, len(data)) + data)
        return int.from_bytes(h.digest(), "little")
