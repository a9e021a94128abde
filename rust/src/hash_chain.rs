//! A request's chain of block hashes (docs/scheduling.md §7.4): one hash per **full**
//! block of its known tokens, extended as tokens arrive.

use crate::block_hash::{block_hash, BlockHash, BlockHasher, ChainKey, ExtraKey};

/// The hashes of a token sequence's full blocks, in block order, and the
/// chain key the next full block will be hashed under.
#[derive(Clone, Debug, Default)]
pub struct BlockHashChain {
    hashes: Vec<BlockHash>,
    next_key: ChainKey,
    /// The key the first block is hashed under, to hash again from the start.
    root: ChainKey,
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
            root: next_key,
        }
    }

    /// The hashes so far.
    pub fn hashes(&self) -> &[BlockHash] {
        &self.hashes
    }

    /// Keep the hashes of the first `num_blocks` blocks only (a streaming
    /// session drops its last sampled token). The chain key is rebuilt from
    /// the root over `tokens`, whose first `num_blocks` blocks are those
    /// hashed.
    pub fn truncate(
        &mut self,
        num_blocks: usize,
        hasher: &BlockHasher,
        tokens: &[u32],
        block_size: usize,
    ) {
        if num_blocks >= self.hashes.len() {
            return;
        }
        self.hashes.clear();
        self.next_key = self.root;
        self.extend(hasher, &tokens[..num_blocks * block_size], block_size);
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
    fn truncate_then_extend_equals_hashing_the_new_tokens() {
        let h = BlockHasher::with_key([1; 32]);
        let old: Vec<u32> = (0..64).collect();
        let mut chain = BlockHashChain::new(&h, Some("s"));
        chain.extend(&h, &old, 16);
        let mut new = old[..47].to_vec();
        new.extend(100..120);
        chain.truncate(47 / 16, &h, &old, 16);
        chain.extend(&h, &new, 16);
        let mut fresh = BlockHashChain::new(&h, Some("s"));
        fresh.extend(&h, &new, 16);
        assert_eq!(chain.hashes(), fresh.hashes());
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
