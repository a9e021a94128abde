//! The KV-cache manager (docs/scheduling.md §7.5–7.10): prefix lookups, slot allocation
//! with the admission gate, hash caching at allocation time, and freeing.
//!
//! It owns the block pool; requests own their [`BlockTable`] and
//! [`Sequence`] and lend them to each call. Every argument is checked before
//! anything changes, so an `Err` (bad input) or `Ok(None)` (not enough free
//! blocks) leaves the pool, the map and the table exactly as they were.

use crate::block::{BlockId, NULL_BLOCK};
use crate::block_hash::BlockHasher;
use crate::block_pool::BlockPool;
use crate::block_table::BlockTable;
use crate::cdiv;
use crate::error::Error;
use crate::kv_events::KvEvent;
use crate::limits::{check_range, MAX_BLOCK_SIZE, MAX_MODEL_LEN, MAX_NUM_BLOCKS};
use crate::prefix_cache_stats::PrefixCacheStats;
use crate::sequence::Sequence;

/// The KV-cache settings the manager needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvCacheConfig {
    /// Blocks in the pool, the reserved null block included.
    pub num_blocks: usize,
    /// Tokens per block.
    pub block_size: usize,
    /// Longest sequence; allocation never covers positions past it.
    pub max_model_len: usize,
    /// Prefix-cache lookups and hash caching.
    pub enable_prefix_caching: bool,
    /// KV slots reserved past a request's scheduled tokens, for a drafter
    /// with its own forward pass (vLLM's `num_lookahead_tokens`: EAGLE,
    /// MTP and draft models write their drafts' KV there); 0 otherwise.
    pub num_lookahead_tokens: usize,
    /// Tokens after each block that its hash covers (vLLM's
    /// `num_hash_lookahead_tokens`, §7.4); 0 otherwise.
    pub num_hash_lookahead_tokens: usize,
}

impl KvCacheConfig {
    /// A cache without speculative-decoding lookahead.
    pub fn new(
        num_blocks: usize,
        block_size: usize,
        max_model_len: usize,
        enable_prefix_caching: bool,
    ) -> Self {
        KvCacheConfig {
            num_blocks,
            block_size,
            max_model_len,
            enable_prefix_caching,
            num_lookahead_tokens: 0,
            num_hash_lookahead_tokens: 0,
        }
    }

    /// Check every field, naming the first bad one.
    pub fn validate(&self) -> Result<(), Error> {
        check_range("block_size", self.block_size, 1, MAX_BLOCK_SIZE)?;
        check_range("max_model_len", self.max_model_len, 1, MAX_MODEL_LEN)?;
        check_range("num_blocks", self.num_blocks, 2, MAX_NUM_BLOCKS)?;
        check_range(
            "num_lookahead_tokens",
            self.num_lookahead_tokens,
            0,
            self.max_model_len,
        )?;
        // A block's hash covers at most the next block (vLLM requires the
        // block size to hold the prefill lookahead it equals).
        check_range(
            "num_hash_lookahead_tokens",
            self.num_hash_lookahead_tokens,
            0,
            self.block_size,
        )
    }
}

/// The paged KV cache's bookkeeping.
#[derive(Clone, Debug)]
pub struct KvCacheManager {
    pool: BlockPool,
    block_size: usize,
    max_model_len: usize,
    enable_caching: bool,
    /// KV slots reserved past each allocation's tokens.
    lookahead: usize,
    hasher: BlockHasher,
    stats: PrefixCacheStats,
}

impl KvCacheManager {
    /// A manager over a fresh pool, hashing under a random secret key.
    pub fn new(config: &KvCacheConfig) -> Result<Self, Error> {
        Self::with_hasher(config, BlockHasher::new_random()?)
    }

    /// A manager hashing with `hasher`'s key (fixed keys make tests
    /// reproducible) and the config's hash lookahead.
    pub fn with_hasher(config: &KvCacheConfig, hasher: BlockHasher) -> Result<Self, Error> {
        config.validate()?;
        Ok(KvCacheManager {
            pool: BlockPool::new(config.num_blocks)?,
            block_size: config.block_size,
            max_model_len: config.max_model_len,
            enable_caching: config.enable_prefix_caching,
            lookahead: config.num_lookahead_tokens,
            hasher: hasher.with_lookahead(config.num_hash_lookahead_tokens),
            stats: PrefixCacheStats::default(),
        })
    }

    /// The hasher every request of this cache must use for its chain.
    pub fn hasher(&self) -> &BlockHasher {
        &self.hasher
    }

    /// The block pool, for inspection.
    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// The KV-cache slot of position `pos` in a request's `table`:
    /// `table[pos / bs] * bs + pos % bs` (shifts when `bs` is a power of 2).
    #[inline]
    pub fn slot_of(&self, table: &BlockTable, pos: usize) -> i64 {
        let bs = self.block_size;
        let (block, offset) = if bs.is_power_of_two() {
            (pos >> bs.trailing_zeros(), pos & (bs - 1))
        } else {
            (pos / bs, pos % bs)
        };
        let id = if block + 1 == table.len() {
            table.last
        } else {
            table.blocks[block]
        };
        id as i64 * bs as i64 + offset as i64
    }

    /// Longest sequence.
    pub fn max_model_len(&self) -> usize {
        self.max_model_len
    }

    /// Whether prefix caching is on.
    pub fn enable_prefix_caching(&self) -> bool {
        self.enable_caching
    }

    /// Free blocks (cached-but-unreferenced ones included).
    pub fn num_free_blocks(&self) -> usize {
        self.pool.num_free_blocks()
    }

    /// Fraction of usable blocks held by requests.
    pub fn usage(&self) -> f64 {
        self.pool.usage()
    }

    /// The longest cached prefix of `seq` in whole blocks, capped at
    /// `num_tokens − 1` tokens so the last token is always computed (Q12).
    /// Appends the hit blocks to `out` and returns the hit token count.
    /// Changes nothing.
    pub fn get_computed_blocks(&self, seq: &Sequence, out: &mut Vec<BlockId>) -> usize {
        if !self.enable_caching {
            return 0;
        }
        let max_hit_blocks = seq.num_tokens().saturating_sub(1) / self.block_size;
        let start = out.len();
        for &hash in seq.block_hashes().iter().take(max_hit_blocks) {
            match self.pool.get_cached_block(hash) {
                Some(b) => out.push(b),
                // Chained hashes: once one block misses, every later one does.
                None => break,
            }
        }
        (out.len() - start) * self.block_size
    }

    fn blocks_needed(&self, table: &BlockTable, tokens: usize, hits: &[BlockId]) -> usize {
        let required = cdiv(tokens, self.block_size);
        let have = table.len() + hits.len();
        let evictable_hits = hits
            .iter()
            .filter(|&&b| self.pool.block(b).is_some_and(|b| b.ref_cnt == 0))
            .count();
        required.saturating_sub(have) + evictable_hits
    }

    /// Make room for `num_new_tokens` more tokens of `seq`, after taking the
    /// `new_computed_blocks` prefix hits (covering `num_new_computed_tokens`).
    ///
    /// Returns `Ok(Some(k))` when the table grew by `k` new blocks (its last
    /// `k`), `Ok(None)` when too few blocks are free (nothing changed), and
    /// `Err` for arguments no correct scheduler passes (nothing changed).
    /// With `full_sequence_must_fit`, the whole known sequence must fit too
    /// (the admission gate, Q13).
    pub fn allocate_slots(
        &mut self,
        table: &mut BlockTable,
        seq: &Sequence,
        num_new_tokens: usize,
        num_new_computed_tokens: usize,
        new_computed_blocks: &[BlockId],
        full_sequence_must_fit: bool,
    ) -> Result<Option<usize>, Error> {
        self.check_allocation(
            table,
            seq,
            num_new_tokens,
            num_new_computed_tokens,
            new_computed_blocks,
        )?;
        Ok(self.allocate(
            table,
            seq,
            num_new_tokens,
            num_new_computed_tokens,
            new_computed_blocks,
            full_sequence_must_fit,
            0,
        ))
    }

    /// [`Self::allocate_slots`] with arguments the caller guarantees (the
    /// scheduler's own): `Some(k)` new blocks, or `None` with nothing changed.
    /// `watermark` blocks must stay free beyond what is taken (vLLM's
    /// watermark, for admissions while others run).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn allocate(
        &mut self,
        table: &mut BlockTable,
        seq: &Sequence,
        num_new_tokens: usize,
        num_new_computed_tokens: usize,
        hits: &[BlockId],
        full_sequence_must_fit: bool,
        watermark: usize,
    ) -> Option<usize> {
        if hits.is_empty() && !full_sequence_must_fit && watermark == 0 {
            // Fast path (most decode steps): the table already covers the
            // new tokens, so nothing can be refused or allocated.
            let computed = seq.num_computed_tokens.min(self.max_model_len);
            let slots = computed
                .saturating_add(num_new_tokens)
                .saturating_add(self.lookahead)
                .min(self.max_model_len);
            if slots <= table.len() * self.block_size {
                if self.enable_caching {
                    let upto = computed
                        .saturating_add(num_new_tokens)
                        .min(seq.num_tokens());
                    self.cache_blocks(table, seq, upto);
                }
                return Some(0);
            }
        }
        let computed = seq
            .num_computed_tokens
            .saturating_add(num_new_computed_tokens)
            .min(self.max_model_len);
        let free = self.pool.num_free_blocks();
        if full_sequence_must_fit {
            let full = seq.num_tokens().min(self.max_model_len);
            if self.blocks_needed(table, full, hits) + watermark > free {
                return None;
            }
        }
        // Saturating: a caller's count may be anything up to usize::MAX.
        // The lookahead slots come on top; the admission gate above ignores
        // them, as vLLM's does.
        let slots = computed
            .saturating_add(num_new_tokens)
            .saturating_add(self.lookahead)
            .min(self.max_model_len);
        if self.blocks_needed(table, slots, hits) + watermark > free {
            return None;
        }
        // Enough is free: from here on nothing can fail.
        if !hits.is_empty() {
            self.pool.add_refs(hits);
            table.blocks.extend_from_slice(hits);
            table.num_cached = hits.len();
        }
        let k = cdiv(slots, self.block_size).saturating_sub(table.len());
        self.pool.take_free_blocks(k, &mut table.blocks);
        table.sync_last();
        if self.enable_caching {
            self.cache_blocks(
                table,
                seq,
                computed
                    .saturating_add(num_new_tokens)
                    .min(seq.num_tokens()),
            );
        }
        Some(k)
    }

    fn check_allocation(
        &self,
        table: &BlockTable,
        seq: &Sequence,
        num_new_tokens: usize,
        num_new_computed_tokens: usize,
        hits: &[BlockId],
    ) -> Result<(), Error> {
        if num_new_tokens == 0 && num_new_computed_tokens == 0 {
            return Err(Error::invalid(
                "allocate_slots: num_new_tokens and num_new_computed_tokens are both 0",
            ));
        }
        if num_new_computed_tokens != hits.len() * self.block_size {
            return Err(Error::invalid(format!(
                "allocate_slots: num_new_computed_tokens = {num_new_computed_tokens} must be \
                 len(new_computed_blocks) * block_size = {}",
                hits.len() * self.block_size
            )));
        }
        if hits.is_empty() {
            return Ok(());
        }
        if !table.is_empty() || seq.num_computed_tokens != 0 {
            return Err(Error::invalid(
                "allocate_slots: new_computed_blocks are only taken by a request with an empty \
                 table and no computed tokens",
            ));
        }
        if hits.len() * self.block_size >= seq.num_tokens() {
            return Err(Error::invalid(format!(
                "allocate_slots: {num_new_computed_tokens} hit tokens leave none of the request's \
                 {} tokens to compute",
                seq.num_tokens()
            )));
        }
        // A hit must be the cached block of the same position, so it holds
        // exactly this request's tokens (chained hashes imply the prefix). A
        // hit past the request's last full block has no hash to match.
        for (k, &b) in hits.iter().enumerate() {
            let hash = seq.block_hashes().get(k);
            let held = (b != NULL_BLOCK)
                .then(|| self.pool.block(b))
                .flatten()
                .is_some_and(|block| hash.is_some() && block.hash.as_ref() == hash);
            if !held {
                return Err(Error::invalid(format!(
                    "allocate_slots: new_computed_blocks[{k}] = {b} is not a cached copy of the \
                     request's block {k}"
                )));
            }
        }
        Ok(())
    }

    /// Hash-cache the table's full blocks up to token `upto`, when prefix
    /// caching is on; the async update caches the blocks its tokens filled.
    pub fn cache_full_blocks(&mut self, table: &mut BlockTable, seq: &Sequence, upto: usize) {
        if self.enable_caching {
            self.cache_blocks(table, seq, upto);
        }
    }

    /// Tokens held in the table's hash-cached blocks.
    pub fn num_cached_tokens(&self, table: &BlockTable) -> usize {
        if self.enable_caching {
            table.num_cached * self.block_size
        } else {
            0
        }
    }

    /// Hash-cache the table's full blocks up to token `upto` (docs/scheduling.md §7.7).
    fn cache_blocks(&mut self, table: &mut BlockTable, seq: &Sequence, upto: usize) {
        if upto < (table.num_cached + 1) * self.block_size {
            return; // no new full block: the common case, without a division
        }
        let hashes = seq.block_hashes();
        let full = (upto.min(hashes.len() * self.block_size) / self.block_size).min(table.len());
        if table.num_cached < full {
            let start = table.num_cached;
            for (&block, &hash) in table.blocks[start..full].iter().zip(&hashes[start..full]) {
                self.pool.cache_block(block, hash);
            }
        }
        table.num_cached = table.num_cached.max(full);
    }

    /// Release a table, last block first: unhashed blocks go to the head of
    /// the free queue, cached ones to the tail (docs/scheduling.md §7.9, Q2).
    pub fn free(&mut self, table: &mut BlockTable) {
        self.pool.release(table.blocks.iter().rev().copied());
        table.blocks.clear();
        table.sync_last();
        table.num_cached = 0;
    }

    /// Count one admission (docs/scheduling.md §7.10); only with prefix caching on.
    pub fn record_prefix_cache_stats(
        &mut self,
        num_tokens: usize,
        num_hit_tokens: usize,
        preempted: bool,
    ) {
        if self.enable_caching {
            self.stats.record(num_tokens, num_hit_tokens, preempted);
        }
    }

    /// Take the counters, leaving zeros.
    pub fn make_prefix_cache_stats(&mut self) -> PrefixCacheStats {
        std::mem::take(&mut self.stats)
    }

    /// Log KV-cache events from now on (docs/scheduling.md §7.12).
    pub fn enable_events(&mut self) {
        self.pool.events.enable();
    }

    /// Log blocks' lives (residency metrics) from now on.
    pub fn enable_lifecycle_events(&mut self) {
        self.pool.events.enable_lifecycle();
    }

    /// Whether KV-cache events (routers') are logged.
    pub fn events_enabled(&self) -> bool {
        self.pool.events.enabled()
    }

    /// Log an event the caller knows of (stores and hits: only the caller
    /// knows whose table it is).
    pub fn log_event(&mut self, event: KvEvent) {
        self.pool.events.push(event);
    }

    /// The events since last taken, oldest first.
    pub fn take_events(&mut self) -> Vec<KvEvent> {
        self.pool.events.take()
    }

    /// Forget every cached hash if no block is held; returns whether it did.
    pub fn reset_prefix_cache(&mut self) -> bool {
        let done = self.pool.reset_prefix_cache();
        if done {
            self.stats.reset = true;
        }
        done
    }
}

#[cfg(test)]
mod tests {
    //! KV-cache scenarios of docs/scheduling.md §9.1 (vLLM 0.33.0's own
    //! values) at the core's level; tests/test_kv_scenarios.py runs them on
    //! both backends through the Python API.
    use super::*;

    const BS: usize = 16;

    fn manager(num_blocks: usize) -> KvCacheManager {
        KvCacheManager::new(&KvCacheConfig::new(num_blocks, BS, 4096, true)).unwrap()
    }

    /// A request admitted the way the scheduler admits one: prefix lookup,
    /// then every remaining token allocated after the hits.
    struct Admitted {
        seq: Sequence,
        table: BlockTable,
        hits: Vec<BlockId>,
        hit_tokens: usize,
    }

    fn admit(kv: &mut KvCacheManager, tokens: Vec<u32>) -> Admitted {
        let seq = Sequence::new(tokens, None, kv.hasher(), BS);
        let mut hits = vec![];
        let hit_tokens = kv.get_computed_blocks(&seq, &mut hits);
        let mut table = BlockTable::default();
        let n = seq.num_tokens() - hit_tokens;
        kv.allocate_slots(&mut table, &seq, n, hit_tokens, &hits, false)
            .unwrap()
            .expect("room");
        Admitted {
            seq,
            table,
            hits,
            hit_tokens,
        }
    }

    fn free_queue(kv: &KvCacheManager) -> Vec<BlockId> {
        kv.pool().free_block_ids().collect()
    }

    fn common(extra: &[u32]) -> Vec<u32> {
        (1000..1048).chain(extra.iter().copied()).collect()
    }

    #[test]
    fn k1_prefix_hits_and_the_free_order() {
        let mut kv = manager(11);
        let mut r0 = admit(&mut kv, common(&[3; 7]));
        assert_eq!(r0.table.block_ids(), [1, 2, 3, 4]);
        assert_eq!(r0.table.num_cached_blocks(), 3); // block 4 is partial
        let mut r1 = admit(&mut kv, common(&[3; 5]));
        assert_eq!((r1.hits.as_slice(), r1.hit_tokens), (&[1, 2, 3][..], 48));
        assert_eq!(r1.table.block_ids(), [1, 2, 3, 5]);
        kv.free(&mut r0.table);
        assert_eq!(free_queue(&kv), [4, 6, 7, 8, 9, 10]);
        // Unhashed blocks to the head, cached ones to the tail, last first (Q2).
        kv.free(&mut r1.table);
        assert_eq!(free_queue(&kv), [5, 4, 6, 7, 8, 9, 10, 3, 2, 1]);
        let r2 = admit(&mut kv, common(&[3; 6]));
        assert_eq!(
            (r2.hit_tokens, r2.table.block_ids()),
            (48, &[1, 2, 3, 5][..])
        );
    }

    #[test]
    fn k4_the_last_token_is_always_computed() {
        // A hit covers at most num_tokens - 1 tokens (Q12); the recomputed
        // block's copy joins the map and lookups answer the earliest (Q14).
        let mut kv = manager(11);
        let mut x = admit(&mut kv, common(&[]));
        kv.free(&mut x.table);
        let y = admit(&mut kv, common(&[]));
        assert_eq!((y.hit_tokens, y.table.block_ids()), (32, &[1, 2, 4][..]));
        let last = y.seq.block_hashes()[2];
        let cached: Vec<_> = kv
            .pool()
            .cached_blocks()
            .filter(|(h, _)| *h == last)
            .map(|(_, ids)| ids.to_vec())
            .collect();
        assert_eq!(cached, vec![vec![3, 4]]);
    }

    #[test]
    fn k6_a_refused_allocation_changes_nothing() {
        let mut kv = manager(6);
        let mut a = admit(&mut kv, common(&[1]));
        kv.free(&mut a.table);
        let _big = admit(&mut kv, (2000..2016).collect());
        assert_eq!(kv.num_free_blocks(), 4);
        let seq = Sequence::new(
            common(&(3000..3040).collect::<Vec<_>>()),
            None,
            kv.hasher(),
            BS,
        );
        let mut hits = vec![];
        assert_eq!(kv.get_computed_blocks(&seq, &mut hits), 48);
        let before = free_queue(&kv);
        let mut table = BlockTable::default();
        // 3 new + 3 evictable hits = 6 > 4 free.
        for gate in [true, false] {
            let got = kv.allocate_slots(&mut table, &seq, 40, 48, &hits, gate);
            assert_eq!(got, Ok(None));
        }
        assert_eq!(free_queue(&kv), before);
        assert!(table.is_empty());
    }

    #[test]
    fn hits_must_be_the_requests_own_cached_blocks() {
        let mut kv = manager(11);
        let _a = admit(&mut kv, common(&[1]));
        let seq = Sequence::new((0..40).collect(), None, kv.hasher(), BS);
        let mut table = BlockTable::default();
        // Cached blocks, but of another prompt: refused, nothing changes.
        let got = kv.allocate_slots(&mut table, &seq, 8, 32, &[1, 2], false);
        assert!(matches!(got, Err(Error::InvalidArgument(_))));
        // More hits than the request has full blocks.
        let short = Sequence::new(common(&[]), None, kv.hasher(), BS);
        let got = kv.allocate_slots(&mut table, &short, 1, 48, &[1, 2, 3], false);
        assert!(got.is_err());
        assert!(table.is_empty());
        assert_eq!(kv.num_free_blocks(), 6);
    }
}
