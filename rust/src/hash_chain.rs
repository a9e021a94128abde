//! A request's chain of block hashes (spec §7.4): one hash per **full**
//! block of its known tokens, extended as tokens arrive.

use crate::block_hash::{BlockHash, BlockHasher, ExtraKey};

/// The hashes of a token sequence's full blocks, in block order.
#[derive(Clone, Debug, Default)]
pub struct BlockHashChain {
    hashes: Vec<BlockHash>,
    cache_salt: Option<Box<str>>,
}

impl BlockHashChain {
    /// An empty chain; `cache_salt` enters block 0's hash.
    pub fn new(cache_salt: Option<&str>) -> Self {
        BlockHashChain {
            hashes: Vec::new(),
            cache_salt: cache_salt.map(Into::into),
        }
    }

    /// The hashes so far.
    pub fn hashes(&self) -> &[BlockHash] {
        &self.hashes
    }

    /// Hash every full block of `tokens` not hashed yet. `tokens` is the
    /// whole known sequence; a partly filled last block gets no hash.
    pub fn extend(&mut self, hasher: &BlockHasher, tokens: &[u32], block_size: usize) {
        if tokens.len() < (self.hashes.len() + 1) * block_size {
            return; // no new full block: the common case, without a division
        }
        let full = tokens.len() / block_size;
        for k in self.hashes.len()..full {
            let parent = k.checked_sub(1).map(|p| self.hashes[p]);
            let block = &tokens[k * block_size..(k + 1) * block_size];
            let hash = match (&self.cache_salt, k) {
                (Some(salt), 0) => hasher.hash_block(parent, block, &[ExtraKey::CacheSalt(salt)]),
                _ => hasher.hash_block(parent, block, &[]),
            };
            self.hashes.push(hash);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn incremental_equals_at_once() {
        let h = BlockHasher::with_key([1; 32]);
        let tokens: Vec<u32> = (0..70).collect();
        let mut all = BlockHashChain::new(None);
        all.extend(&h, &tokens, 16);
        assert_eq!(all.hashes().len(), 4);
        let mut step = BlockHashChain::new(None);
        for n in 0..=tokens.len() {
            step.extend(&h, &tokens[..n], 16);
            assert_eq!(step.hashes().len(), n / 16);
        }
        assert_eq!(all.hashes(), step.hashes());
    }

    #[test]
    fn salt_changes_every_block() {
        let h = BlockHasher::with_key([1; 32]);
        let tokens: Vec<u32> = (0..32).collect();
        let mut plain = BlockHashChain::new(None);
        let mut salted = BlockHashChain::new(Some("A"));
        plain.extend(&h, &tokens, 16);
        salted.extend(&h, &tokens, 16);
        assert_ne!(plain.hashes()[0], salted.hashes()[0]);
        assert_ne!(plain.hashes()[1], salted.hashes()[1]);
    }
}
