//! Slot allocation (docs/scheduling.md §7.6, §7.11, §7.13): the admission gate
//! summed over the groups (window caps included), window blocks given back,
//! prefix hits taken, the same new blocks per group, and the hash caching
//! the step's tokens allow. Every check comes before any change, so a
//! refusal leaves the pool, the map and the tables as they were.

use super::prefill_checkpoints::StateCheckpoint;
use super::KvCacheManager;
use crate::attention_group::checkpoint_in_chunk;
use crate::block::{BlockId, NULL_BLOCK};
use crate::block_table::BlockTable;
use crate::cdiv;
use crate::error::Error;
use crate::sequence::Sequence;
use crate::slab::Slot;

/// What an admission's allocation checks besides the step's own blocks.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Admission {
    /// The whole known sequence must fit too (the admission gate, Q13).
    pub full_sequence_must_fit: bool,
    /// Blocks that must stay free beyond what is taken (vLLM's watermark).
    pub watermark: usize,
    /// Encoder tokens whose cross-attention slots the step needs: those of
    /// the encoder inputs it runs (an encoder-decoder's admission), else 0.
    pub encoder_tokens: usize,
    /// Tokens past the hits a KV connector supplies (§4.19): counted as
    /// computed, in fresh blocks.
    pub external_tokens: usize,
    /// Blocks kept free for others on top of the watermark: what in-flight
    /// prefills still need, when an async load is admitted (§4.19).
    pub reserved_blocks: usize,
    /// The external tokens arrive later: no lookahead slots yet, and
    /// nothing hash-cached until the load is reported.
    pub load_async: bool,
    /// The request's slot, named in the KV-cache events of the blocks the
    /// allocation hash-caches (None: no store is logged).
    pub owner: Option<Slot>,
    /// The groups (bit `g`: group `g`) whose blocks for the external
    /// tokens an asynchronous load writes: not listed for zeroing, which
    /// would race it (vLLM's `skip_zeroing_group_ids`).
    pub loaded_groups: u64,
}

/// The tokens an allocation covers, as the groups count them.
#[derive(Copy, Clone, Debug)]
struct Span {
    /// Slots: the tokens, a drafter's lookahead included.
    slots: usize,
    /// The model's own tokens: those computed and the new ones.
    main: usize,
    /// Tokens computed before the step, hits included.
    computed: usize,
    /// Where the request's prefill ends: its prompt, or for a resumed
    /// request its tokens but the last.
    prefill_end: usize,
}

impl KvCacheManager {
    /// Blocks group `g` must take to cover `span`'s slots after its
    /// `hits`: positions not held yet (and a recurrent group's scratch
    /// states), plus hits that sit in the free queue (taking them lowers
    /// the free count too). `capped`: the admission check, which counts a
    /// window group's blocks only up to its cap. A recurrent group caching
    /// its states counts them by the model's own tokens (no drafter's
    /// lookahead) and may come out negative (§7.15).
    fn blocks_needed(
        &self,
        g: usize,
        table: &BlockTable,
        span: Span,
        hits: &[BlockId],
        capped: bool,
    ) -> isize {
        let kind = self.groups[g].kind;
        let evictable = |hits: &[BlockId]| {
            hits.iter()
                .filter(|&&b| b != NULL_BLOCK && self.pool.block(b).is_some_and(|b| b.ref_cnt == 0))
                .count() as isize
        };
        if self.align && kind.is_recurrent() {
            return self.states_needed(g, table, span, hits.len()) + evictable(hits);
        }
        let mut required = cdiv(span.slots, self.group_block_size(g)) + kind.extra_blocks();
        if capped {
            if let Some(cap) = self.groups[g].admission_cap_blocks {
                required = required.min(cap);
            }
        }
        if !table.is_empty() {
            return required.saturating_sub(table.len() + hits.len()) as isize + evictable(hits);
        }
        // A new table starts with nulls for the blocks a window no longer
        // reads after the computed tokens, which an external hit (a KV
        // connector's) may put past the local hits; the hits there are not
        // taken (vLLM's `get_num_blocks_to_allocate`).
        let skipped = self.skipped_blocks(g, span.computed);
        let taken = &hits[skipped.min(hits.len())..];
        required.saturating_sub(skipped.max(hits.len())) as isize + evictable(taken)
    }

    /// Blocks a running request's `tables` still take to hold `slots`
    /// tokens, each window group's counted up to its admission cap (vLLM's
    /// `get_num_blocks_to_allocate` as its scheduler asks it for an
    /// in-flight prefill's reservation).
    pub(crate) fn blocks_to_hold(
        &self,
        tables: &[BlockTable],
        slots: usize,
        seq: &Sequence,
    ) -> usize {
        let main = seq.num_tokens().min(self.max_model_len);
        let span = Span {
            slots,
            main,
            computed: seq.num_computed_tokens,
            prefill_end: seq
                .num_prompt_tokens()
                .max(seq.num_tokens().saturating_sub(1)),
        };
        self.blocks_needed_all(tables, span, 0, &[], true).max(0) as usize
    }

    /// The blocks one step of `tokens` drafted tokens takes in each group
    /// with per-token slots (vLLM's `_spec_decode_step_blocks`).
    pub(crate) fn draft_step_blocks(&self, tokens: usize) -> usize {
        (0..self.groups.len())
            .filter(|&g| !self.groups[g].kind.is_recurrent())
            .map(|g| cdiv(tokens, self.group_block_size(g)))
            .sum()
    }

    /// New state blocks recurrent group `g` takes for the step in cache mode
    /// "align" (vLLM's `MambaManager.get_num_blocks_to_allocate`): the
    /// positions not held yet, at most one state per step (and one for a
    /// prefill checkpoint) once the scratch states are taken; negative when
    /// drafts left it more than it needs.
    fn states_needed(&self, g: usize, table: &BlockTable, span: Span, hits: usize) -> isize {
        let extra = self.groups[g].kind.extra_blocks();
        let required = cdiv(span.main, self.group_block_size(g)) + extra;
        let new = required as isize - (hits + table.len()) as isize;
        if new <= 0 {
            return new;
        }
        let checkpoint = usize::from(self.checkpoint_in_step(g, table, span).is_some());
        let most = 1 + checkpoint + if table.states.allocated() { 0 } else { extra };
        new.min(most as isize)
    }

    /// Where recurrent group `g` writes the prompt's checkpoint from inside
    /// the step (vLLM's `_needs_internal_checkpoint`): the step ends the
    /// prefill (any step, unless retention is sparse without an interval),
    /// its backend can write a state inside a chunk, the
    /// checkpoint lies inside the chunk, and the block for it is still free
    /// to take (a null or beyond the table, or a scratch state).
    fn checkpoint_in_step(
        &self,
        g: usize,
        table: &BlockTable,
        span: Span,
    ) -> Option<StateCheckpoint> {
        let alignment = self.groups[g].kind.checkpoint_alignment()?;
        let bs = self.group_block_size(g);
        // (Where a hit lands: vLLM's `cache_hit_alignment_tokens`.)
        let position = self.state_checkpoint(span.main, self.scheduler_block_size);
        let block = cdiv(span.main, bs).checked_sub(2)?;
        let extra = self.groups[g].kind.extra_blocks();
        let free_slot = block >= table.len()
            || table.blocks[block] == NULL_BLOCK
            || (table.states.allocated() && block + extra >= table.len());
        // Under sparse retention only the chunk that ends the prefill keeps
        // its checkpoint; otherwise every chunk's is kept (vLLM's
        // coordinator passes no prefill end then).
        let every_chunk = !self.sparse_retention || self.retention_interval > 0;
        let inside = (every_chunk || span.main >= span.prefill_end)
            && checkpoint_in_chunk(span.computed, span.main, position, bs, alignment);
        (inside && free_slot && position > 0).then_some(StateCheckpoint { position, block })
    }

    /// Blocks all groups must take (`hits`: one list per group, or none):
    /// `span`'s slots in the decoder's groups, `encoder_tokens` in the
    /// cross-attention ones.
    fn blocks_needed_all(
        &self,
        tables: &[BlockTable],
        span: Span,
        encoder_tokens: usize,
        hits: &[Vec<BlockId>],
        capped: bool,
    ) -> isize {
        (0..tables.len())
            .map(|g| {
                let h = hits.get(g).map_or(&[][..], |h| &h[..]);
                let slots = self.slots_of(g, span.slots, encoder_tokens);
                self.blocks_needed(g, &tables[g], Span { slots, ..span }, h, capped)
            })
            .sum()
    }

    /// Whether a recurrent group's hit ends on a state cached this step,
    /// which the step's forward pass has yet to write: the request waits a
    /// step (vLLM's `MambaManager` answers "more blocks than the pool").
    fn hits_a_state_in_flight(&self, hits: &[Vec<BlockId>]) -> bool {
        self.align
            && !self.states_cached_this_step.is_empty()
            && hits.iter().enumerate().any(|(g, h)| {
                self.groups[g].kind.is_recurrent()
                    && h.last().is_some_and(|&b| {
                        let hash = self.pool.block(b).and_then(|b| b.hash);
                        hash.is_some_and(|k| self.states_cached_this_step.contains(&k))
                    })
            })
    }

    /// The slots group `g` covers: the encoder's tokens for cross-attention.
    fn slots_of(&self, g: usize, tokens: usize, encoder_tokens: usize) -> usize {
        if self.groups[g].kind.is_cross() {
            encoder_tokens
        } else {
            tokens
        }
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
                ..Admission::default()
            },
            0,
        ))
    }

    /// [`Self::allocate_slots`] over every group's table, with arguments the
    /// caller guarantees (the scheduler's own): `Some(k)`, group 0's new
    /// blocks (each table records its own growth), or `None`. `hits` holds
    /// one list per group (or none); `in_flight` of the computed tokens are
    /// still being computed. Before
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
            ..
        } = admission;
        if self.single_full
            && hits.is_empty()
            && !full_sequence_must_fit
            && watermark == 0
            && admission.external_tokens == 0
        {
            // Fast path (most decode steps), inlined into the running pass:
            // the table already covers the new tokens, so nothing can be
            // refused or allocated.
            let table = &mut tables[0];
            let computed = seq.num_computed_tokens.min(self.max_model_len);
            let slots = computed
                .saturating_add(num_new_tokens)
                .saturating_add(self.lookahead)
                .min(self.max_model_len);
            table.set_grown(0);
            // (One group: its blocks are the hash blocks.)
            if slots <= table.len() * self.hash_block_size {
                if self.enable_caching {
                    let upto = computed
                        .saturating_add(num_new_tokens)
                        .min(seq.num_tokens());
                    if upto >= (table.num_cached + 1) * self.hash_block_size {
                        // a block just filled
                        self.cache_blocks(0, table, seq, upto, admission.owner);
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
            encoder_tokens,
            external_tokens,
            reserved_blocks,
            load_async,
            owner,
            loaded_groups,
        } = admission;
        let computed = seq
            .num_computed_tokens
            .saturating_add(num_new_computed_tokens)
            .saturating_add(external_tokens)
            .min(self.max_model_len);
        if self.hits_a_state_in_flight(hits) {
            return None;
        }
        let free = |kv: &Self| kv.pool.num_free_blocks() as isize;
        let prefill_end = seq
            .num_prompt_tokens()
            .max(seq.num_tokens().saturating_sub(1));
        if full_sequence_must_fit {
            let full = seq.num_tokens().min(self.max_model_len);
            let span = Span {
                slots: full,
                main: full,
                computed,
                prefill_end,
            };
            let need = self.blocks_needed_all(tables, span, encoder_tokens, hits, true);
            if need + watermark as isize > free(self) {
                return None;
            }
        }
        // Saturating: a caller's count may be anything up to usize::MAX.
        // The lookahead slots come on top; the admission gate above ignores
        // them, as vLLM's does.
        let lookahead = if load_async { 0 } else { self.lookahead };
        let main_tokens = computed.saturating_add(num_new_tokens);
        let slots = main_tokens
            .saturating_add(lookahead)
            .min(self.max_model_len);
        if !self.single_full {
            // What the step computed for sure (not what is still in flight)
            // is all a window can have left behind.
            let processed = computed.saturating_sub(in_flight);
            for (g, table) in tables.iter_mut().enumerate() {
                self.remove_skipped_blocks(g, table, processed);
            }
        }
        let span = Span {
            slots,
            main: main_tokens,
            computed,
            prefill_end,
        };
        let needed = self.blocks_needed_all(tables, span, encoder_tokens, hits, false);
        // A prefill checkpoint is decided on the tables before their hits,
        // as vLLM decides it; every recurrent group's table has the same
        // shape. vLLM's MambaManager records it (or forgets the last) per
        // request as it counts, before it knows the blocks are free, and
        // its caching reads it until the request's next count: an output's
        // caching between steps too.
        let checkpoint = self
            .groups
            .iter()
            .position(|g| self.align && g.kind.is_recurrent())
            .and_then(|g| self.checkpoint_in_step(g, &tables[g], span));
        if let Some(slot) = owner.filter(|_| self.align) {
            self.state_checkpoints.set(slot, checkpoint);
        }
        if needed + (watermark + reserved_blocks) as isize > free(self) {
            return None;
        }
        // Enough is free: from here on nothing can fail.
        self.step_checkpoint = checkpoint;
        // Hits and an external hit (a KV connector's) are taken by a request
        // that holds no blocks yet; one that does (a load that failed in
        // part, asked again) grows its tables as a running one does.
        let fresh = tables.iter().all(BlockTable::is_empty);
        if fresh && external_tokens > 0 && self.align {
            let beyond = self.state_blocks_beyond_count(tables, span, hits, external_tokens);
            if needed + beyond as isize > free(self) {
                // vLLM counts a cached state group's growth, not the block
                // an external hit gives it first, and its pool then runs
                // dry mid-allocation (its get_new_blocks raises): the
                // request waits instead.
                self.step_checkpoint = None;
                return None;
            }
        }
        if !hits.is_empty() || (fresh && external_tokens > 0) {
            for (g, table) in tables.iter_mut().enumerate() {
                let h = hits.get(g).map_or(&[][..], |h| &h[..]);
                self.take_hits(g, table, h, computed);
            }
        }
        if fresh && external_tokens > 0 {
            // The external tokens' blocks, every group's, before any
            // group's new ones (vLLM allocates them in two passes).
            for (g, table) in tables.iter_mut().enumerate() {
                let in_window = computed.saturating_sub(self.skipped_tokens(g, computed));
                if in_window.min(external_tokens) > 0 {
                    let grow = cdiv(computed, self.group_block_size(g)).saturating_sub(table.len());
                    self.pool.take_free_blocks(grow, &mut table.blocks);
                    table.sync_last();
                    let loaded = loaded_groups & (1 << g) != 0;
                    if let Some(log) = self.blocks_to_zero.as_mut().filter(|_| !loaded) {
                        if !self.groups[g].kind.is_recurrent() {
                            log[g].extend_from_slice(&table.blocks[table.len() - grow..]);
                        }
                    }
                }
            }
        }
        // Group by group, in order (as vLLM's coordinator takes them); each
        // table records its growth for the step's new block ids.
        for (g, table) in tables.iter_mut().enumerate() {
            let kind = self.groups[g].kind;
            if self.align && kind.is_recurrent() {
                self.grow_states(g, table, main_tokens, self.step_checkpoint.is_some());
                continue;
            }
            let t = self.slots_of(g, slots, encoder_tokens);
            let required = cdiv(t, self.group_block_size(g)) + kind.extra_blocks();
            let grow = required.saturating_sub(table.len());
            self.pool.take_free_blocks(grow, &mut table.blocks);
            table.set_grown(grow);
            table.sync_last();
            if let Some(log) = &mut self.blocks_to_zero {
                if !kind.is_recurrent() {
                    log[g].extend_from_slice(&table.blocks[table.len() - grow..]);
                }
            }
        }
        let k = tables.first().map_or(0, BlockTable::grown);
        // A load still on its way is cached once it is reported.
        if self.enable_caching && !load_async {
            let upto = computed
                .saturating_add(num_new_tokens)
                .min(seq.num_tokens());
            for (g, table) in tables.iter_mut().enumerate() {
                self.cache_blocks(g, table, seq, upto, owner);
            }
        }
        self.step_checkpoint = None;
        Some(k)
    }

    /// The blocks cached recurrent-state groups take for an external hit
    /// (a fresh request's) beyond what they count: the hit's block and the
    /// step's growth past it, less the growth counted (vLLM's
    /// `get_num_blocks_to_allocate`, which leaves the hit's block out).
    fn state_blocks_beyond_count(
        &self,
        tables: &[BlockTable],
        span: Span,
        hits: &[Vec<BlockId>],
        external_tokens: usize,
    ) -> usize {
        let checkpoint = usize::from(self.step_checkpoint.is_some());
        let mut beyond = 0;
        for (g, table) in tables.iter().enumerate() {
            if !self.groups[g].kind.is_recurrent() {
                continue;
            }
            let h = hits.get(g).map_or(&[][..], |h| &h[..]);
            let bs = self.group_block_size(g);
            let computed = span.computed;
            // take_hits, then the external pass, then grow_states (fresh).
            let hit_len = self.skipped_blocks(g, computed).max(h.len());
            let in_window = computed.saturating_sub(self.skipped_tokens(g, computed));
            let external = if in_window.min(external_tokens) > 0 {
                cdiv(computed, bs).saturating_sub(hit_len)
            } else {
                0
            };
            let len = hit_len + external;
            let extra = self.groups[g].kind.extra_blocks();
            let required = cdiv(span.main, bs) + extra;
            let main = if required <= len && checkpoint == 0 {
                0
            } else {
                let ends_in = required - extra - 1;
                let base = if len < ends_in {
                    (ends_in - checkpoint).max(len)
                } else {
                    len
                };
                required.saturating_sub(base)
            };
            let counted = self.blocks_needed(g, table, span, h, false).max(0) as usize;
            beyond += (external + main).saturating_sub(counted);
        }
        beyond
    }

    /// Grow recurrent group `g`'s table to `main_tokens` in cache mode
    /// "align" (vLLM's `MambaManager.allocate_new_blocks`, §7.15): nulls up
    /// to the position of the state the step ends in (or, with a prefill
    /// `checkpoint`, the block before it, which holds the checkpoint), the
    /// scratch states moved past them, and a new block at each (with the
    /// scratch states, the first time). The step's new block ids are the
    /// table's tail from where it stood, nulls and moved blocks included, as
    /// vLLM sends them.
    fn grow_states(
        &mut self,
        g: usize,
        table: &mut BlockTable,
        main_tokens: usize,
        checkpoint: bool,
    ) {
        let extra = self.groups[g].kind.extra_blocks();
        let required = cdiv(main_tokens, self.group_block_size(g)) + extra;
        let before = table.len();
        table.set_grown(0);
        if required <= before && !checkpoint {
            table.states.set_allocated();
            return;
        }
        let allocated = table.states.allocated();
        // The state this step starts from: the running one past the first
        // allocation, else a hit's.
        if allocated {
            table.states.set_previous(before - 1 - extra);
        } else if before > 0 {
            table.states.set_previous(before - 1);
        }
        let ends_in = required - extra - 1;
        // The first position that keeps a block: the checkpoint's, else the
        // state the step ends in.
        let kept = ends_in - usize::from(checkpoint);
        if before < ends_in {
            table.blocks.resize(kept.max(before), NULL_BLOCK);
        }
        if allocated {
            // Scratch states the step passed move to the end, in order.
            for i in before - extra..before {
                if i >= kept {
                    break;
                }
                let moved = table.blocks[i];
                table.blocks[i] = NULL_BLOCK;
                table.blocks.push(moved);
            }
        }
        let grow = required.saturating_sub(table.len());
        debug_assert!(grow <= 1 + usize::from(checkpoint) + if allocated { 0 } else { extra });
        self.pool.take_free_blocks(grow, &mut table.blocks);
        table.states.set_allocated();
        table.set_grown(table.len() - before);
        table.sync_last();
    }

    /// Adopt group `g`'s prefix hits: the blocks a window no longer reads
    /// (before `computed`'s window) stay null, the rest are taken.
    fn take_hits(&mut self, g: usize, table: &mut BlockTable, hits: &[BlockId], computed: usize) {
        // An external hit (a KV connector's) may skip past the local hits.
        let skipped = self.skipped_blocks(g, computed);
        let taken = &hits[skipped.min(hits.len())..];
        let live: Vec<BlockId> = taken.iter().copied().filter(|&b| b != NULL_BLOCK).collect();
        self.pool.add_refs(&live);
        table.blocks.resize(skipped, NULL_BLOCK);
        table.blocks.extend_from_slice(taken);
        table.num_cached = table.blocks.len();
        table.sync_last();
    }

    /// Give back every window group's blocks that no position after
    /// `processed` tokens reads (what vLLM's scheduler does before it hands
    /// a finished request's blocks to a KV connector).
    pub(crate) fn remove_blocks_out_of_window(
        &mut self,
        tables: &mut [BlockTable],
        processed: usize,
    ) {
        if self.single_full {
            return;
        }
        for (g, table) in tables.iter_mut().enumerate() {
            self.remove_skipped_blocks(g, table, processed);
        }
    }

    /// Give back group `g`'s blocks that no position after `processed`
    /// tokens reads (a window's past), last first, leaving nulls; stops at
    /// the first position already null.
    fn remove_skipped_blocks(&mut self, g: usize, table: &mut BlockTable, processed: usize) {
        if self.align && self.groups[g].kind.is_recurrent() {
            return self.remove_past_states(g, table, processed);
        }
        let skipped = self.skipped_blocks(g, processed);
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

    /// Give back recurrent group `g`'s states before the last processed
    /// token's block in cache mode "align" (vLLM's `MambaManager`), last
    /// first, past the nulls between them; then the state the previous
    /// step started from, once the table has moved past it.
    fn remove_past_states(&mut self, g: usize, table: &mut BlockTable, processed: usize) {
        let bs = self.group_block_size(g);
        let skipped = (processed.saturating_sub(1) / bs).min(table.len());
        let first = table.states.retired as usize;
        if first < skipped {
            let mut freed: Vec<BlockId> = Vec::new();
            for i in (first..skipped).rev() {
                if table.blocks[i] != NULL_BLOCK {
                    freed.push(table.blocks[i]);
                    table.blocks[i] = NULL_BLOCK;
                }
            }
            if !freed.is_empty() {
                self.pool.release(freed.into_iter());
            }
            table.states.retired = skipped as u32;
        }
        if let Some(p) = table.states.previous() {
            if p + 1 < cdiv(processed, bs) && table.blocks[p] != NULL_BLOCK {
                self.pool.release(std::iter::once(table.blocks[p]));
                table.blocks[p] = NULL_BLOCK;
            }
        }
        table.sync_last();
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
        let bs = self.group_block_size(0);
        if num_new_computed_tokens != hits.len() * bs {
            return Err(Error::invalid(format!(
                "allocate_slots: num_new_computed_tokens = {num_new_computed_tokens} must be \
                 len(new_computed_blocks) * block_size = {}",
                hits.len() * bs
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
        if hits.len() * bs >= seq.num_tokens() {
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
            let hash = self.group_block_hash(seq.block_hashes(), 0, k);
            let held = (b != NULL_BLOCK)
                .then(|| self.pool.block(b))
                .flatten()
                .is_some_and(|block| hash.is_some() && block.hash == hash);
            if !held {
                return Err(Error::invalid(format!(
                    "allocate_slots: new_computed_blocks[{k}] = {b} is not a cached copy of the \
                     request's block {k}"
                )));
            }
        }
        Ok(())
    }
}
