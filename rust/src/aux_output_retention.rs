//! Which blocks' auxiliary outputs the workers still hold (docs/scheduling.md
//! §7.12): with `--enable-return-routed-experts`, each output carries the
//! experts its tokens were routed to, and a request that reuses cached KV
//! must get those tokens' routing too. The workers keep it per block, keyed
//! by the block's hash in one KV-cache group (the first full-attention
//! group, else group 0): for every block cached in that group, and for the
//! blocks finished requests left behind, up to a capacity, least recently
//! used out first. A prefix hit, local or from a KV connector, may reach
//! only over blocks whose routing is held (vLLM's `max_cache_hit` and
//! `cap_external_hit`).
//!
//! This is the scheduler's side of vLLM's `AuxOutputSchedulerConnector`:
//! what it remembers, at the moments vLLM's scheduler tells it something
//! (a lookup, a request's blocks going back, a request loading its KV, a
//! step scheduling a request, a prefix-cache reset). What a block being
//! cached means is asked of the KV cache at that moment.

use crate::block_hash::BlockHash;
use crate::slab::Slot;
use rustc_hash::FxHashMap;
use std::collections::BTreeMap;

/// The retained blocks (by the hash where each ends) in least recently
/// used order, and which a loading request reads.
#[derive(Clone, Debug)]
pub struct AuxOutputRetention {
    /// The group whose blocks key the routing.
    group: usize,
    /// That group's tokens per block.
    block_size: usize,
    /// Its block in hash blocks.
    hashes_per_block: usize,
    /// Retained block → its use stamp; `by_use` orders the stamps.
    retained: FxHashMap<BlockHash, u64>,
    by_use: BTreeMap<u64, BlockHash>,
    next_stamp: u64,
    /// Per request loading its KV from a connector: the blocks it reads
    /// (never released while it does).
    loading: FxHashMap<Slot, Vec<BlockHash>>,
}

impl AuxOutputRetention {
    /// Routing keyed by `group`'s blocks of `block_size` tokens, a request's
    /// hashes cut every `hash_block_size`.
    pub fn new(group: usize, block_size: usize, hash_block_size: usize) -> Self {
        AuxOutputRetention {
            group,
            block_size,
            hashes_per_block: (block_size / hash_block_size.max(1)).max(1),
            retained: FxHashMap::default(),
            by_use: BTreeMap::new(),
            next_stamp: 0,
            loading: FxHashMap::default(),
        }
    }

    /// The group whose blocks key the routing.
    pub fn group(&self) -> usize {
        self.group
    }

    /// The most tokens a prefix hit of a request with `hashes` and
    /// `num_tokens` tokens may cover: its blocks from the first while each
    /// is retained (now the most recently used) or `cached` in the group,
    /// short of its last token.
    pub fn max_cache_hit(
        &mut self,
        hashes: &[BlockHash],
        num_tokens: usize,
        cached: impl Fn(BlockHash) -> bool,
    ) -> usize {
        let mut num_blocks = 0;
        for end in self.block_ends(hashes.len()) {
            let key = hashes[end - 1];
            if self.retained.contains_key(&key) {
                self.touch(key);
            } else if !cached(key) {
                break;
            }
            num_blocks += 1;
        }
        (num_blocks * self.block_size).min(num_tokens.saturating_sub(1))
    }

    /// A connector's `num_external` tokens past a local hit of `num_local`,
    /// kept only when the whole hit ends on a block and reaches no further
    /// than [`Self::max_cache_hit`] (else none).
    pub fn cap_external_hit(
        &mut self,
        hashes: &[BlockHash],
        num_tokens: usize,
        num_local: usize,
        num_external: usize,
        cached: impl Fn(BlockHash) -> bool,
    ) -> usize {
        let num_hit = num_local + num_external;
        // (Asked even when the hit is misaligned, as vLLM asks: it touches.)
        let aligned = num_hit % self.block_size == 0;
        if aligned && num_hit <= self.max_cache_hit(hashes, num_tokens, cached) {
            num_external
        } else {
            0
        }
    }

    /// The request in `slot` loads its KV from a connector, `num_tokens` of
    /// them in all: its blocks among those stay retained meanwhile.
    pub fn request_loading(&mut self, slot: Slot, hashes: &[BlockHash], num_tokens: usize) {
        let num_blocks = num_tokens / self.block_size;
        let keys = self.block_ends(hashes.len()).take(num_blocks);
        let keys = keys.map(|end| hashes[end - 1]).collect();
        self.loading.insert(slot, keys);
    }

    /// A step scheduled the request in `slot`: whatever it loaded is in.
    pub fn scheduled(&mut self, slot: Slot) {
        self.loading.remove(&slot);
    }

    /// The request in `slot` gives its blocks back (finished or preempted)
    /// having computed `num_computed_tokens`: its computed blocks cached in
    /// the group now are retained (after the others), then the least
    /// recently used retained blocks neither cached nor loading go while
    /// more than `capacity` are held.
    pub fn request_finished(
        &mut self,
        slot: Slot,
        hashes: &[BlockHash],
        num_computed_tokens: usize,
        capacity: usize,
        cached: impl Fn(BlockHash) -> bool,
    ) {
        self.loading.remove(&slot);
        let num_blocks = num_computed_tokens / self.block_size;
        for end in self.block_ends(hashes.len()).take(num_blocks) {
            let key = hashes[end - 1];
            if !self.retained.contains_key(&key) && cached(key) {
                self.insert(key);
            }
        }
        self.release_unheld(capacity, cached);
    }

    /// The prefix cache was reset: the workers start afresh, holding none.
    pub fn reset(&mut self) {
        self.retained.clear();
        self.by_use.clear();
    }

    /// The retained blocks, least recently used first.
    pub fn retained(&self) -> impl Iterator<Item = BlockHash> + '_ {
        self.by_use.values().copied()
    }

    /// Per request loading its KV, the blocks it reads.
    pub fn loading(&self) -> impl Iterator<Item = (Slot, &[BlockHash])> + '_ {
        self.loading
            .iter()
            .map(|(&slot, keys)| (slot, keys.as_slice()))
    }

    /// How many blocks are retained.
    pub fn len(&self) -> usize {
        self.retained.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.retained.is_empty()
    }

    fn release_unheld(&mut self, capacity: usize, cached: impl Fn(BlockHash) -> bool) {
        let excess = self.retained.len().saturating_sub(capacity);
        if excess == 0 {
            return;
        }
        let loading = |key: &BlockHash| self.loading.values().any(|keys| keys.contains(key));
        let victims: Vec<(u64, BlockHash)> = self
            .by_use
            .iter()
            .filter(|(_, key)| !loading(key) && !cached(**key))
            .take(excess)
            .map(|(&stamp, &key)| (stamp, key))
            .collect();
        for (stamp, key) in victims {
            self.by_use.remove(&stamp);
            self.retained.remove(&key);
        }
    }

    /// Where each of the group's blocks ends, in hash blocks, over a
    /// request's `num_hashes` hashes.
    fn block_ends(&self, num_hashes: usize) -> impl Iterator<Item = usize> {
        let step = self.hashes_per_block;
        (step..=num_hashes).step_by(step)
    }

    fn insert(&mut self, key: BlockHash) {
        let stamp = self.stamp();
        self.retained.insert(key, stamp);
        self.by_use.insert(stamp, key);
    }

    fn touch(&mut self, key: BlockHash) {
        let stamp = self.stamp();
        if let Some(old) = self.retained.insert(key, stamp) {
            self.by_use.remove(&old);
        }
        self.by_use.insert(stamp, key);
    }

    fn stamp(&mut self) -> u64 {
        self.next_stamp += 1;
        self.next_stamp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hashes(n: u128) -> Vec<BlockHash> {
        (1..=n).map(BlockHash).collect()
    }

    #[test]
    fn a_hit_reaches_over_retained_or_cached_blocks_from_the_first() {
        let mut r = AuxOutputRetention::new(0, 16, 16);
        let h = hashes(4);
        // Blocks 1 and 2 cached, then a gap: two blocks.
        let cached = |k: BlockHash| k.0 <= 2;
        assert_eq!(r.max_cache_hit(&h, 100, cached), 32);
        // Block 3 retained from a finished request, though evicted since.
        r.request_finished(7, &h, 48, 10, |k| k.0 <= 3);
        assert_eq!(r.len(), 3);
        assert_eq!(r.max_cache_hit(&h, 100, |_| false), 48);
        // Never past the last token.
        assert_eq!(r.max_cache_hit(&h, 40, |_| false), 39);
    }

    #[test]
    fn an_external_hit_counts_only_aligned_and_within_reach() {
        let mut r = AuxOutputRetention::new(0, 16, 16);
        let h = hashes(4);
        let cached = |k: BlockHash| k.0 <= 2;
        assert_eq!(r.cap_external_hit(&h, 100, 16, 16, cached), 16);
        assert_eq!(r.cap_external_hit(&h, 100, 16, 32, cached), 0);
        assert_eq!(r.cap_external_hit(&h, 100, 16, 8, cached), 0);
    }

    #[test]
    fn releases_least_recent_neither_cached_nor_loading() {
        let mut r = AuxOutputRetention::new(0, 16, 16);
        let h = hashes(4);
        r.request_finished(1, &h, 64, 10, |_| true);
        // Block 1 used again: 2 is now the least recent.
        r.max_cache_hit(&h[..1], 100, |_| false);
        r.request_loading(2, &h, 48); // blocks 1–3 read by a load
        let other = [BlockHash(9)];
        r.request_finished(3, &other, 16, 3, |k| k == BlockHash(9));
        // Over by two; 1–3 loading, 9 cached: only 4 can go.
        assert_eq!(r.len(), 4);
        assert!(r.retained.contains_key(&BlockHash(2)));
        assert!(!r.retained.contains_key(&BlockHash(4)));
        r.scheduled(2);
        r.request_finished(4, &other, 16, 3, |_| false);
        // Loading done: the least recent, 2, goes.
        assert_eq!(r.len(), 3);
        assert!(!r.retained.contains_key(&BlockHash(2)));
        assert!(r.retained.contains_key(&BlockHash(3)));
    }

    #[test]
    fn a_group_block_of_several_hash_blocks_is_keyed_where_it_ends() {
        let mut r = AuxOutputRetention::new(1, 32, 16);
        let h = hashes(5);
        assert_eq!(r.max_cache_hit(&h, 100, |k| k.0 == 2 || k.0 == 4), 64);
        r.reset();
        assert!(r.is_empty());
    }
}
