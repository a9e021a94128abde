//! The prefix-cache map (docs/scheduling.md §7.3): block hash → the blocks cached under it.
//!
//! Identical blocks are not de-duplicated (block tables never change once
//! written), so a hash can hold several blocks; a lookup answers with the
//! earliest inserted one still there.

use crate::block::BlockId;
use crate::block_hash::BlockHash;
use rustc_hash::FxHashMap;

/// Almost every hash holds one block; only duplicates pay for a `Vec`.
#[derive(Clone, Debug)]
enum Entry {
    One(BlockId),
    Many(Vec<BlockId>),
}

/// Hash → cached blocks, in insertion order per hash.
#[derive(Clone, Debug, Default)]
pub struct PrefixCacheMap {
    map: FxHashMap<BlockHash, Entry>,
    num_blocks: usize,
}

impl PrefixCacheMap {
    /// The earliest inserted block still cached under `hash`.
    pub fn get(&self, hash: BlockHash) -> Option<BlockId> {
        match self.map.get(&hash)? {
            Entry::One(b) => Some(*b),
            Entry::Many(bs) => bs.first().copied(),
        }
    }

    /// Add `block` under `hash`, after any blocks already there.
    pub fn insert(&mut self, hash: BlockHash, block: BlockId) {
        self.num_blocks += 1;
        match self.map.get_mut(&hash) {
            None => {
                self.map.insert(hash, Entry::One(block));
            }
            Some(Entry::One(first)) => {
                let first = *first;
                self.map.insert(hash, Entry::Many(vec![first, block]));
            }
            Some(Entry::Many(bs)) => bs.push(block),
        }
    }

    /// Remove the exact pair (`hash`, `block`); returns whether it was there.
    pub fn remove(&mut self, hash: BlockHash, block: BlockId) -> bool {
        let Some(entry) = self.map.get_mut(&hash) else {
            return false;
        };
        let removed = match entry {
            Entry::One(b) if *b == block => {
                self.map.remove(&hash);
                true
            }
            Entry::One(_) => false,
            Entry::Many(bs) => match bs.iter().position(|&b| b == block) {
                Some(i) => {
                    bs.remove(i);
                    if bs.len() == 1 {
                        *entry = Entry::One(bs[0]);
                    }
                    true
                }
                None => false,
            },
        };
        self.num_blocks -= removed as usize;
        removed
    }

    /// Number of (hash, block) pairs.
    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// Forget everything.
    pub fn clear(&mut self) {
        self.map.clear();
        self.num_blocks = 0;
    }

    /// Every (hash, blocks in insertion order), in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (BlockHash, &[BlockId])> {
        self.map.iter().map(|(h, e)| match e {
            Entry::One(b) => (*h, std::slice::from_ref(b)),
            Entry::Many(bs) => (*h, bs.as_slice()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicates_answer_earliest_and_remove_exact_pairs() {
        let mut m = PrefixCacheMap::default();
        let h = BlockHash(42);
        m.insert(h, 5);
        m.insert(h, 3);
        m.insert(h, 9);
        assert_eq!(m.get(h), Some(5));
        assert!(!m.remove(h, 7));
        assert!(m.remove(h, 5));
        assert_eq!(m.get(h), Some(3));
        assert!(m.remove(h, 9));
        assert_eq!(m.get(h), Some(3));
        assert_eq!(m.num_blocks(), 1);
        assert!(m.remove(h, 3));
        assert_eq!(m.get(h), None);
        assert!(!m.remove(h, 3));
        assert_eq!(m.num_blocks(), 0);
    }
}
