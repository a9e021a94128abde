"""Block hashes (docs/scheduling.md §7.4) as a keyed chain: each full
block's 256-bit chain key is a keyed hash, keyed by its parent's chain key,
over the block's tokens; the first key comes from a secret per-cache key and
the request's extra keys (``cache_salt``, a LoRA adapter). The prefix-cache map uses
the first 128 bits. A block holding multimodal placeholders adds, after
its tokens, each input's offset relative to the block and its identifier.

    key[-1] = H_secret("ironbatch-root" | count:u32 | (tag:u8 | (len:u32 | bytes)+)*)
    key[k]  = H_key[k-1](tokens of block k as u32 little-endian
                         [| count:u32 | (offset:i64 | len:u32 | identifier)*])
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
from collections.abc import Sequence
from dataclasses import dataclass

ROOT_TAG = b"ironbatch-root"


@dataclass(frozen=True)
class CacheSalt:
    """An extra key that isolates a request's prefix-cache entries (the
    core's ``ExtraKey::CacheSalt``). Each kind of extra key has a tag of its
    own; multimodal items come later."""

    salt: str

    def tag(self) -> int:
        return 1

    def parts(self) -> list[bytes]:
        return [self.salt.encode()]


@dataclass(frozen=True)
class LoraKey:
    """A LoRA adapter's name and path (the core's ``ExtraKey::Lora``; vLLM
    keys every block by both): the same tokens under another adapter are
    other KV."""

    name: str
    path: str

    def tag(self) -> int:
        return 2

    def parts(self) -> list[bytes]:
        return [self.name.encode(), self.path.encode()]


#: Extra inputs to a request's hashes besides its tokens.
ExtraKey = CacheSalt | LoraKey


@dataclass(frozen=True)
class MmKey:
    """One multimodal input in a block, as the block's hash keys it: where
    its placeholders start relative to the block's first token (negative
    when it began in an earlier block), and its identifier. vLLM keys a
    block by the same pair, so equal placeholder tokens of other images, or
    of the same image elsewhere in the block, are other KV."""

    relative_offset: int
    identifier: str


class BlockHasher:
    """Holds a cache's secret key and hash lookahead; all requests of one
    cache share it so that equal prefixes hash equal."""

    def __init__(self, secret: bytes | None = None, lookahead: int = 0) -> None:
        """A fresh secret from the OS, or a fixed one (reproducible hashes);
        each block's hash covers the ``lookahead`` tokens after it too."""
        self._secret = os.urandom(32) if secret is None else secret
        self._lookahead = lookahead

    def __repr__(self) -> str:
        return f"BlockHasher(secret=<hidden>, lookahead={self._lookahead})"

    def with_lookahead(self, lookahead: int) -> BlockHasher:
        """The same key, each block's hash covering ``lookahead`` tokens after it."""
        return BlockHasher(self._secret, lookahead)

    @property
    def lookahead(self) -> int:
        """Tokens after each block that its hash covers."""
        return self._lookahead

    def root(self, extras: Sequence[ExtraKey] = ()) -> bytes:
        """The chain key a request's first block is hashed under."""
        h = hashlib.blake2b(key=self._secret, digest_size=32)
        h.update(ROOT_TAG + struct.pack("<I", len(extras)))
        for e in extras:
            h.update(struct.pack("<B", e.tag()))
            for part in e.parts():
                h.update(struct.pack("<I", len(part)) + part)
        return h.digest()

    def next(self, parent: bytes, tokens: list[int]) -> bytes:
        """The chain key of a full block, given its parent's chain key."""
        return hashlib.blake2b(
            struct.pack(f"<{len(tokens)}I", *tokens), key=parent, digest_size=32
        ).digest()

    def next_with_mm(self, parent: bytes, tokens: list[int], keys: Sequence[MmKey]) -> bytes:
        """``next`` for a block that holds multimodal placeholders: the keys
        follow the tokens in the message, counted and length-prefixed (a
        plain block's message is exactly its tokens, so never the same)."""
        return self.next_with_keys(parent, tokens, keys, None)

    def next_with_keys(
        self, parent: bytes, tokens: list[int], keys: Sequence[MmKey], embeds: bytes | None
    ) -> bytes:
        """``next`` for a block with multimodal keys, a prompt-embeddings
        digest (``embeds``: the digest of the block's prompt embeddings,
        empty past the prompt), or both: after the tokens, the count of
        items and each one, then a flag and, with it, the length-prefixed
        digest."""
        if not keys and embeds is None:
            return self.next(parent, tokens)
        h = hashlib.blake2b(key=parent, digest_size=32)
        h.update(struct.pack(f"<{len(tokens)}I", *tokens))
        h.update(struct.pack("<I", len(keys)))
        for k in keys:
            identifier = k.identifier.encode()
            h.update(struct.pack("<qI", k.relative_offset, len(identifier)) + identifier)
        if embeds is not None:
            h.update(struct.pack("<BI", 1, len(embeds)) + embeds)
        return h.digest()


def block_hash(key: bytes) -> int:
    """The map's 128-bit hash of a chain key."""
    return int.from_bytes(key[:16], "little")
