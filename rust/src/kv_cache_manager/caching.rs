//! Hash caching (docs/scheduling.md §7.7, §7.13): a table's full blocks
//! enter the prefix-cache map as its tokens fill them, group by group, and
//! how many tokens a request holds in cached blocks.

use super::prefill_checkpoints::StateCheckpoint;
use super::{BoundaryState, KvCacheManager};
use crate::attention_group::{
    dense_window_mask, group_key, recurrent_mask, sparse_mask, AttentionKind, EagleReach,
};
use crate::block::{BlockId, NULL_BLOCK};
use crate::block_table::BlockTable;
use crate::kv_events::KvEvent;
use crate::sequence::Sequence;
use crate::slab::Slot;

impl KvCacheManager {
    /// Hash-cache every group's full blocks up to token `upto`, when prefix
    /// caching is on; the async update caches the blocks its tokens filled,
    /// a KV connector's load those it wrote, once reported (§4.19). The
    /// stores' events name `owner`, the request's slot.
    pub fn cache_full_blocks(
        &mut self,
        tables: &mut [BlockTable],
        seq: &Sequence,
        upto: usize,
        owner: Slot,
    ) {
        if self.enable_caching {
            for (g, table) in tables.iter_mut().enumerate() {
                self.cache_blocks(g, table, seq, upto, Some(owner));
            }
        }
    }

    /// Tokens the request holds in hash-cached blocks, as vLLM estimates
    /// them: per group, where its last held cached block ends (a recurrent
    /// group's: the most tokens a keyed state covers); the least over the
    /// groups.
    #[inline]
    pub fn num_cached_tokens(&self, tables: &[BlockTable]) -> usize {
        if !self.enable_caching {
            return 0;
        }
        if self.single_full {
            return tables[0].num_cached * self.hash_block_size; // one group
        }
        // A window's nulls are a table's prefix (it gives back its oldest
        // blocks first), so the search stops at the first: a window group's
        // scan covers its window, not the whole sequence. A recurrent
        // group's states have nulls between them, but none is held before
        // the positions it gave back: its scan covers its few live states
        // (at 256 running, scanning whole tables took the core's Qwen3-Next
        // step from ~130 to ~620 µs), up to the table's end (a prefill
        // checkpoint's block lies past the hash-cached blocks).
        let hashed =
            |b: BlockId| b != NULL_BLOCK && self.pool.block(b).is_some_and(|b| b.hash.is_some());
        let cached_end = |(g, table): (usize, &BlockTable)| {
            let bs = self.group_block_size(g);
            if self.groups[g].kind.is_recurrent() {
                let first = (table.states.retired as usize).min(table.len());
                return (first..table.len())
                    .filter(|&i| hashed(table.blocks[i]))
                    .map(|i| self.keyed_tokens(table.blocks[i], i, bs))
                    .max()
                    .unwrap_or(0);
            }
            let held = &table.blocks[..table.num_cached.min(table.len())];
            let live = held.iter().rev().take_while(|&&b| b != NULL_BLOCK);
            let end = live
                .enumerate()
                .find(|&(_, &b)| hashed(b))
                .map_or(0, |(back, _)| (held.len() - back) * bs);
            // A prompt tail keyed past the full blocks (§7.16): among the
            // few blocks its tokens have not filled.
            (held.len()..table.len())
                .filter(|&i| hashed(table.blocks[i]))
                .map(|i| self.keyed_tokens(table.blocks[i], i, bs))
                .fold(end, usize::max)
        };
        tables.iter().enumerate().map(cached_end).min().unwrap_or(0)
    }

    /// Hash-cache group `g`'s full blocks up to token `upto`
    /// (docs/scheduling.md §7.7, §7.13, §7.15): every one, except null
    /// positions and, for a window or recurrent group under sparse
    /// retention, those no later request could resume from. With events
    /// on, each key's events are logged as vLLM's manager makes them: the
    /// full blocks' (a key they replace removed first), then a key inside
    /// a block (§7.15–7.16), for the request in `owner`.
    pub(super) fn cache_blocks(
        &mut self,
        g: usize,
        table: &mut BlockTable,
        seq: &Sequence,
        upto: usize,
        owner: Option<Slot>,
    ) {
        let offered_by = owner.filter(|_| self.boundary_states.enabled());
        // The request's planned prefill checkpoint: the allocation's own,
        // or for its output's caching the latest allocation's.
        let checkpoint = match owner {
            Some(slot) if self.align => self.state_checkpoints.get(slot),
            _ => self.step_checkpoint,
        };
        let owner = owner.filter(|_| self.pool.events.enabled());
        // Only tokens whose KV is final: multi-module MTP may prefill the
        // last few again. (vLLM's hybrid coordinator, for several groups,
        // caches them anyway, but in a group that drops an EAGLE block: a
        // window keeps their blocks instead, `skipped_blocks`.) That
        // coordinator caches up to a multiple of the scheduler block, where
        // every group's blocks end (a hit lands there; alike groups' blocks
        // are that unit), and a group that drops an EAGLE block one block
        // of its own past it, the block its hit matches and drops (vLLM's
        // `get_num_cacheable_tokens`). Its unitary one hands a single group
        // the tokens as they are.
        let finalized = upto.saturating_sub(self.reprefillable);
        let unit = self.scheduler_block_size;
        let upto = if self.groups.len() == 1 {
            finalized
        } else if self.drops_eagle[g] && upto >= unit {
            finalized.min(finalized / unit * unit + self.group_block_size(g))
        } else {
            upto / unit * unit
        };
        let first = table.num_cached;
        // Each block from `first` on as this call stored it (the null
        // block where it stored none), for the event.
        let mut block_ids = Vec::new();
        if upto >= (table.num_cached + 1) * self.group_block_size(g) {
            let stored = owner.is_some().then_some(&mut block_ids);
            self.cache_new_full_blocks(g, table, seq, upto, stored);
        }
        if let Some(owner) = owner.filter(|_| table.num_cached > first) {
            block_ids.resize(table.num_cached - first, NULL_BLOCK);
            self.pool.events.push(KvEvent::Stored {
                owner,
                group: g,
                first_block: first,
                block_ids,
            });
        }
        if self.align && self.groups[g].kind.is_recurrent() {
            let cached = table.num_cached;
            self.cache_prompt_state(g, table, seq, upto, checkpoint, owner);
            if let Some(owner) = offered_by {
                self.offer_states(g, table, first..cached, owner);
            }
        }
        if self.groups[g].kind.is_full() && self.group_block_size(g) != self.hash_block_size {
            self.cache_prompt_tail(g, table, seq, upto, owner);
        }
    }

    /// Key the full-attention block the prompt's last hash-block boundary
    /// falls inside by the hash there (vLLM's full-attention
    /// `_cache_partial_tail_block`, beside groups of different block sizes,
    /// §7.16): a later request could resume there once vLLM looks up hits
    /// inside blocks; until its tokens fill it, the block counts as cached
    /// (freed to the queue's tail, its tokens in the cached-token
    /// estimate). The tail is the prompt less its last token (all of it
    /// for a group that drops an EAGLE block), within the hashed tokens.
    fn cache_prompt_tail(
        &mut self,
        g: usize,
        table: &BlockTable,
        seq: &Sequence,
        upto: usize,
        owner: Option<Slot>,
    ) {
        let (bs, unit) = (self.group_block_size(g), self.hash_block_size);
        let prompt = seq.num_prompt_tokens();
        let limit = if self.drops_eagle[g] {
            prompt
        } else {
            prompt.saturating_sub(1)
        };
        let boundary = (limit / unit).min(seq.block_hashes().len()) * unit;
        let idx = boundary / bs;
        if boundary == 0 || boundary > upto || boundary % bs == 0 || idx >= table.len() {
            return;
        }
        let block = table.blocks[idx];
        if block == NULL_BLOCK {
            return;
        }
        let num_hash_blocks = boundary / unit;
        let key = group_key(seq.block_hashes()[num_hash_blocks - 1], g);
        if let Some(b) = self.pool.block(block).filter(|b| b.hash.is_some()) {
            // A tail keyed before more hashes were known moves on; a key
            // that covers as much or more stays, the tail's beside it (for
            // events only: no lookup asks for it).
            let partial = b.partial_tokens as usize;
            if partial == 0 || partial >= boundary {
                if owner.is_some() && self.pool.add_second_key(block, key) {
                    self.log_stored_key(owner, g, num_hash_blocks, block);
                }
                return;
            }
            self.pool.uncache(&[block]);
        }
        self.pool.cache_partial_block(block, key, boundary);
        self.log_stored_key(owner, g, num_hash_blocks, block);
    }

    /// Log that group `g`'s `block` was keyed by the hash at
    /// `num_hash_blocks` hash blocks, when events are on (`owner`).
    fn log_stored_key(
        &mut self,
        owner: Option<Slot>,
        g: usize,
        num_hash_blocks: usize,
        block: BlockId,
    ) {
        if let Some(owner) = owner {
            self.pool.events.push(KvEvent::StoredKey {
                owner,
                group: g,
                num_hash_blocks,
                block_id: block,
            });
        }
    }

    /// The tokens the key of `block`, at `position` in a table of `bs`
    /// blocks, covers: where the block ends, unless the key is partial.
    fn keyed_tokens(&self, block: BlockId, position: usize, bs: usize) -> usize {
        match self.pool.block(block).map_or(0, |b| b.partial_tokens) {
            0 => (position + 1) * bs,
            tokens => tokens as usize,
        }
    }

    /// [`Self::cache_blocks`] once a block has filled since the last call.
    fn cache_new_full_blocks(
        &mut self,
        g: usize,
        table: &mut BlockTable,
        seq: &Sequence,
        upto: usize,
        mut stored: Option<&mut Vec<BlockId>>,
    ) {
        let hashes = seq.block_hashes();
        let bs = self.group_block_size(g);
        let full = (upto.min(hashes.len() * self.hash_block_size) / bs).min(table.len());
        let start = table.num_cached;
        if start < full {
            let kind = self.groups[g].kind;
            let window_mask = match kind {
                AttentionKind::SlidingWindow { window } if self.sparse_retention => {
                    Some(sparse_mask(
                        start,
                        full,
                        bs,
                        self.scheduler_block_size,
                        window,
                        seq.num_prompt_tokens(),
                        seq.shared_prefix_boundary,
                        self.retention_interval,
                        EagleReach {
                            any_group: self.drop_eagle_block,
                            this_group: self.drops_eagle[g],
                        },
                    ))
                }
                _ => None,
            };
            let dense_mask = match kind {
                AttentionKind::SlidingWindow { window } if !self.sparse_retention => {
                    dense_window_mask(bs, self.scheduler_block_size, window, self.drops_eagle[g])
                }
                _ => None,
            };
            let state_mask = kind.is_recurrent().then(|| {
                recurrent_mask(
                    bs,
                    self.scheduler_block_size,
                    self.sparse_retention,
                    seq.num_prompt_tokens(),
                    seq.shared_prefix_boundary,
                    self.retention_interval,
                    EagleReach {
                        any_group: self.drop_eagle_block,
                        this_group: self.drops_eagle[g],
                    },
                )
            });
            let recurrent = kind.is_recurrent();
            let per_block = bs / self.hash_block_size;
            let block_hashes = hashes[..full * per_block]
                .iter()
                .skip(per_block - 1)
                .step_by(per_block);
            if full - start > 1 {
                let keys = block_hashes.clone().skip(start).map(|&h| group_key(h, g));
                self.pool.read_ahead_map(keys);
            }
            let fresh = table.blocks[start..full]
                .iter()
                .zip(block_hashes.skip(start));
            for (i, (&block, &hash)) in (start..).zip(fresh) {
                let dropped = window_mask.as_ref().is_some_and(|keep| !keep(i))
                    || dense_mask.as_ref().is_some_and(|keep| !keep(i))
                    || state_mask.as_ref().is_some_and(|keep| !keep(i));
                if block == NULL_BLOCK || dropped {
                    if let Some(stored) = stored.as_deref_mut() {
                        stored.push(NULL_BLOCK);
                    }
                    continue;
                }
                let key = group_key(hash, g);
                match self.pool.block(block).and_then(|b| b.hash) {
                    Some(held) if held == key => {
                        if let Some(stored) = stored.as_deref_mut() {
                            stored.push(NULL_BLOCK);
                        }
                        continue;
                    }
                    // A partial key (a prompt tail's) gives way to the
                    // block's own.
                    Some(_) => self.pool.uncache(&[block]),
                    None => {}
                }
                self.pool.cache_block(block, key);
                if let Some(stored) = stored.as_deref_mut() {
                    stored.push(block);
                }
                if recurrent {
                    // Its state is this step's to write (§7.15).
                    self.states_cached_this_step.push(key);
                }
            }
        }
        table.num_cached = table.num_cached.max(full);
    }

    /// Offer a KV connector each state block `blocks` of group `g`'s table
    /// that this call cached and that still holds a key (a checkpoint's may
    /// have gone again, or been re-keyed where it ends), with the tokens
    /// that key covers (vLLM's Mamba `cache_blocks`).
    fn offer_states(
        &mut self,
        g: usize,
        table: &BlockTable,
        blocks: std::ops::Range<usize>,
        owner: Slot,
    ) {
        let bs = self.group_block_size(g);
        for i in blocks {
            let block_id = table.blocks[i];
            if block_id == NULL_BLOCK || self.pool.block(block_id).is_none_or(|b| b.hash.is_none())
            {
                continue;
            }
            let num_tokens = self.keyed_tokens(block_id, i, bs);
            self.boundary_states.offer(BoundaryState {
                owner,
                group: g,
                block_id,
                num_tokens,
            });
        }
    }

    /// Cache the state where a later request with this prompt resumes, if a
    /// block holds it unhashed (vLLM's Mamba `_cache_partial_tail_block`):
    /// sparse retention passed it by when the prompt was shorter (a
    /// session's next turn).
    fn cache_prompt_state(
        &mut self,
        g: usize,
        table: &BlockTable,
        seq: &Sequence,
        upto: usize,
        checkpoint: Option<StateCheckpoint>,
        owner: Option<Slot>,
    ) {
        if let Some(checkpoint) = checkpoint {
            return self.cache_checkpoint_state(g, table, seq, checkpoint, owner);
        }
        // The hash block (validated). The tokens as the coordinator hands
        // them: a group that drops an EAGLE block beside multi-module MTP
        // gets a count inside a block, and keys no state then.
        let bs = self.group_block_size(g);
        let num_tokens = upto;
        let idx = num_tokens / bs;
        if num_tokens == 0
            || num_tokens % bs != 0
            || idx > table.len()
            || idx > seq.block_hashes().len()
        {
            return;
        }
        // The prompt's last hash-block boundary (vLLM's
        // `latest_prompt_hash_boundary`).
        if num_tokens != self.state_checkpoint(seq.num_prompt_tokens(), self.hash_block_size) {
            return;
        }
        self.cache_state(g, table, seq, idx - 1, num_tokens, owner);
    }

    /// Key the block a prefill checkpoint was written to in this step
    /// (vLLM's checkpoint branch of `_cache_partial_tail_block`), when a
    /// later request could resume there: the prompt's checkpoint, a state
    /// the retention keeps, or a shared prefix's end. Otherwise the block's
    /// state is only passing through, and any key it has goes.
    fn cache_checkpoint_state(
        &mut self,
        g: usize,
        table: &BlockTable,
        seq: &Sequence,
        checkpoint: StateCheckpoint,
        owner: Option<Slot>,
    ) {
        let bs = self.group_block_size(g);
        let StateCheckpoint {
            position,
            block: idx,
        } = checkpoint;
        // Whether the retention keeps the state after `position` (the one
        // that block would hold where it ends there).
        let per_segment = self.retention_interval / bs;
        let ends_segment = per_segment <= 1 || (position / bs) % per_segment == 0;
        let retained = !self.sparse_retention || (self.retention_interval > 0 && ends_segment);
        let prompt_checkpoint =
            self.state_checkpoint(seq.num_prompt_tokens(), self.scheduler_block_size);
        let reachable =
            position == prompt_checkpoint || retained || position == seq.shared_prefix_boundary;
        if !reachable {
            let block_id = table.blocks[idx];
            if block_id != NULL_BLOCK {
                self.pool.events.push(KvEvent::Evicted { block_id });
            }
            self.pool.uncache(&table.blocks[idx..=idx]);
            return;
        }
        self.cache_state(g, table, seq, idx, position, owner);
    }

    /// Hash-cache the state in group `g`'s block `idx` out of turn as the
    /// state after `position` tokens (keyed by the hash there), unless it
    /// is null or keyed so already; a key it has for another position goes
    /// (vLLM's `cache_partial_block`, which replaces it). The block ends at
    /// `position` unless it holds a prefill checkpoint of groups whose
    /// block sizes differ (§7.16).
    fn cache_state(
        &mut self,
        g: usize,
        table: &BlockTable,
        seq: &Sequence,
        idx: usize,
        position: usize,
        owner: Option<Slot>,
    ) {
        let block = table.blocks[idx];
        if block == NULL_BLOCK {
            return;
        }
        // A decode step verifying at least a block of drafts can pass for a
        // checkpoint past the hashed tokens: vLLM asserts there; nothing
        // to key.
        let hash_index = position / self.hash_block_size - 1;
        let Some(&hash) = seq.block_hashes().get(hash_index) else {
            return;
        };
        let key = group_key(hash, g);
        match self.pool.block(block).and_then(|b| b.hash) {
            Some(held) if held == key => return,
            Some(_) => self.pool.uncache(&[block]),
            None => {}
        }
        self.pool.cache_partial_block(block, key, position);
        self.states_cached_this_step.push(key);
        self.log_stored_key(owner, g, hash_index + 1, block);
    }
}
