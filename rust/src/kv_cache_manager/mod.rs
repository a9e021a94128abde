//! The KV-cache manager (docs/scheduling.md §7.5–7.10): prefix lookups, slot allocation
//! with the admission gate, hash caching at allocation time, and freeing.
//!
//! It owns the block pool; requests own their [`BlockTable`] and
//! [`Sequence`] and lend them to each call. Every argument is checked before
//! anything changes, so an `Err` (bad input) or `Ok(None)` (not enough free
//! blocks) leaves the pool, the map and the table exactly as they were.
//!
//! Here: the manager, its lookups, freeing, stats and events; `config` holds
//! its settings, `allocation` the allocation path, `caching` the hash caching.

mod allocation;
mod boundary_states;
mod caching;
mod config;
mod prefill_checkpoints;

#[cfg(test)]
mod tests;

pub use allocation::Admission;
pub use boundary_states::BoundaryState;
pub use config::KvCacheConfig;
use prefill_checkpoints::{StateCheckpoint, StateCheckpoints};

use crate::attention_group::{group_key, AttentionKind, GroupSpec};
use crate::block::{BlockId, NULL_BLOCK};
use crate::block_hash::{BlockHash, BlockHasher};
use crate::block_pool::BlockPool;
use crate::block_table::BlockTable;
use crate::error::Error;
use crate::kv_events::KvEvent;
use crate::prefix_cache_stats::PrefixCacheStats;
use crate::prefix_hit::{
    find_hit_per_group, find_longest_hit, lookup_groups, GroupHits, HitQuery, LookupGroup,
    PrefixHit,
};
use crate::sequence::Sequence;
use std::sync::Arc;

/// The paged KV cache's bookkeeping.
#[derive(Clone, Debug)]
pub struct KvCacheManager {
    pool: BlockPool,
    /// Tokens per block hash (the groups' blocks' greatest common divisor;
    /// their one block size when alike).
    hash_block_size: usize,
    /// The unit hits and hash caching are aligned to (the groups' blocks'
    /// least common multiple).
    scheduler_block_size: usize,
    /// Tokens per block of each group.
    /// (Shared with each step's output, which maps slots by them: a step
    /// takes a reference, not a copy.)
    group_block_sizes: Arc<[usize]>,
    max_model_len: usize,
    enable_caching: bool,
    /// KV slots reserved past each allocation's tokens.
    lookahead: usize,
    groups: Vec<GroupSpec>,
    /// The order groups are asked for prefix hits in.
    lookup: Vec<LookupGroup>,
    /// One full-attention group: the common case, on the fast paths.
    single_full: bool,
    drop_eagle_block: bool,
    /// Per group, whether its hits give up an EAGLE block (its kind's
    /// lookup group's flag: vLLM gives every manager of a spec group the
    /// bit); a window caches the blocks such a hit reads (§7.13).
    drops_eagle: Vec<bool>,
    sparse_retention: bool,
    retention_interval: usize,
    /// Computed tokens at a sequence's end that are not hash cached: a
    /// multi-module drafter may prefill them again (§4.13).
    reprefillable: usize,
    hasher: BlockHasher,
    stats: PrefixCacheStats,
    /// Attention groups' blocks handed out since the last step's output, group
    /// by group, when a recurrent group shares the pool or the KV has mixed
    /// precisions: the runner zeroes them before use (a Mamba state reads
    /// its block before writing it all; a block's stale bytes read at
    /// another precision can decode to NaN; vLLM's `new_block_ids_to_zero`).
    /// `None` otherwise.
    blocks_to_zero: Option<Vec<Vec<BlockId>>>,
    /// Recurrent groups cache their states (vLLM's cache mode "align"):
    /// prefix caching on beside a recurrent group.
    align: bool,
    /// The recurrent groups' keys cached this step: a state is written by
    /// the step's forward pass, so no request may hit it before the next
    /// step (vLLM's `cached_blocks_this_step`).
    states_cached_this_step: Vec<BlockHash>,
    /// Cached recurrent states offered to a KV connector (§4.19.2).
    boundary_states: boundary_states::BoundaryStates,
    /// The prefill checkpoint the allocation in progress writes, if any
    /// (§7.15): its caching keys the checkpoint's block.
    step_checkpoint: Option<StateCheckpoint>,
    /// Each request's latest planned checkpoint, which its caching keys
    /// until its next allocation (an output's caching between steps).
    state_checkpoints: StateCheckpoints,
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
        let lookup = lookup_groups(
            &config.groups.iter().map(|g| g.kind).collect::<Vec<_>>(),
            &config.group_block_sizes(),
            &eagle_groups(config),
        );
        let mut drops_eagle = vec![false; config.groups.len()];
        for l in lookup.iter().filter(|l| l.drops_eagle_block) {
            for &g in &l.group_ids {
                drops_eagle[g] = true;
            }
        }
        Ok(KvCacheManager {
            pool: BlockPool::new(config.num_blocks)?,
            hash_block_size: config.hash_block_size(),
            scheduler_block_size: config.scheduler_block_size(),
            group_block_sizes: config.group_block_sizes().into(),
            max_model_len: config.max_model_len,
            enable_caching: config.enable_prefix_caching,
            lookahead: config.num_lookahead_tokens,
            groups: config.groups.clone(),
            lookup,
            drops_eagle,
            single_full: config.groups.len() == 1 && config.groups[0].kind.is_full(),
            drop_eagle_block: config.drop_eagle_block,
            sparse_retention: config.sparse_retention,
            retention_interval: config.retention_interval,
            reprefillable: 0,
            hasher: hasher.with_lookahead(config.num_hash_lookahead_tokens),
            stats: PrefixCacheStats::default(),
            blocks_to_zero: (config.mixed_precision
                || config.groups.iter().any(|g| g.kind.is_recurrent()))
            .then(|| vec![Vec::new(); config.groups.len()]),
            align: config.enable_prefix_caching
                && config.groups.iter().any(|g| g.kind.is_recurrent()),
            states_cached_this_step: Vec::new(),
            boundary_states: Default::default(),
            step_checkpoint: None,
            state_checkpoints: StateCheckpoints::default(),
        })
    }

    /// The same manager, minding the last `tokens` computed tokens of each
    /// sequence (multi-module MTP's re-prefilled tokens: its drafter's
    /// read-ahead less one, §4.13): one group leaves them out of the hash
    /// cache, a window keeps their blocks (§7.7, §7.13).
    pub fn with_reprefillable_tokens(mut self, tokens: usize) -> Self {
        self.reprefillable = tokens;
        self
    }

    /// The hasher every request of this cache must use for its chain.
    pub fn hasher(&self) -> &BlockHasher {
        &self.hasher
    }

    /// The block pool, for inspection.
    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    /// Whether a block ending at `hash` is cached in group `group` now.
    pub fn is_cached_in(&self, hash: BlockHash, group: usize) -> bool {
        self.pool.get_cached_block(group_key(hash, group)).is_some()
    }

    /// Tokens per block hash: what a request's hash chain is cut at
    /// (vLLM's `hash_block_size`; the block size when the groups' are
    /// alike).
    pub fn hash_block_size(&self) -> usize {
        self.hash_block_size
    }

    /// The unit prefix hits and hash caching are aligned to (vLLM's
    /// `scheduler_block_size`; the block size when the groups' are alike).
    pub fn scheduler_block_size(&self) -> usize {
        self.scheduler_block_size
    }

    /// The groups whose blocks hold no per-token slots (cross-attention's
    /// follow the encoder, a recurrent group's hold states), as a mask (bit
    /// `g` for group `g`; at most 64 groups).
    pub fn slotless_groups(&self) -> u64 {
        self.groups
            .iter()
            .enumerate()
            .filter(|(_, g)| g.kind.is_slotless())
            .fold(0, |mask, (g, _)| mask | 1 << g)
    }

    /// List group by group the blocks from token `start_token` on for
    /// zeroing again, where zeroing applies: blocks a failed asynchronous
    /// load left unwritten, whose zeroing was skipped (vLLM's
    /// `record_blocks_for_zeroing`).
    pub fn record_blocks_for_zeroing(&mut self, tables: &[BlockTable], start_token: usize) {
        let Some(log) = &mut self.blocks_to_zero else {
            return;
        };
        for (g, table) in tables.iter().enumerate() {
            if !self.groups[g].kind.is_recurrent() {
                let start = (start_token / self.group_block_sizes[g]).min(table.len());
                log[g].extend_from_slice(&table.blocks[start..]);
            }
        }
    }

    /// The attention groups' blocks handed out since the last call, group by
    /// group in allocation order (vLLM's `new_block_ids_to_zero`: a block
    /// taken by a request preempted later in the step counts too); empty
    /// without recurrent groups.
    pub fn take_blocks_to_zero(&mut self) -> Vec<BlockId> {
        match &mut self.blocks_to_zero {
            Some(groups) => groups.iter_mut().flat_map(std::mem::take).collect(),
            None => Vec::new(),
        }
    }

    /// Whether recurrent groups cache their states (vLLM's cache mode
    /// "align": prefix caching on beside a recurrent group).
    pub fn caches_states(&self) -> bool {
        self.align
    }

    /// The last multiple of `unit` tokens whose state a later request with
    /// the same `num_tokens` tokens could resume from (vLLM's
    /// `get_mamba_prefill_checkpoint_position`): its last token is always
    /// computed, and a lookahead hash needs its tokens known; an
    /// EAGLE-style drafter's hit gives up a unit more. vLLM asks it at the
    /// scheduler block, where hits land (the prompt's checkpoint), and at
    /// the hash block (how far a chunk may run, which state the prompt's
    /// last caching keys); the two differ only when the groups' block
    /// sizes do (§7.16).
    pub fn state_checkpoint(&self, num_tokens: usize, unit: usize) -> usize {
        if self.drop_eagle_block {
            return (num_tokens / unit * unit).saturating_sub(unit);
        }
        let proof_limit = num_tokens.saturating_sub(self.hasher.lookahead().max(1));
        proof_limit / unit * unit
    }

    /// The query offsets at which the recurrent groups write a prefill
    /// checkpoint from inside a chunk, when they cache states and can.
    pub fn checkpoint_alignment(&self) -> Option<usize> {
        let recurrent = self.groups.iter().find(|g| g.kind.is_recurrent());
        recurrent
            .filter(|_| self.align)?
            .kind
            .checkpoint_alignment()
    }

    /// A step begins: states cached by the last one are readable now.
    pub fn new_step_starts(&mut self) {
        self.states_cached_this_step.clear();
    }

    /// Tokens per block of each group.
    pub fn group_block_sizes(&self) -> &Arc<[usize]> {
        &self.group_block_sizes
    }

    /// Tokens per block of group `g`.
    pub(crate) fn group_block_size(&self, g: usize) -> usize {
        self.group_block_sizes[g]
    }

    /// Group `g`'s block `k`'s hash: the chain's hash where the block ends
    /// (a block of several hash blocks is keyed by its last one, which
    /// chains its whole prefix: vLLM's `BlockHashListWithBlockSize`).
    pub(crate) fn group_block_hash(
        &self,
        hashes: &[BlockHash],
        g: usize,
        k: usize,
    ) -> Option<BlockHash> {
        let per_block = self.group_block_sizes[g] / self.hash_block_size;
        hashes.get((k + 1) * per_block - 1).copied()
    }

    /// Group `g`'s leading blocks no position after `processed` tokens
    /// reads. A window also keeps the blocks of the last tokens that
    /// multi-module MTP may prefill again (vLLM's `extra_retained_tokens`
    /// on every sliding-window spec), though it no longer attends to them.
    pub(crate) fn skipped_blocks(&self, g: usize, processed: usize) -> usize {
        self.skipped_tokens(g, processed) / self.group_block_size(g)
    }

    /// Group `g`'s leading tokens no position after `processed` tokens
    /// reads (vLLM's `get_num_skipped_tokens`), not rounded to blocks.
    pub(crate) fn skipped_tokens(&self, g: usize, processed: usize) -> usize {
        let kind = self.groups[g].kind;
        let processed = match kind {
            AttentionKind::SlidingWindow { .. } => processed.saturating_sub(self.reprefillable),
            _ => processed,
        };
        kind.num_skipped_tokens(processed)
    }

    /// Per table, the positions whose block has a block hash (what a KV
    /// connector reading vLLM's blocks sees as cached).
    pub fn cached_positions(&self, tables: &[BlockTable]) -> Vec<Vec<u32>> {
        tables
            .iter()
            .map(|t| {
                (0..t.len() as u32)
                    .filter(|&i| {
                        let b = t.blocks[i as usize];
                        b != NULL_BLOCK && self.pool.block(b).is_some_and(|b| b.hash.is_some())
                    })
                    .collect()
            })
            .collect()
    }

    /// The KV-cache groups.
    pub fn groups(&self) -> &[GroupSpec] {
        &self.groups
    }

    /// The longest prefix hit valid for every group (docs/scheduling.md
    /// §7.5, §7.13), capped at `num_tokens − 1` tokens so the last token is
    /// always computed (Q12), and at `max_tokens` when given (an
    /// auxiliary-output retention's reach; one full-attention group never
    /// reaches past it): `hits[g]` gets group `g`'s blocks (null where a
    /// window needs none), `tokens / bs` of them. Changes nothing.
    pub fn find_hit(
        &self,
        seq: &Sequence,
        max_tokens: Option<usize>,
        hits: &mut [Vec<BlockId>],
    ) -> PrefixHit {
        for h in hits.iter_mut() {
            h.clear();
        }
        if !self.enable_caching {
            return PrefixHit::default();
        }
        if self.single_full {
            let mut tokens = self.get_computed_blocks(seq, &mut hits[0]);
            if self.drop_eagle_block && tokens > 0 {
                // The drafter recomputes the hit's last block (§7.4).
                hits[0].pop();
                tokens -= self.hash_block_size; // one group: its block
            }
            return PrefixHit {
                tokens,
                shared_prefix_boundary: 0,
            };
        }
        find_longest_hit(
            &self.pool,
            &self.lookup,
            self.hit_query(seq, max_tokens),
            hits,
        )
    }

    /// The lookup of `seq`'s prefix: short of its last token, and no
    /// further than `max_tokens` when given.
    fn hit_query<'a>(&self, seq: &'a Sequence, max_tokens: Option<usize>) -> HitQuery<'a> {
        HitQuery {
            hashes: seq.block_hashes(),
            max_len: seq
                .num_tokens()
                .saturating_sub(1)
                .min(max_tokens.unwrap_or(usize::MAX)),
            hash_block_size: self.hash_block_size,
            alignment: self.scheduler_block_size,
        }
    }

    /// The local hit told to a KV connector that completes divergent
    /// hybrid hits (vLLM's `get_computed_blocks_for_connector`, §4.19.2),
    /// beside cached recurrent states and full attention: each group's own
    /// hit into `hits[g]`, the full-attention one the hit. `None` where
    /// vLLM takes [`Self::find_hit`] instead: no such layout, or a group
    /// that hit past full attention (whose blocks then went). Changes
    /// nothing.
    pub fn find_hit_per_group(
        &self,
        seq: &Sequence,
        max_tokens: Option<usize>,
        hits: &mut [Vec<BlockId>],
    ) -> Option<GroupHits> {
        let full = self.lookup.first().filter(|l| l.kind.is_full())?;
        if !self.align || self.groups.len() < 2 {
            return None;
        }
        for h in hits.iter_mut() {
            h.clear();
        }
        let query = self.hit_query(seq, max_tokens);
        let by_group = find_hit_per_group(&self.pool, &self.lookup, query, hits);
        let tokens = by_group[full.group_ids[0]];
        if by_group.iter().any(|&t| t > tokens) {
            return None;
        }
        Some(GroupHits {
            tokens,
            diverged: by_group.iter().any(|&t| t < tokens),
        })
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
        // One group: its blocks are the hash blocks.
        let max_hit_blocks = seq.num_tokens().saturating_sub(1) / self.hash_block_size;
        let start = out.len();
        for &hash in seq.block_hashes().iter().take(max_hit_blocks) {
            match self.pool.get_cached_block(hash) {
                Some(b) => out.push(b),
                // Chained hashes: once one block misses, every later one does.
                None => break,
            }
        }
        (out.len() - start) * self.hash_block_size
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
            table.states = Default::default();
        }
    }

    /// Empty every group's table without returning its blocks to the pool;
    /// returns them in allocation order, group by group (vLLM's
    /// `pop_blocks_for_free`), for [`Self::release_blocks_last_first`].
    pub fn take_blocks(&mut self, tables: &mut [BlockTable]) -> Vec<BlockId> {
        let mut blocks = Vec::new();
        for table in tables.iter_mut() {
            blocks.extend(table.blocks.iter().copied().filter(|&b| b != NULL_BLOCK));
            table.blocks.clear();
            table.sync_last();
            table.num_cached = 0;
            table.states = Default::default();
        }
        blocks
    }

    /// Add a reference to each listed usable block from outside any
    /// request (vLLM's `BlockPool.touch`), checked: a free one leaves the
    /// queue.
    pub fn touch_blocks(&mut self, ids: &[BlockId]) -> Result<(), Error> {
        self.pool.touch(ids)
    }

    /// Drop references [`Self::touch_blocks`] took, in the order given
    /// (vLLM's `BlockPool.free_blocks`), checked.
    pub fn free_touched_blocks(&mut self, ids: &[BlockId]) -> Result<(), Error> {
        self.pool.free_blocks(ids)
    }

    /// Return blocks taken by [`Self::take_blocks`] to the pool, the last
    /// first.
    pub fn release_blocks_last_first(&mut self, blocks: &[BlockId]) {
        self.pool.release(blocks.iter().rev().copied());
    }

    /// Take blocks out of the prefix cache (ids checked by the caller).
    pub fn uncache_blocks(&mut self, ids: &[BlockId]) {
        self.pool.uncache(ids);
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

    /// Log requests' lookups and releases from now on (§7.12).
    pub fn enable_request_events(&mut self) {
        self.pool.events.enable_requests();
    }

    /// Offer each state block a recurrent group caches in mode "align" to a
    /// KV connector from now on (§4.19.2).
    pub fn enable_boundary_states(&mut self) {
        self.boundary_states.enable();
    }

    /// The state blocks offered since last taken, oldest first.
    pub fn take_boundary_states(&mut self) -> Vec<BoundaryState> {
        self.boundary_states.take()
    }

    /// Withdraw the offers of the request in `owner`, whose blocks go back.
    pub fn withdraw_boundary_states(&mut self, owner: crate::slab::Slot) {
        self.boundary_states.withdraw(owner);
    }

    /// Whether KV-cache events (routers') are logged.
    pub fn events_enabled(&self) -> bool {
        self.pool.events.enabled()
    }

    /// Log an event the caller knows of (hits: only the caller knows whose
    /// lookup it is; stores are logged as the tables are cached).
    pub fn log_event(&mut self, event: KvEvent) {
        self.pool.events.push(event);
    }

    /// The events since last taken, oldest first.
    pub fn take_events(&mut self) -> Vec<KvEvent> {
        self.pool.events.take()
    }

    /// Forget every cached hash if no block is held; returns whether it
    /// did. Without a KV cache there is no pool to reset: it succeeds, and
    /// no event says so (vLLM's coordinator resets none).
    pub fn reset_prefix_cache(&mut self) -> bool {
        let done = self.groups.is_empty() || self.pool.reset_prefix_cache();
        if done {
            self.stats.reset = true;
        }
        done
    }
}

/// Per group, whether its hits give up an EAGLE block (vLLM's
/// `drop_eagle_group_ids`): none without `drop_eagle_block`, else the
/// flagged groups, or every group when none is flagged.
fn eagle_groups(config: &KvCacheConfig) -> Vec<bool> {
    let n = config.groups.len();
    match (&config.eagle_groups, config.drop_eagle_block) {
        (_, false) => vec![false; n],
        (Some(flagged), true) if !flagged.is_empty() => {
            (0..n).map(|g| flagged.contains(&g)).collect()
        }
        (_, true) => vec![true; n],
    }
}
