//! A request's chain of block hashes (docs/scheduling.md §7.4): one hash per **full**
//! block of its known tokens, extended as tokens arrive.

use crate::block_hash::{block_hash, BlockHash, BlockHasher, ChainKey, ExtraKey};

/// The hashes of a token sequence's full blocks, in block order, and the
/// chain key the next full block will be hashed under.
#[derive(Clone, Debug, Default)]
pub struct BlockHashChain {
    hashes: Vec<BlockHash>,
    next_key: ChainKey,
}

impl BlockHashChain {
    /// An empty chain rooted in the hasher's secret and `cache_salt`.
    pub fn new(hasher: &BlockHasher, cache_salt: Option<&str>) -> Self {
        let next_key = match cache_salt {
            Some(salt) => hasher.root(&[ExtraKey::CacheSalt(salt)]),
            None => hasher.root(&[]),
        };
        BlockHashChain {
            hashes: Vec::new(),
            next_key,
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
            let block = &tokens[k * block_size..(k + 1) * block_size];
            self.next_key = hasher.next(&self.next_key, block);
            self.hashes.push(block_hash(&self.next_key));
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
        let mut all = BlockHashChain::new(&h, None);
        all.extend(&h, &tokens, 16);
        assert_eq!(all.hashes().len(), 4);
        let mut step = BlockHashChain::new(&h, None);
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
        let mut plain = BlockHashChain::new(&h, None);
        let mut salted = BlockHashChain::new(&h, Some("A"));
        plain.extend(&h, &tokens, 16);
        salted.extend(&h, &tokens, 16);
        assert_ne!(plain.hashes()[0], salted.hashes()[0]);
        assert_ne!(plain.hashes()[1], salted.hashes()[1]);
    }
}
