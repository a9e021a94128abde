//! The KV-cache manager (docs/scheduling.md §7.5–7.10): prefix lookups, slot allocation
//! with the admission gate, hash caching at allocation time, and freeing.
//!
//! It owns the block pool; requests own their [`BlockTable`] and
//! [`Sequence`] and lend them to each call. Every argument is checked before
//! anything changes, so an `Err` (bad input) or `Ok(None)` (not enough free
//! blocks) leaves the pool, the map and the table exactly as they were.

use crate::attention_group::{group_key, sparse_mask, AttentionKind, GroupSpec};
use crate::block::{BlockId, NULL_BLOCK};
use crate::block_hash::BlockHasher;
use crate::block_pool::BlockPool;
use crate::block_table::BlockTable;
use crate::cdiv;
use crate::error::Error;
use crate::kv_events::KvEvent;
use crate::limits::{
    check_range, MAX_BLOCK_SIZE, MAX_KV_CACHE_GROUPS, MAX_MODEL_LEN, MAX_NUM_BLOCKS,
};
use crate::prefix_cache_stats::PrefixCacheStats;
use crate::prefix_hit::{find_longest_hit, lookup_groups, LookupGroup, PrefixHit};
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
    /// The KV-cache groups, in vLLM's order (its layers' first appearance),
    /// all of `block_size` (§7.13); one full-attention group for most models.
    pub groups: Vec<GroupSpec>,
    /// Sliding-window groups cache only the blocks a later request can
    /// resume from (vLLM's `prefix_cache_retention_interval = 0`, its
    /// default); false caches them all (`None`).
    pub sparse_retention: bool,
}

/// What an admission's allocation checks besides the step's own blocks.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Admission {
    /// The whole known sequence must fit too (the admission gate, Q13).
    pub full_sequence_must_fit: bool,
    /// Blocks that must stay free beyond what is taken (vLLM's watermark).
    pub watermark: usize,
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
            groups: vec![GroupSpec::FULL],
            sparse_retention: true,
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
        )?;
        check_range("kv_cache_groups", self.groups.len(), 1, MAX_KV_CACHE_GROUPS)?;
        for g in &self.groups {
            match g.kind {
                AttentionKind::Full => {}
                AttentionKind::SlidingWindow { window } => {
                    check_range("sliding_window", window, 1, MAX_MODEL_LEN)?;
                }
                AttentionKind::ChunkedLocal { chunk } => {
                    check_range("attention_chunk_size", chunk, 1, MAX_MODEL_LEN)?;
                }
            }
        }
        if self.groups.len() > 1 && self.num_hash_lookahead_tokens > 0 {
            return Err(Error::invalid(
                "num_hash_lookahead_tokens must be 0 with several KV-cache groups",
            ));
        }
        Ok(())
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
    groups: Vec<GroupSpec>,
    /// The order groups are asked for prefix hits in.
    lookup: Vec<LookupGroup>,
    /// One full-attention group: the common case, on the fast paths.
    single_full: bool,
    sparse_retention: bool,
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
            groups: config.groups.clone(),
            lookup: lookup_groups(&config.groups.iter().map(|g| g.kind).collect::<Vec<_>>()),
            single_full: config.groups.len() == 1 && config.groups[0].kind.is_full(),
            sparse_retention: config.sparse_retention,
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

    /// The KV-cache groups.
    pub fn groups(&self) -> &[GroupSpec] {
        &self.groups
    }

    /// The longest prefix hit valid for every group (docs/scheduling.md
    /// §7.5, §7.13), capped at `num_tokens − 1` tokens so the last token is
    /// always computed (Q12): `hits[g]` gets group `g`'s blocks (null where
    /// a window needs none), `tokens / bs` of them. Changes nothing.
    pub fn find_hit(&self, seq: &Sequence, hits: &mut [Vec<BlockId>]) -> PrefixHit {
        for h in hits.iter_mut() {
            h.clear();
        }
        if !self.enable_caching {
            return PrefixHit::default();
        }
        if self.single_full {
            let tokens = self.get_computed_blocks(seq, &mut hits[0]);
            return PrefixHit {
                tokens,
                shared_prefix_boundary: 0,
            };
        }
        find_longest_hit(
            &self.pool,
            &self.lookup,
            seq.block_hashes(),
            seq.num_tokens().saturating_sub(1),
            self.block_size,
            hits,
        )
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

    /// Blocks group `g` must take to cover `tokens` after its `hits`:
    /// positions not held yet, plus hits that sit in the free queue (taking
    /// them lowers the free count too). `capped`: the admission check,
    /// which counts a window group's blocks only up to its cap.
    fn blocks_needed(
        &self,
        g: usize,
        table: &BlockTable,
        tokens: usize,
        hits: &[BlockId],
        capped: bool,
    ) -> usize {
        let mut required = cdiv(tokens, self.block_size);
        if capped {
            if let Some(cap) = self.groups[g].admission_cap_blocks {
                required = required.min(cap);
            }
        }
        let have = table.len() + hits.len();
        let evictable_hits = hits
            .iter()
            .filter(|&&b| b != NULL_BLOCK && self.pool.block(b).is_some_and(|b| b.ref_cnt == 0))
            .count();
        required.saturating_sub(have) + evictable_hits
    }

    /// Blocks all groups must take (`hits`: one list per group, or none).
    fn blocks_needed_all(
        &self,
        tables: &[BlockTable],
        tokens: usize,
        hits: &[Vec<BlockId>],
        capped: bool,
    ) -> usize {
        (0..tables.len())
            .map(|g| {
                let h = hits.get(g).map_or(&[][..], |h| &h[..]);
                self.blocks_needed(g, &tables[g], tokens, h, capped)
            })
            .sum()
    }

    /// Make room for `num_new_tokens` more tokens of `seq`, after taking the
    /// `new_computed_blocks` prefix hits (covering `num_new_computed_tokens`).
    ///
    /// Returns `Ok(Some(k))` when the table grew by `k` new blocks (its last
    /// `k`), `Ok(None)` when too few blocks are free (nothing changed), and
    /// `Err` for arguments no correct scheduler passes (nothing changed).
    /// With `full_sequence_must_fit`, the whole known sequence must fit too
    /// (the admission gate, Q13). One full-attention group only.
    pub fn allocate_slots(
        &mut self,
        table: &mut BlockTable,
        seq: &Sequence,
        num_new_tokens: usize,
        num_new_computed_tokens: usize,
        new_computed_blocks: &[BlockId],
        full_sequence_must_fit: bool,
    ) -> Result<Option<usize>, Error> {
        if !self.single_full {
            return Err(Error::invalid(
                "allocate_slots: a cache of several KV-cache groups allocates through the scheduler",
            ));
        }
        self.check_allocation(
            table,
            seq,
            num_new_tokens,
            num_new_computed_tokens,
            new_computed_blocks,
        )?;
        let hits = [new_computed_blocks.to_vec()];
        let hits: &[Vec<BlockId>] = if new_computed_blocks.is_empty() {
            &[]
        } else {
            &hits
        };
        Ok(self.allocate(
            std::slice::from_mut(table),
            seq,
            num_new_tokens,
            num_new_computed_tokens,
            hits,
            Admission {
                full_sequence_must_fit,
                watermark: 0,
            },
            0,
        ))
    }

    /// [`Self::allocate_slots`] over every group's table, with arguments the
    /// caller guarantees (the scheduler's own): `Some(k)` new blocks per
    /// group, or `None`. `hits` holds one list per group (or none);
    /// `in_flight` of the computed tokens are still being computed. Before
    /// the step's own check, window groups give back the blocks no position
    /// reads any more (whether or not the allocation succeeds, as vLLM's
    /// does); nothing else changes on `None`.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub(crate) fn allocate(
        &mut self,
        tables: &mut [BlockTable],
        seq: &Sequence,
        num_new_tokens: usize,
        num_new_computed_tokens: usize,
        hits: &[Vec<BlockId>],
        admission: Admission,
        in_flight: usize,
    ) -> Option<usize> {
        let Admission {
            full_sequence_must_fit,
            watermark,
        } = admission;
        if self.single_full && hits.is_empty() && !full_sequence_must_fit && watermark == 0 {
            // Fast path (most decode steps), inlined into the running pass:
            // the table already covers the new tokens, so nothing can be
            // refused or allocated.
            let table = &mut tables[0];
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
                    if upto >= (table.num_cached + 1) * self.block_size {
                        self.cache_blocks(0, table, seq, upto); // a block just filled
                    }
                }
                return Some(0);
            }
        }
        self.allocate_growing(
            tables,
            seq,
            num_new_tokens,
            num_new_computed_tokens,
            hits,
            admission,
            in_flight,
        )
    }

    /// [`Self::allocate`] past its fast path: a table that grows, hits, an
    /// admission gate, several groups.
    #[allow(clippy::too_many_arguments)]
    // Out of line, so that `allocate` (its fast path) is inlined into the
    // running pass: ~50 instructions less per decode (callgrind).
    #[inline(never)]
    fn allocate_growing(
        &mut self,
        tables: &mut [BlockTable],
        seq: &Sequence,
        num_new_tokens: usize,
        num_new_computed_tokens: usize,
        hits: &[Vec<BlockId>],
        admission: Admission,
        in_flight: usize,
    ) -> Option<usize> {
        let Admission {
            full_sequence_must_fit,
            watermark,
        } = admission;
        let computed = seq
            .num_computed_tokens
            .saturating_add(num_new_computed_tokens)
            .min(self.max_model_len);
        if full_sequence_must_fit {
            let full = seq.num_tokens().min(self.max_model_len);
            let need = self.blocks_needed_all(tables, full, hits, true);
            if need + watermark > self.pool.num_free_blocks() {
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
        if !self.single_full {
            // What the step computed for sure (not what is still in flight)
            // is all a window can have left behind.
            let processed = computed.saturating_sub(in_flight);
            for (g, table) in tables.iter_mut().enumerate() {
                self.remove_skipped_blocks(g, table, processed);
            }
        }
        if self.blocks_needed_all(tables, slots, hits, false) + watermark
            > self.pool.num_free_blocks()
        {
            return None;
        }
        // Enough is free: from here on nothing can fail.
        if !hits.is_empty() {
            for (g, table) in tables.iter_mut().enumerate() {
                self.take_hits(g, table, &hits[g], computed);
            }
        }
        let k = cdiv(slots, self.block_size).saturating_sub(tables[0].len());
        debug_assert!(tables.iter().all(|t| t.len() == tables[0].len()));
        for table in tables.iter_mut() {
            self.pool.take_free_blocks(k, &mut table.blocks);
            table.sync_last();
        }
        if self.enable_caching {
            let upto = computed
                .saturating_add(num_new_tokens)
                .min(seq.num_tokens());
            for (g, table) in tables.iter_mut().enumerate() {
                self.cache_blocks(g, table, seq, upto);
            }
        }
        Some(k)
    }

    /// Adopt group `g`'s prefix hits: the blocks a window no longer reads
    /// (before `computed`'s window) stay null, the rest are taken.
    fn take_hits(&mut self, g: usize, table: &mut BlockTable, hits: &[BlockId], computed: usize) {
        let skipped = self.groups[g].kind.num_skipped_tokens(computed) / self.block_size;
        let skipped = skipped.min(hits.len());
        let taken = &hits[skipped..];
        let live: Vec<BlockId> = taken.iter().copied().filter(|&b| b != NULL_BLOCK).collect();
        self.pool.add_refs(&live);
        table.blocks.resize(skipped, NULL_BLOCK);
        table.blocks.extend_from_slice(taken);
        table.num_cached = table.blocks.len();
        table.sync_last();
    }

    /// Give back group `g`'s blocks that no position after `processed`
    /// tokens reads (a window's past), last first, leaving nulls; stops at
    /// the first position already null.
    fn remove_skipped_blocks(&mut self, g: usize, table: &mut BlockTable, processed: usize) {
        let skipped = self.groups[g].kind.num_skipped_tokens(processed) / self.block_size;
        let k = skipped.min(table.len());
        if k == 0 || table.blocks[k - 1] == NULL_BLOCK {
            return; // nothing newly out of the window: most steps
        }
        let mut freed: Vec<BlockId> = Vec::new();
        for i in (0..k).rev() {
            if table.blocks[i] == NULL_BLOCK {
                break;
            }
            freed.push(table.blocks[i]);
            table.blocks[i] = NULL_BLOCK;
        }
        if !freed.is_empty() {
            self.pool.release(freed.into_iter());
            table.sync_last();
        }
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

    /// Hash-cache every group's full blocks up to token `upto`, when prefix
    /// caching is on; the async update caches the blocks its tokens filled.
    pub fn cache_full_blocks(&mut self, tables: &mut [BlockTable], seq: &Sequence, upto: usize) {
        if self.enable_caching {
            for (g, table) in tables.iter_mut().enumerate() {
                self.cache_blocks(g, table, seq, upto);
            }
        }
    }

    /// Tokens the request holds in hash-cached blocks, as vLLM estimates
    /// them: per group, where its last held cached block ends; the least
    /// over the groups.
    #[inline]
    pub fn num_cached_tokens(&self, tables: &[BlockTable]) -> usize {
        if !self.enable_caching {
            return 0;
        }
        if self.single_full {
            return tables[0].num_cached * self.block_size;
        }
        // Nulls are a table's prefix (a window gives back its oldest blocks
        // first), so the search stops at the first: a window group's scan
        // covers its window, not the whole sequence.
        let cached_end = |table: &BlockTable| {
            let held = &table.blocks[..table.num_cached.min(table.len())];
            let live = held.iter().rev().take_while(|&&b| b != NULL_BLOCK);
            live.enumerate()
                .find(|&(_, &b)| self.pool.block(b).is_some_and(|b| b.hash.is_some()))
                .map_or(0, |(back, _)| (held.len() - back) * self.block_size)
        };
        tables.iter().map(cached_end).min().unwrap_or(0)
    }

    /// Hash-cache group `g`'s full blocks up to token `upto`
    /// (docs/scheduling.md §7.7, §7.13): every one, except null positions
    /// and, for a window group under sparse retention, those no later
    /// request could resume from.
    fn cache_blocks(&mut self, g: usize, table: &mut BlockTable, seq: &Sequence, upto: usize) {
        if upto < (table.num_cached + 1) * self.block_size {
            return; // no new full block: the common case, without a division
        }
        let hashes = seq.block_hashes();
        let full = (upto.min(hashes.len() * self.block_size) / self.block_size).min(table.len());
        let start = table.num_cached;
        if start < full {
            let mask = match self.groups[g].kind {
                AttentionKind::SlidingWindow { window } if self.sparse_retention => {
                    Some(sparse_mask(
                        start,
                        full,
                        self.block_size,
                        window,
                        seq.num_prompt_tokens(),
                        seq.shared_prefix_boundary,
                    ))
                }
                _ => None,
            };
            if full - start > 1 {
                let keys = hashes[start..full].iter().map(|&h| group_key(h, g));
                self.pool.read_ahead_map(keys);
            }
            let fresh = table.blocks[start..full].iter().zip(&hashes[start..full]);
            for (i, (&block, &hash)) in (start..).zip(fresh) {
                if block == NULL_BLOCK || mask.as_ref().is_some_and(|keep| !keep(i)) {
                    continue;
                }
                self.pool.cache_block(block, group_key(hash, g));
            }
        }
        table.num_cached = table.num_cached.max(full);
    }

    /// Release every group's table, in group order, each last block first:
    /// unhashed blocks go to the head of the free queue, cached ones to the
    /// tail (docs/scheduling.md §7.9, Q2); null positions hold nothing.
    pub fn free(&mut self, tables: &mut [BlockTable]) {
        for table in tables.iter_mut() {
            self.pool.release(
                table
                    .blocks
                    .iter()
                    .rev()
                    .copied()
                    .filter(|&b| b != NULL_BLOCK),
            );
            table.blocks.clear();
            table.sync_last();
            table.num_cached = 0;
        }
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
#[path = "kv_cache_manager_tests.rs"]
mod tests;
