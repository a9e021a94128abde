//! Block hashes (docs/scheduling.md §7.4) as a keyed chain: each full block's 256-bit
//! chain key is BLAKE3 keyed by its parent's chain key, over the block's
//! tokens; the first key is derived from a secret per-cache key and the
//! request's extra keys (`cache_salt`, a LoRA adapter). The prefix-cache map uses
//! the first 128 bits.
//!
//! ```text
//! key[-1] = BLAKE3_keyed(secret, "ironbatch-root" ‖ count:u32 ‖ (tag:u8 ‖ (len:u32 ‖ bytes)+)*)
//! key[k]  = BLAKE3_keyed(key[k−1], tokens of block k, then the H tokens after it,
//!                         as u32 little-endian)
//! hash[k] = the first 16 bytes of key[k]
//! ```
//!
//! H is the cache's hash lookahead (vLLM's `num_hash_lookahead_tokens`;
//! 0 unless an EAGLE-style drafter runs with prefix caching): the drafter's
//! KV at a block's last position depends on the next token, so a block is
//! only the same block when that token is the same too, and its hash exists
//! only once that token is known (docs/scheduling.md §7.4).
//!
//! Why this shape: keyed BLAKE3 is a pseudo-random function, so with a
//! secret root a crafted prompt cannot aim a collision at another request's
//! blocks (it would need ~2^64 blind tries against 128 bits), and a hit
//! needs no token check. Chaining through the key rather than hashing the
//! parent into the message keeps a 16-token block to 64 bytes: one BLAKE3
//! compression per block instead of two. Every message is a whole block of
//! the cache's fixed block size, so lengths cannot alias; the extra keys are
//! tagged and length-prefixed in the root.

use crate::error::Error;
use smallvec::{smallvec, SmallVec};

/// The 128-bit hash of one full block and everything before it.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockHash(pub u128);

/// A chain key: the full 256-bit state from which the next block's hash is
/// derived.
pub type ChainKey = [u8; 32];

/// Extra inputs to a request's hashes besides its tokens; each variant has
/// its own tag, and its parts are length-prefixed. Multimodal items come
/// later.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum ExtraKey<'a> {
    /// Isolates a request's prefix-cache entries.
    CacheSalt(&'a str),
    /// A LoRA adapter's name and path (vLLM keys every block by both):
    /// the same tokens under another adapter are other KV.
    Lora { name: &'a str, path: &'a str },
}

impl ExtraKey<'_> {
    fn tag(&self) -> u8 {
        match self {
            ExtraKey::CacheSalt(_) => 1,
            ExtraKey::Lora { .. } => 2,
        }
    }

    fn parts(&self) -> SmallVec<[&[u8]; 2]> {
        match self {
            ExtraKey::CacheSalt(s) => smallvec![s.as_bytes()],
            ExtraKey::Lora { name, path } => smallvec![name.as_bytes(), path.as_bytes()],
        }
    }
}

const ROOT_TAG: &[u8] = b"ironbatch-root";

/// Holds a cache's secret key and hash lookahead; all requests of one cache
/// must share it so that equal prefixes hash equal.
#[derive(Clone)]
pub struct BlockHasher {
    secret: [u8; 32],
    /// Tokens after each block that its hash covers too.
    lookahead: usize,
}

impl std::fmt::Debug for BlockHasher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "BlockHasher {{ secret: <hidden>, lookahead: {} }}",
            self.lookahead
        )
    }
}

impl BlockHasher {
    /// A hasher with a fresh secret from the operating system's RNG.
    pub fn new_random() -> Result<Self, Error> {
        let mut secret = [0u8; 32];
        getrandom::fill(&mut secret).map_err(|e| Error::NoRandomness(e.to_string()))?;
        Ok(Self::with_key(secret))
    }

    /// A hasher with a fixed secret (reproducible hash values, for tests).
    pub fn with_key(secret: [u8; 32]) -> Self {
        BlockHasher {
            secret,
            lookahead: 0,
        }
    }

    /// The same hasher, each block's hash covering the `lookahead` tokens
    /// after it too.
    pub fn with_lookahead(self, lookahead: usize) -> Self {
        BlockHasher { lookahead, ..self }
    }

    /// Tokens after each block that its hash covers.
    pub fn lookahead(&self) -> usize {
        self.lookahead
    }

    /// The chain key a request's first block is hashed under.
    pub fn root(&self, extras: &[ExtraKey<'_>]) -> ChainKey {
        let mut h = blake3::Hasher::new_keyed(&self.secret);
        h.update(ROOT_TAG);
        h.update(&(extras.len() as u32).to_le_bytes());
        for e in extras {
            h.update(&[e.tag()]);
            for part in e.parts() {
                h.update(&(part.len() as u32).to_le_bytes());
                h.update(part);
            }
        }
        *h.finalize().as_bytes()
    }

    /// The chain key of a full block given its parent's chain key.
    pub fn next(&self, parent: &ChainKey, tokens: &[u32]) -> ChainKey {
        let mut stack = [0u8; 256];
        let len = 4 * tokens.len();
        if len <= stack.len() {
            for (dst, t) in stack.chunks_exact_mut(4).zip(tokens) {
                dst.copy_from_slice(&t.to_le_bytes());
            }
            return *blake3::keyed_hash(parent, &stack[..len]).as_bytes();
        }
        let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
        *blake3::keyed_hash(parent, &bytes).as_bytes()
    }
}

/// One multimodal input in a block, as the block's hash keys it: where its
/// placeholders start relative to the block's first token (negative when
/// it began in an earlier block), and its identifier. vLLM keys a block by
/// the same pair, so equal placeholder tokens of other images, or of the
/// same image elsewhere in the block, are other KV.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct MmKey<'a> {
    pub relative_offset: i64,
    pub identifier: &'a str,
}

impl BlockHasher {
    /// [`Self::next`] for a block that holds multimodal placeholders: the
    /// keys follow the tokens in the message, counted and length-prefixed
    /// (a plain block's message is exactly its tokens, so never the same).
    pub fn next_with_mm(&self, parent: &ChainKey, tokens: &[u32], keys: &[MmKey<'_>]) -> ChainKey {
        self.next_with_keys(parent, tokens, keys, None)
    }

    /// [`Self::next`] for a block with multimodal keys, a prompt-embeddings
    /// digest (`embeds`: the digest of the block's prompt embeddings, empty
    /// past the prompt), or both: after the tokens, the count of items and
    /// each one, then a flag and, with it, the length-prefixed digest.
    pub fn next_with_keys(
        &self,
        parent: &ChainKey,
        tokens: &[u32],
        keys: &[MmKey<'_>],
        embeds: Option<&[u8]>,
    ) -> ChainKey {
        if keys.is_empty() && embeds.is_none() {
            return self.next(parent, tokens);
        }
        let mut h = blake3::Hasher::new_keyed(parent);
        for t in tokens {
            h.update(&t.to_le_bytes());
        }
        h.update(&(keys.len() as u32).to_le_bytes());
        for k in keys {
            h.update(&k.relative_offset.to_le_bytes());
            h.update(&(k.identifier.len() as u32).to_le_bytes());
            h.update(k.identifier.as_bytes());
        }
        if let Some(digest) = embeds {
            h.update(&[1]);
            h.update(&(digest.len() as u32).to_le_bytes());
            h.update(digest);
        }
        *h.finalize().as_bytes()
    }
}

/// The map's 128-bit hash of a chain key.
pub fn block_hash(key: &ChainKey) -> BlockHash {
    let mut first = [0u8; 16];
    first.copy_from_slice(&key[..16]);
    BlockHash(u128::from_le_bytes(first))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hasher() -> BlockHasher {
        BlockHasher::with_key([7; 32])
    }

    #[test]
    fn equal_inputs_hash_equal() {
        let h = hasher();
        let root = h.root(&[]);
        assert_eq!(root, h.root(&[]));
        assert_eq!(h.next(&root, &[1, 2, 3]), h.next(&root, &[1, 2, 3]));
    }

    #[test]
    fn every_input_matters() {
        let h = hasher();
        let root = h.root(&[]);
        let first = h.next(&root, &[1, 2, 3]);
        let distinct = [
            first,
            h.next(&root, &[1, 2, 4]),
            h.next(&root, &[1, 2]),
            h.next(&root, &[1, 2, 3, 0]),
            h.next(&first, &[1, 2, 3]),
            h.next(&h.root(&[ExtraKey::CacheSalt("")]), &[1, 2, 3]),
            h.next(&h.root(&[ExtraKey::CacheSalt("a")]), &[1, 2, 3]),
            root,
        ];
        for i in 0..distinct.len() {
            for j in 0..i {
                assert_ne!(distinct[i], distinct[j], "inputs {i} and {j} collide");
            }
        }
    }

    #[test]
    fn multimodal_keys_tell_images_and_places_apart() {
        let h = hasher();
        let root = h.root(&[]);
        let tokens = [5u32; 4];
        let at = |relative_offset, identifier| MmKey {
            relative_offset,
            identifier,
        };
        let distinct = [
            h.next(&root, &tokens),
            h.next_with_mm(&root, &tokens, &[at(0, "a")]),
            h.next_with_mm(&root, &tokens, &[at(0, "b")]),
            h.next_with_mm(&root, &tokens, &[at(-1, "a")]),
            h.next_with_mm(&root, &tokens, &[at(0, "a"), at(2, "b")]),
        ];
        for i in 0..distinct.len() {
            for j in 0..i {
                assert_ne!(distinct[i], distinct[j], "keys {i} and {j} collide");
            }
        }
        assert_eq!(h.next_with_mm(&root, &tokens, &[]), h.next(&root, &tokens));
        let embeds = [
            h.next_with_keys(&root, &tokens, &[], Some(b"d1")),
            h.next_with_keys(&root, &tokens, &[], Some(b"d2")),
            h.next_with_keys(&root, &tokens, &[], Some(b"")),
            h.next_with_keys(&root, &tokens, &[at(0, "a")], Some(b"d1")),
        ];
        for (i, e) in embeds.iter().enumerate() {
            assert!(!distinct.contains(e), "embeds key {i} collides");
            assert!(
                embeds[..i].iter().all(|o| o != e),
                "embeds key {i} collides"
            );
        }
    }

    #[test]
    fn secrets_separate_caches() {
        let other = BlockHasher::with_key([8; 32]);
        assert_ne!(hasher().root(&[]), other.root(&[]));
        let r1 = BlockHasher::new_random().unwrap();
        let r2 = BlockHasher::new_random().unwrap();
        assert_ne!(r1.next(&r1.root(&[]), &[1]), r2.next(&r2.root(&[]), &[1]));
    }

    #[test]
    fn long_blocks_use_every_token() {
        let h = hasher();
        let root = h.root(&[]);
        let a: Vec<u32> = (0..100).collect(); // past the stack buffer
        let mut b = a.clone();
        b[99] = 1000;
        assert_ne!(h.next(&root, &a), h.next(&root, &b));
        assert_eq!(h.next(&root, &a), h.next(&root, &a.clone()));
    }
}
