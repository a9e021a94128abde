//! The block pool (docs/scheduling.md §7.1–7.3, 7.8, 7.9): every block in one `Vec`, the
//! free queue threaded through them, and the prefix-cache map.
//!
//! Invariants (docs/scheduling.md §10): a non-null block is in the free queue exactly when
//! its `ref_cnt` is 0; a block has a hash exactly when the map holds it
//! under that hash; the null block is never queued, hashed or handed out.

use crate::block::{Block, BlockId, NULL_BLOCK};
use crate::block_hash::BlockHash;
use crate::error::Error;
use crate::free_queue::FreeBlockQueue;
use crate::kv_events::{KvEvent, KvEventLog};
use crate::limits::{check_range, MAX_NUM_BLOCKS};
use crate::prefix_cache_map::PrefixCacheMap;
use std::collections::HashMap;

/// All KV-cache blocks and their free queue.
#[derive(Clone, Debug)]
pub struct BlockPool {
    blocks: Vec<Block>,
    free_queue: FreeBlockQueue,
    cached: PrefixCacheMap,
    // Reused by `release` so freeing allocates nothing.
    scratch_head: Vec<BlockId>,
    scratch_tail: Vec<BlockId>,
    /// KV-cache events (evictions and resets here; the manager adds its
    /// stores, its callers their hits), off unless enabled.
    pub(crate) events: KvEventLog,
    /// Keys a cached block carries besides its own, while events are on:
    /// a prompt tail's inside a block keyed to its end (vLLM's secondary
    /// partial keys, §7.16). No lookup asks for them; they are kept so
    /// that each is stored once, and end with the block's own.
    second_keys: HashMap<BlockId, Vec<BlockHash>>,
}

impl BlockPool {
    /// A pool of `num_blocks` blocks, block 0 reserved as the null block.
    pub fn new(num_blocks: usize) -> Result<Self, Error> {
        // One block is the null block alone: a model without a KV cache.
        check_range("num_blocks", num_blocks, 1, MAX_NUM_BLOCKS)?;
        let mut free_queue = FreeBlockQueue::new(num_blocks);
        let null = free_queue.popleft();
        debug_assert_eq!(null, Some(NULL_BLOCK));
        Ok(BlockPool {
            blocks: vec![Block::default(); num_blocks],
            free_queue,
            cached: PrefixCacheMap::with_capacity(num_blocks),
            scratch_head: Vec::new(),
            scratch_tail: Vec::new(),
            events: KvEventLog::default(),
            second_keys: HashMap::new(),
        })
    }

    /// Blocks in the pool, the null block included.
    pub fn num_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Blocks with `ref_cnt == 0` (cached or not), the null block excluded.
    pub fn num_free_blocks(&self) -> usize {
        self.free_queue.len()
    }

    /// Fraction of usable blocks held by requests.
    pub fn usage(&self) -> f64 {
        let usable = self.num_blocks() - 1;
        if usable == 0 {
            return 0.0; // the null block alone: nothing to use
        }
        1.0 - self.num_free_blocks() as f64 / usable as f64
    }

    /// A block's state, or `None` for an id outside the pool.
    pub fn block(&self, id: BlockId) -> Option<&Block> {
        self.blocks.get(id as usize)
    }

    /// The free queue, head (next to reuse) first.
    pub fn free_block_ids(&self) -> impl Iterator<Item = BlockId> + '_ {
        self.free_queue.iter()
    }

    /// The prefix-cache map's (hash, blocks) pairs.
    pub fn cached_blocks(&self) -> impl Iterator<Item = (BlockHash, Vec<BlockId>)> + '_ {
        self.cached.iter()
    }

    /// The earliest cached block under `hash`, if any (evictable ones too).
    pub fn get_cached_block(&self, hash: BlockHash) -> Option<BlockId> {
        self.cached.get(hash)
    }

    /// Take `k` blocks from the head of the free queue, evicting their cached
    /// hashes, with `ref_cnt` 1; appends them to `out`.
    pub fn get_new_blocks(&mut self, k: usize, out: &mut Vec<BlockId>) -> Result<(), Error> {
        if k > self.num_free_blocks() {
            return Err(Error::invalid(format!(
                "cannot get {k} blocks: only {} are free",
                self.num_free_blocks()
            )));
        }
        self.take_free_blocks(k, out);
        Ok(())
    }

    /// [`Self::get_new_blocks`] for a `k` the caller checked against the
    /// free count.
    pub(crate) fn take_free_blocks(&mut self, k: usize, out: &mut Vec<BlockId>) {
        debug_assert!(k <= self.num_free_blocks());
        let start = out.len();
        self.free_queue.popleft_n(k, out);
        if k > 1 {
            // Each cached block taken is a probe of the map to evict it:
            // read the blocks, then their hashes' home slots, in loops whose
            // reads overlap, before the loop that depends on them.
            let taken = &out[start..];
            let blocks = &self.blocks;
            let held = taken
                .iter()
                .fold(0u32, |a, &id| a.wrapping_add(blocks[id as usize].ref_cnt));
            let hashes = taken.iter().filter_map(|&id| blocks[id as usize].hash);
            std::hint::black_box((held, self.cached.read_ahead(hashes)));
        }
        for &id in &out[start..] {
            let block = &mut self.blocks[id as usize];
            block.partial_tokens = 0;
            if let Some(hash) = block.hash.take() {
                // Lazy eviction: a freed cached block stayed findable until now.
                self.cached.remove(hash, id);
                self.events.push(KvEvent::Removed { block_id: id });
                if !self.second_keys.is_empty() {
                    self.second_keys.remove(&id);
                }
            }
            self.events.push(KvEvent::Allocated { block_id: id });
            debug_assert_eq!(block.ref_cnt, 0);
            block.ref_cnt = 1;
        }
    }

    /// Add a reference to each block, taking free ones out of the queue
    /// (prefix-cache hits).
    pub fn touch(&mut self, ids: &[BlockId]) -> Result<(), Error> {
        self.check_ids("touch", ids)?;
        self.add_refs(ids);
        Ok(())
    }

    /// [`Self::touch`] for ids known to be usable blocks (checked hits).
    pub(crate) fn add_refs(&mut self, ids: &[BlockId]) {
        for &id in ids {
            let block = &mut self.blocks[id as usize];
            if block.ref_cnt == 0 {
                self.free_queue.remove(id);
            }
            block.ref_cnt += 1;
            self.events.push(KvEvent::Accessed { block_id: id });
        }
    }

    /// Drop one reference per listed block, in the order given. Blocks that
    /// reach 0 go back to the queue: unhashed ones to the head (reused
    /// first), cached ones to the tail (evicted last), each group in list
    /// order. Callers pass a table last block first (docs/scheduling.md §7.9).
    pub fn free_blocks(&mut self, ids: &[BlockId]) -> Result<(), Error> {
        self.check_ids("free_blocks", ids)?;
        self.check_held(ids)?;
        self.release(ids.iter().copied());
        Ok(())
    }

    /// [`Self::free_blocks`] for ids known to be held (a request's own
    /// table), so no checks.
    pub(crate) fn release(&mut self, ids: impl Iterator<Item = BlockId>) {
        let mut to_head = std::mem::take(&mut self.scratch_head);
        let mut to_tail = std::mem::take(&mut self.scratch_tail);
        for id in ids {
            let block = &mut self.blocks[id as usize];
            block.ref_cnt -= 1;
            if block.ref_cnt == 0 {
                if block.hash.is_some() {
                    to_tail.push(id);
                } else {
                    to_head.push(id);
                }
            }
        }
        self.free_queue.prepend_n(&to_head);
        self.free_queue.append_n(&to_tail);
        to_head.clear();
        to_tail.clear();
        self.scratch_head = to_head;
        self.scratch_tail = to_tail;
    }

    /// Mark a held, unhashed block as the full block `hash` and add it to the
    /// prefix-cache map.
    pub(crate) fn cache_block(&mut self, id: BlockId, hash: BlockHash) {
        let block = &mut self.blocks[id as usize];
        debug_assert!(block.ref_cnt > 0 && block.hash.is_none() && id != NULL_BLOCK);
        block.hash = Some(hash);
        block.partial_tokens = 0;
        self.cached.insert(hash, id);
    }

    /// [`Self::cache_block`] with a partial key: `hash` is the hash at
    /// `tokens` tokens, fewer than the block may hold (§7.16).
    pub(crate) fn cache_partial_block(&mut self, id: BlockId, hash: BlockHash, tokens: usize) {
        self.cache_block(id, hash);
        self.blocks[id as usize].partial_tokens = tokens as u32;
    }

    /// Take each of `ids` out of the prefix cache if it is cached (vLLM's
    /// `evict_blocks`: blocks whose KV failed to load); held or free, the
    /// blocks stay where they are.
    pub(crate) fn uncache(&mut self, ids: &[BlockId]) {
        for &id in ids {
            let block = &mut self.blocks[id as usize];
            block.partial_tokens = 0;
            if let Some(hash) = block.hash.take() {
                self.cached.remove(hash, id);
                self.events.push(KvEvent::Removed { block_id: id });
                if !self.second_keys.is_empty() {
                    self.second_keys.remove(&id);
                }
            }
        }
    }

    /// Give the cached block `id` the key `hash` besides its own; false
    /// (nothing changes) when it has that key already.
    pub(crate) fn add_second_key(&mut self, id: BlockId, hash: BlockHash) -> bool {
        debug_assert!(self.blocks[id as usize].hash.is_some());
        if self.blocks[id as usize].hash == Some(hash) {
            return false;
        }
        let keys = self.second_keys.entry(id).or_default();
        if keys.contains(&hash) {
            return false;
        }
        keys.push(hash);
        true
    }

    /// Read the map's slots for `hashes`, about to be cached, so that the
    /// inserts that follow find them in cache (their misses overlap here).
    pub(crate) fn read_ahead_map(&self, hashes: impl Iterator<Item = BlockHash>) {
        std::hint::black_box(self.cached.read_ahead(hashes));
    }

    /// Forget every cached hash. Refused (returns false, changes nothing)
    /// while any block is held.
    pub fn reset_prefix_cache(&mut self) -> bool {
        if self.num_free_blocks() != self.num_blocks() - 1 {
            return false;
        }
        self.cached.clear();
        self.second_keys.clear();
        for block in &mut self.blocks {
            block.hash = None;
            block.partial_tokens = 0;
        }
        self.events.push(KvEvent::Cleared);
        true
    }

    fn check_ids(&self, what: &str, ids: &[BlockId]) -> Result<(), Error> {
        for (i, &id) in ids.iter().enumerate() {
            if id == NULL_BLOCK || id as usize >= self.blocks.len() {
                return Err(Error::invalid(format!(
                    "{what}: block_ids[{i}] = {id} is not a usable block id (1..{})",
                    self.blocks.len() - 1
                )));
            }
        }
        Ok(())
    }

    /// Every listed block must hold at least as many references as it is
    /// listed, so a free cannot underflow a count.
    fn check_held(&self, ids: &[BlockId]) -> Result<(), Error> {
        if let [id] = ids {
            if self.blocks[*id as usize].ref_cnt == 0 {
                return Err(Error::invalid(format!(
                    "free_blocks: block_ids[0] = {id} is not held (ref_cnt 0)"
                )));
            }
            return Ok(());
        }
        let mut seen: rustc_hash::FxHashMap<BlockId, u32> = Default::default();
        for (i, &id) in ids.iter().enumerate() {
            let n = seen.entry(id).or_insert(0);
            *n += 1;
            if *n > self.blocks[id as usize].ref_cnt {
                return Err(Error::invalid(format!(
                    "free_blocks: block_ids[{i}] = {id} is not held (ref_cnt {})",
                    self.blocks[id as usize].ref_cnt
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue(p: &BlockPool) -> Vec<u32> {
        p.free_block_ids().collect()
    }

    #[test]
    fn null_block_is_reserved() {
        let mut p = BlockPool::new(4).unwrap();
        assert_eq!(queue(&p), vec![1, 2, 3]);
        let mut out = vec![];
        p.get_new_blocks(3, &mut out).unwrap();
        assert_eq!(out, vec![1, 2, 3]);
        assert!(p.get_new_blocks(1, &mut out).is_err());
        assert!(p.free_blocks(&[0]).is_err());
        assert!(p.touch(&[0]).is_err());
        assert!(p.touch(&[4]).is_err());
        assert!(BlockPool::new(0).is_err());
        // The null block alone (a model without a KV cache): nothing to use.
        let p = BlockPool::new(1).unwrap();
        assert_eq!((p.num_free_blocks(), p.usage()), (0, 0.0));
    }

    #[test]
    fn a_second_key_is_added_once_and_ends_with_the_block() {
        let mut p = BlockPool::new(3).unwrap();
        p.events.enable();
        let mut t = vec![];
        p.get_new_blocks(2, &mut t).unwrap();
        p.cache_block(1, BlockHash(10));
        assert!(
            !p.add_second_key(1, BlockHash(10)),
            "its own key is no second one"
        );
        assert!(p.add_second_key(1, BlockHash(11)));
        assert!(!p.add_second_key(1, BlockHash(11)), "stored once");
        // Re-keyed: both keys go with one event, and a later second key
        // counts as new.
        p.uncache(&[1]);
        assert_eq!(p.events.take(), vec![KvEvent::Removed { block_id: 1 }]);
        p.cache_block(1, BlockHash(12));
        assert!(p.add_second_key(1, BlockHash(11)));
        // Evicted when handed out again: its keys go with it.
        p.free_blocks(&[1, 2]).unwrap();
        let mut u = vec![];
        p.get_new_blocks(2, &mut u).unwrap();
        assert!(p.second_keys.is_empty());
        p.cache_block(u[0], BlockHash(12));
        assert!(p.add_second_key(u[0], BlockHash(11)));
        p.free_blocks(&u).unwrap();
        assert!(p.reset_prefix_cache());
        assert!(p.second_keys.is_empty());
    }

    #[test]
    fn free_places_unhashed_at_head_and_cached_at_tail() {
        let mut p = BlockPool::new(6).unwrap();
        let mut t = vec![];
        p.get_new_blocks(3, &mut t).unwrap();
        p.cache_block(1, BlockHash(10));
        p.cache_block(2, BlockHash(11));
        // released last block first: 3 (unhashed), 2, 1 (cached)
        p.free_blocks(&[3, 2, 1]).unwrap();
        assert_eq!(queue(&p), vec![3, 4, 5, 2, 1]);
        assert_eq!(p.get_cached_block(BlockHash(11)), Some(2));
        // Reusing 3, 4, 5 then 2 evicts 2's hash only when 2 is handed out.
        let mut out = vec![];
        p.get_new_blocks(3, &mut out).unwrap();
        assert_eq!(p.get_cached_block(BlockHash(11)), Some(2));
        p.get_new_blocks(1, &mut out).unwrap();
        assert_eq!(p.get_cached_block(BlockHash(11)), None);
        assert_eq!(p.block(2).unwrap().hash, None);
    }

    #[test]
    fn rejected_free_changes_nothing() {
        let mut p = BlockPool::new(4).unwrap();
        let mut t = vec![];
        p.get_new_blocks(1, &mut t).unwrap();
        let before = queue(&p);
        assert!(p.free_blocks(&[1, 1]).is_err());
        assert!(p.free_blocks(&[2]).is_err());
        assert_eq!(queue(&p), before);
        assert_eq!(p.block(1).unwrap().ref_cnt, 1);
    }

    #[test]
    fn reset_refused_while_held() {
        let mut p = BlockPool::new(4).unwrap();
        let mut t = vec![];
        p.get_new_blocks(1, &mut t).unwrap();
        p.cache_block(1, BlockHash(1));
        assert!(!p.reset_prefix_cache());
        assert_eq!(p.get_cached_block(BlockHash(1)), Some(1));
        p.free_blocks(&[1]).unwrap();
        assert!(p.reset_prefix_cache());
        assert_eq!(p.get_cached_block(BlockHash(1)), None);
        assert_eq!(p.block(1).unwrap().hash, None);
    }
}
