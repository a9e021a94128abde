//! Block hashes (spec §7.4): a 128-bit keyed BLAKE3 over an unambiguous byte
//! encoding of (parent hash, the block's tokens, extra keys).
//!
//! Why keyed: the prefix cache trusts a hash match to mean "same tokens".
//! With a secret per-cache key the hash is a pseudo-random function, so a
//! crafted prompt cannot aim for a collision with another request's block
//! (it would need ~2^64 tries blind), and no token check is needed on a hit.
//!
//! Encoding (all integers little-endian):
//! ```text
//! parent:  0x00                       (the root: first block)
//!        | 0x01 hash:u128
//! tokens:  count:u32 token:u32 * count
//! extras:  count:u32 (tag:u8 len:u32 bytes * len) * count
//! ```

use crate::error::KvError;

/// The chained hash of one full block and everything before it.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockHash(pub u128);

/// Extra inputs to a block's hash besides its tokens. Later features add
/// LoRA adapters and multimodal items; each variant has its own tag.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum ExtraKey<'a> {
    /// Isolates a request's prefix-cache entries (block 0 only).
    CacheSalt(&'a str),
}

impl ExtraKey<'_> {
    fn tag(&self) -> u8 {
        match self {
            ExtraKey::CacheSalt(_) => 1,
        }
    }

    fn bytes(&self) -> &[u8] {
        match self {
            ExtraKey::CacheSalt(s) => s.as_bytes(),
        }
    }
}

/// Computes block hashes under one secret key; all requests of one cache
/// must share it so that equal prefixes hash equal.
#[derive(Clone)]
pub struct BlockHasher {
    key: [u8; 32],
}

impl std::fmt::Debug for BlockHasher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BlockHasher { key: <secret> }")
    }
}

/// Encodings up to this size are built on the stack (a 64-token block with
/// a short salt fits); longer ones use a heap buffer.
const STACK_BYTES: usize = 320;

impl BlockHasher {
    /// A hasher with a fresh key from the operating system's RNG.
    pub fn new_random() -> Result<Self, KvError> {
        let mut key = [0u8; 32];
        getrandom::fill(&mut key)
            .map_err(|e| KvError::invalid(format!("no OS randomness for the hash key: {e}")))?;
        Ok(Self::with_key(key))
    }

    /// A hasher with a fixed key (reproducible hash values, for tests).
    pub fn with_key(key: [u8; 32]) -> Self {
        BlockHasher { key }
    }

    /// The hash of a block given its parent's hash (`None` for block 0).
    pub fn hash_block(
        &self,
        parent: Option<BlockHash>,
        tokens: &[u32],
        extras: &[ExtraKey<'_>],
    ) -> BlockHash {
        let extra_len: usize = extras.iter().map(|e| 5 + e.bytes().len()).sum();
        let len = 17 + 4 + 4 * tokens.len() + 4 + extra_len;
        // One contiguous buffer and one `keyed_hash` call: for inputs under
        // 1 KiB that is a single BLAKE3 chunk, with no incremental state.
        let mut stack = [0u8; STACK_BYTES];
        let mut heap = Vec::new();
        let buf: &mut [u8] = if len <= STACK_BYTES {
            &mut stack[..len]
        } else {
            heap.resize(len, 0);
            &mut heap
        };
        let mut w = Writer { buf, at: 0 };
        match parent {
            None => w.put(&[0]),
            Some(p) => {
                w.put(&[1]);
                w.put(&p.0.to_le_bytes());
            }
        }
        w.put(&(tokens.len() as u32).to_le_bytes());
        for t in tokens {
            w.put(&t.to_le_bytes());
        }
        w.put(&(extras.len() as u32).to_le_bytes());
        for e in extras {
            w.put(&[e.tag()]);
            w.put(&(e.bytes().len() as u32).to_le_bytes());
            w.put(e.bytes());
        }
        let at = w.at;
        let digest = blake3::keyed_hash(&self.key, &w.buf[..at]);
        let mut out = [0u8; 16];
        out.copy_from_slice(&digest.as_bytes()[..16]);
        BlockHash(u128::from_le_bytes(out))
    }
}

struct Writer<'a> {
    buf: &'a mut [u8],
    at: usize,
}

impl Writer<'_> {
    fn put(&mut self, bytes: &[u8]) {
        self.buf[self.at..self.at + bytes.len()].copy_from_slice(bytes);
        self.at += bytes.len();
    }
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
        let a = h.hash_block(None, &[1, 2, 3], &[]);
        assert_eq!(a, h.hash_block(None, &[1, 2, 3], &[]));
        assert_eq!(
            h.hash_block(Some(a), &[4], &[]),
            h.hash_block(Some(a), &[4], &[])
        );
    }

    #[test]
    fn every_input_matters() {
        let h = hasher();
        let root = h.hash_block(None, &[1, 2, 3], &[]);
        let distinct = [
            root,
            h.hash_block(None, &[1, 2, 4], &[]),
            h.hash_block(None, &[1, 2], &[]),
            h.hash_block(Some(root), &[1, 2, 3], &[]),
            h.hash_block(Some(BlockHash(0)), &[1, 2, 3], &[]),
            h.hash_block(None, &[1, 2, 3], &[ExtraKey::CacheSalt("")]),
            h.hash_block(None, &[1, 2, 3], &[ExtraKey::CacheSalt("a")]),
            // 0x00 root tag vs a zero token must not alias.
            h.hash_block(None, &[0, 1, 2, 3], &[]),
        ];
        for i in 0..distinct.len() {
            for j in 0..i {
                assert_ne!(distinct[i], distinct[j], "inputs {i} and {j} collide");
            }
        }
    }

    #[test]
    fn keys_separate_caches() {
        let other = BlockHasher::with_key([8; 32]);
        assert_ne!(
            hasher().hash_block(None, &[1], &[]),
            other.hash_block(None, &[1], &[])
        );
        let r1 = BlockHasher::new_random().unwrap();
        let r2 = BlockHasher::new_random().unwrap();
        assert_ne!(
            r1.hash_block(None, &[1], &[]),
            r2.hash_block(None, &[1], &[])
        );
    }

    #[test]
    fn long_blocks_use_all_tokens() {
        let h = hasher();
        let a: Vec<u32> = (0..40).collect();
        let mut b = a.clone();
        b[39] = 1000;
        assert_ne!(h.hash_block(None, &a, &[]), h.hash_block(None, &b, &[]));
    }
}
