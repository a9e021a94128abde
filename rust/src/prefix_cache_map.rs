//! The prefix-cache map (docs/scheduling.md §7.3): block hash → the blocks cached under it.
//!
//! Identical blocks are not de-duplicated (block tables never change once
//! written), so a hash can hold several blocks; a lookup answers with the
//! earliest inserted one still there.
//!
//! An open-addressing table with linear probing, indexed by the hash's low
//! bits: block hashes are keyed BLAKE3 output, uniformly random, so they
//! need no hashing of their own, and a hash's home slot is known before it
//! is probed. A slot holds the hash and the block in 32 bytes, so a probe
//! that finds its key at home reads one cache line, and a pass over many
//! hashes can read their home slots ahead (`read_ahead`) to overlap the
//! misses. Equal hashes sit in insertion order along their probe sequence:
//! an insert takes the first empty slot after all of them, and a removal
//! shifts the entries after it back, keeping their order.

use crate::block::{BlockId, NULL_BLOCK};
use crate::block_hash::BlockHash;

/// One slot: empty when `block` is the null block, which is never cached.
#[derive(Clone, Copy, Debug, Default)]
#[repr(C, align(32))]
struct Slot {
    hash: u128,
    block: BlockId,
}

/// Hash → cached blocks, in insertion order per hash.
#[derive(Clone, Debug, Default)]
pub struct PrefixCacheMap {
    /// A power of two long (or empty); at most half full.
    slots: Vec<Slot>,
    len: usize,
}

/// Slots in a new table: room for a small pool's blocks.
const MIN_SLOTS: usize = 1024;

impl PrefixCacheMap {
    /// A map sized for `blocks` cached blocks (a pool's, which never holds
    /// more), so it never grows while serving.
    pub fn with_capacity(blocks: usize) -> Self {
        PrefixCacheMap {
            slots: vec![Slot::default(); (2 * blocks).next_power_of_two().max(MIN_SLOTS)],
            len: 0,
        }
    }

    fn mask(&self) -> usize {
        self.slots.len() - 1
    }

    fn home(&self, hash: BlockHash) -> usize {
        hash.0 as usize & self.mask()
    }

    /// The earliest inserted block still cached under `hash`.
    pub fn get(&self, hash: BlockHash) -> Option<BlockId> {
        if self.slots.is_empty() {
            return None;
        }
        let mut i = self.home(hash);
        loop {
            let s = self.slots[i];
            if s.block == NULL_BLOCK {
                return None;
            }
            if s.hash == hash.0 {
                return Some(s.block);
            }
            i = (i + 1) & self.mask();
        }
    }

    /// Add `block` under `hash`, after any blocks already there.
    pub fn insert(&mut self, hash: BlockHash, block: BlockId) {
        debug_assert_ne!(block, NULL_BLOCK);
        if 2 * (self.len + 1) > self.slots.len() {
            self.grow();
        }
        let mut i = self.home(hash);
        while self.slots[i].block != NULL_BLOCK {
            i = (i + 1) & self.mask();
        }
        self.slots[i] = Slot {
            hash: hash.0,
            block,
        };
        self.len += 1;
    }

    /// Remove the exact pair (`hash`, `block`); returns whether it was there.
    pub fn remove(&mut self, hash: BlockHash, block: BlockId) -> bool {
        if self.slots.is_empty() {
            return false;
        }
        let mask = self.mask();
        let mut hole = self.home(hash);
        loop {
            let s = self.slots[hole];
            if s.block == NULL_BLOCK {
                return false;
            }
            if s.hash == hash.0 && s.block == block {
                break;
            }
            hole = (hole + 1) & mask;
        }
        // Shift back each later entry of the run whose home is not between
        // the hole and it: probes still find it, and equal hashes keep
        // their order.
        let mut j = hole;
        loop {
            j = (j + 1) & mask;
            let s = self.slots[j];
            if s.block == NULL_BLOCK {
                break;
            }
            let home = s.hash as usize & mask;
            let stays = if hole <= j {
                hole < home && home <= j
            } else {
                hole < home || home <= j
            };
            if !stays {
                self.slots[hole] = s;
                hole = j;
            }
        }
        self.slots[hole] = Slot::default();
        self.len -= 1;
        true
    }

    /// Read the home slot of each hash, so that a pass over them that
    /// follows finds those lines cached: the loop's reads do not depend on
    /// each other, so their misses overlap. Returns a value for the caller
    /// to pass to `std::hint::black_box`.
    pub fn read_ahead(&self, hashes: impl Iterator<Item = BlockHash>) -> usize {
        if self.slots.is_empty() {
            return 0;
        }
        let mut sum = 0usize;
        for hash in hashes {
            sum = sum.wrapping_add(self.slots[self.home(hash)].block as usize);
        }
        sum
    }

    /// Twice the slots, every entry re-inserted in its old probe order.
    fn grow(&mut self) {
        let size = (2 * self.slots.len()).max(MIN_SLOTS);
        let old = std::mem::replace(&mut self.slots, vec![Slot::default(); size]);
        self.len = 0;
        // Walking the old table from the start of a run keeps each hash's
        // blocks in order: begin just after an empty slot.
        let Some(start) = old.iter().position(|s| s.block == NULL_BLOCK) else {
            return;
        };
        for k in 0..old.len() {
            let s = old[(start + k) % old.len()];
            if s.block != NULL_BLOCK {
                self.insert(BlockHash(s.hash), s.block);
            }
        }
    }

    /// Number of (hash, block) pairs.
    pub fn num_blocks(&self) -> usize {
        self.len
    }

    /// Forget everything.
    pub fn clear(&mut self) {
        self.slots.fill(Slot::default());
        self.len = 0;
    }

    /// Every (hash, blocks in insertion order), in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (BlockHash, Vec<BlockId>)> + '_ {
        let mut seen = rustc_hash::FxHashSet::default();
        self.slots
            .iter()
            .filter(|s| s.block != NULL_BLOCK)
            .filter(move |s| seen.insert(s.hash))
            .map(|s| (BlockHash(s.hash), self.blocks_of(BlockHash(s.hash))))
    }

    /// Every block under `hash`, in insertion order.
    fn blocks_of(&self, hash: BlockHash) -> Vec<BlockId> {
        let mut out = Vec::new();
        let mut i = self.home(hash);
        while self.slots[i].block != NULL_BLOCK {
            if self.slots[i].hash == hash.0 {
                out.push(self.slots[i].block);
            }
            i = (i + 1) & self.mask();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

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

    /// What the map must do: (hash, block) pairs in insertion order.
    #[derive(Default)]
    struct Model(Vec<(u128, BlockId)>);

    impl Model {
        fn get(&self, h: u128) -> Option<BlockId> {
            self.0.iter().find(|p| p.0 == h).map(|p| p.1)
        }
        fn blocks_of(&self, h: u128) -> Vec<BlockId> {
            self.0.iter().filter(|p| p.0 == h).map(|p| p.1).collect()
        }
    }

    #[derive(Clone, Debug)]
    enum Op {
        Insert(u128),
        Remove(usize),
        RemoveAbsent(u128, BlockId),
    }

    /// Hashes whose home slots crowd the table's end and start, so runs
    /// wrap around, collide and shift; a few share a hash outright.
    fn hash_strategy() -> impl Strategy<Value = u128> {
        (0u128..6, 0u128..4).prop_map(|(high, low)| (high << 64) | ((1021 + low * 2) % 1024))
    }

    proptest! {
        // 300 cases, or PROPTEST_CASES where that asks for more (full size).
        #![proptest_config(ProptestConfig {
            cases: ProptestConfig::default().cases.max(300),
            ..ProptestConfig::default()
        })]
        #[test]
        fn agrees_with_a_list_in_insertion_order(
            ops in proptest::collection::vec(
                prop_oneof![
                    4 => hash_strategy().prop_map(Op::Insert),
                    3 => (0usize..64).prop_map(Op::Remove),
                    1 => (hash_strategy(), 1u32..5000).prop_map(|(h, b)| Op::RemoveAbsent(h, b)),
                ],
                1..700,
            )
        ) {
            let mut m = PrefixCacheMap::default();
            let mut model = Model::default();
            let mut next_block = 1u32;
            for op in ops {
                match op {
                    Op::Insert(h) => {
                        m.insert(BlockHash(h), next_block);
                        model.0.push((h, next_block));
                        next_block += 1;
                    }
                    Op::Remove(i) if !model.0.is_empty() => {
                        let (h, b) = model.0.remove(i % model.0.len());
                        prop_assert!(m.remove(BlockHash(h), b));
                    }
                    Op::Remove(_) => {}
                    Op::RemoveAbsent(h, b) => {
                        // Block ids from 10,000 on were never inserted.
                        prop_assert!(!m.remove(BlockHash(h), b + 10_000));
                    }
                }
                prop_assert_eq!(m.num_blocks(), model.0.len());
                for h in model.0.iter().map(|p| p.0).chain([0, 1021, 7]) {
                    prop_assert_eq!(m.get(BlockHash(h)), model.get(h));
                }
            }
            let mut got: Vec<(u128, Vec<BlockId>)> = m.iter().map(|(h, b)| (h.0, b)).collect();
            got.sort();
            let mut want: Vec<(u128, Vec<BlockId>)> = model.0.iter().map(|p| p.0).collect::<std::collections::BTreeSet<_>>()
                .into_iter().map(|h| (h, model.blocks_of(h))).collect();
            want.sort();
            prop_assert_eq!(got, want);
        }
    }

    #[test]
    fn growing_keeps_each_hashs_blocks_in_order() {
        let mut m = PrefixCacheMap::default();
        // 3,000 blocks under 7 hashes that share their home slot: the table
        // grows twice with long runs that wrap around its end.
        let hash = |i: u32| BlockHash(((i % 7) as u128) << 64 | 1023);
        for b in 1..=3000 {
            m.insert(hash(b), b);
        }
        for b in (3..=3000).step_by(3) {
            assert!(m.remove(hash(b), b));
        }
        for h in 0..7u32 {
            let want: Vec<BlockId> = (1..=3000).filter(|b| b % 7 == h && b % 3 != 0).collect();
            assert_eq!(m.blocks_of(hash(h)), want);
            assert_eq!(m.get(hash(h)), want.first().copied());
        }
        assert_eq!(m.num_blocks(), 2000);
    }
}
