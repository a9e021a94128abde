//! The WAITING pass (docs/scheduling.md §4.5): admit waiting requests from
//! the head of the queue while the budget, `max_num_active_seqs` and the KV
//! cache allow, each with its longest cached prefix. Requests that hold KV
//! blocks (streaming sessions between turns, §4.12) are admitted first.

use super::kv_transfer::Answer;
use super::{EncoderStore, Scheduler, StepDraft};
use crate::block::BlockId;
use crate::grammar::Reached;
use crate::kv_cache_manager::Admission;
use crate::kv_connector::ExternalHit;
use crate::kv_events::KvEvent;
use crate::lora::LoraBatch;
use crate::request::RequestStatus;
use crate::scheduler_config::Runner;
use crate::slab::Slot;
use crate::spec_decode::Drafts;
use crate::step::Kind;

/// What became of the request at the head of its queue.
enum Admit {
    Admitted,
    /// It cannot be admitted now; the pass ends with it at the head.
    Blocked,
    /// Nothing of it fits this step, or it waits for its KV cache to be
    /// loaded (§4.19); the pass goes on without it.
    Skipped,
}

/// The requests a pass skipped, by the queue they go back to.
#[derive(Default)]
struct Skipped {
    kv_holding: Vec<Slot>,
    waiting: Vec<Slot>,
}

impl Scheduler {
    /// Admit waiting requests into `draft` (only when nobody was preempted
    /// this step and not everything is paused). `admit_new` is false when
    /// admissions are paused: then only requests holding KV blocks are.
    pub(super) fn schedule_waiting(&mut self, draft: &mut StepDraft, admit_new: bool) {
        let mut skipped = Skipped::default();
        // The adapters of every running request, scheduled this step or not
        // (they can join a later batch), before any admission (§4.14).
        let mut loras = self.config.max_loras.map(|max_loras| {
            let running = self
                .running
                .iter()
                .filter_map(|&s| self.requests[s].lora_id);
            LoraBatch::of_running(max_loras, running)
        });
        while draft.token_budget > 0 {
            let from_kv = !self.kv_holding.is_empty();
            let queue = if from_kv {
                &self.kv_holding
            } else if admit_new {
                &self.waiting
            } else {
                break;
            };
            let Some(slot) = queue.peek() else {
                break;
            };
            // Sessions waiting for input keep a runner slot (§4.12).
            let active = self.running.len() + self.num_waiting_for_input;
            let no_input_room = draft.input_budget <= self.config.num_draft_slots;
            if no_input_room || active >= self.config.max_num_active_seqs {
                break;
            }
            if self.requests[slot].status == RequestStatus::WaitingForStreamingReq {
                self.skip(slot, from_kv, &mut skipped);
                continue;
            }
            // Its KV cache is being loaded: skipped until the load is
            // reported, then settled and admitted like any holder (§4.19).
            if self.requests[slot].status == RequestStatus::WaitingForRemoteKvs {
                if !self.requests[slot].kv_loaded {
                    self.skip(slot, from_kv, &mut skipped);
                    continue;
                }
                self.settle_load(slot);
            }
            // Held for its grammar (§4.10); the compile result counts now.
            if let Some(grammar) = self.requests[slot].grammar.as_mut() {
                match grammar.reach() {
                    Reached::Held => {
                        self.skip(slot, from_kv, &mut skipped);
                        continue;
                    }
                    Reached::Failed => {
                        draft.grammar_failed.push(slot);
                        self.skip(slot, from_kv, &mut skipped);
                        continue;
                    }
                    Reached::Go { released } => {
                        if released {
                            draft.grammar_released.push(slot);
                        }
                    }
                }
            }
            if self.output_in_flight(slot) {
                self.skip(slot, from_kv, &mut skipped);
                continue;
            }
            // A new adapter past max_loras waits for a step with room for it.
            let lora = self.requests[slot].lora_id;
            if let (Some(batch), Some(id)) = (&loras, lora) {
                if !batch.admits(id) {
                    self.skip(slot, from_kv, &mut skipped);
                    continue;
                }
            }
            match self.admit(slot, from_kv, draft) {
                Admit::Admitted => {}
                Admit::Blocked => break, // it stays at the head
                Admit::Skipped => {
                    // Its encoder input does not fit this step (§4.15), or
                    // its KV cache is to be loaded first (§4.19).
                    self.skip(slot, from_kv, &mut skipped);
                    continue;
                }
            }
            if let (Some(batch), Some(id)) = (&mut loras, lora) {
                batch.add(id);
            }
        }
        // Skipped requests go back to the head of their queue, in their
        // order (Q11).
        for &slot in skipped.kv_holding.iter().rev() {
            self.kv_holding.prepend(slot, &self.requests);
        }
        for &slot in skipped.waiting.iter().rev() {
            self.waiting.prepend(slot, &self.requests);
        }
    }

    /// Whether a preempted request's earlier output is still on its way
    /// (docs/scheduling.md §5.4): it waits until that drains, unless a reset
    /// dropped it.
    fn output_in_flight(&self, slot: Slot) -> bool {
        let r = &self.requests[slot];
        r.stale_tokens > 0 && !r.drop_stale
    }

    /// Take the head of its queue out of this pass; it goes back at the end
    /// (to the queue that fits it then).
    fn skip(&mut self, slot: Slot, from_kv: bool, skipped: &mut Skipped) {
        self.defer(slot);
        self.pop_waiting(from_kv);
        if self.requests[slot].holds_kv() {
            skipped.kv_holding.push(slot);
        } else {
            skipped.waiting.push(slot);
        }
    }

    /// Take the head of one of the waiting queues.
    fn pop_waiting(&mut self, from_kv: bool) {
        let queue = if from_kv {
            &mut self.kv_holding
        } else {
            &mut self.waiting
        };
        queue.pop(&self.requests);
    }

    /// No longer count a request as skipped.
    pub(super) fn undefer(&mut self, slot: Slot) {
        let r = &mut self.requests[slot];
        if r.deferred {
            r.deferred = false;
            self.num_deferred -= 1;
        }
    }

    /// Count a request as skipped by the waiting pass (vLLM's
    /// `deferred_waiting`, reported in the stats) until it is admitted.
    pub(super) fn defer(&mut self, slot: Slot) {
        let r = &mut self.requests[slot];
        if !r.deferred {
            r.deferred = true;
            self.num_deferred += 1;
        }
    }

    /// Admit the request at the head of its queue (`from_kv`: the KV
    /// holders'), after its prefix hits; false when it cannot be admitted
    /// now (the pass ends there). A session between turns holds its KV
    /// cache: it continues from there, without a lookup.
    fn admit(&mut self, slot: Slot, from_kv: bool, draft: &mut StepDraft) -> Admit {
        let c = &self.config;
        let (chunked, gate) = (c.enable_chunked_prefill, c.scheduler_reserve_full_isl);
        // Headroom kept free for those already running (none when alone).
        let watermark = if self.running.is_empty() {
            0
        } else {
            c.watermark_blocks
        };
        let draft_slots = c.num_draft_slots;
        let budget = draft.token_budget.min(draft.input_budget - draft_slots);
        let r = &mut self.requests[slot];
        let lookup = r.seq.num_computed_tokens == 0;
        if lookup && r.resumable && self.kv.hasher().lookahead() > 0 {
            // A session's kept hashes may cover the token its turn dropped;
            // computing its KV afresh, it hashes its tokens as they are now.
            r.seq.rehash(self.kv.hasher(), self.kv.hash_block_size());
        }
        // Before the hit is found, how far the workers' routing reaches
        // caps it (auxiliary outputs, §7.12).
        let max_hit = if lookup {
            self.kv.log_event(KvEvent::Lookup { owner: slot });
            self.aux_max_cache_hit(slot)
        } else {
            None
        };
        let r = &mut self.requests[slot];
        // A request that must compute every prompt token (vLLM: it wants
        // prompt logprobs) reads no hits; its blocks are still cached.
        let reads = lookup && !r.skip_reading_prefix_cache;
        // A connector that completes divergent hybrid hits is told full
        // attention's own hit (§4.19.2).
        let per_group = if reads && self.kv_setup.divergent_hybrid_hits && self.connector.is_some()
        {
            self.kv.find_hit_per_group(&r.seq, max_hit, &mut self.hits)
        } else {
            None
        };
        let hit_tokens = match per_group {
            Some(h) => {
                // (vLLM's per-group lookup finds no shared prefix.)
                r.seq.shared_prefix_boundary = 0;
                h.tokens
            }
            None if reads => self.find_local_hit(slot, max_hit),
            None if lookup => {
                r.seq.shared_prefix_boundary = 0;
                0
            }
            None => r.seq.num_computed_tokens,
        };
        // A KV connector's tokens past the local hit (§4.19).
        let external = if lookup {
            match self.ask_connector(slot, hit_tokens) {
                Answer::NoConnector => ExternalHit::NONE,
                Answer::Later => return Admit::Skipped,
                Answer::Hit(external) => self.aux_cap_external_hit(slot, hit_tokens, external),
            }
        } else {
            ExternalHit::NONE
        };
        // No external tokens carry a lagging state to the deeper hit: the
        // hit every group agrees on is found instead.
        let hit_tokens = match per_group {
            Some(h) if h.diverged && external.num_tokens == 0 => {
                let tokens = self.find_local_hit(slot, max_hit);
                if let Some(connector) = self.connector.as_mut() {
                    connector.local_hit_reconciled(&self.requests[slot].request_id, tokens);
                }
                tokens
            }
            _ => hit_tokens,
        };
        // An encoder output it needs is still on its way (§4.20).
        if self.ec_transfer_pending(slot, (hit_tokens + external.num_tokens) as i64) {
            return Admit::Skipped;
        }
        if lookup {
            if let Some(connector) = self.connector.as_mut() {
                connector.external_hit_settled(&self.requests[slot].request_id, external);
            }
        }
        if external.load_async {
            return self.admit_loading(slot, hit_tokens, external.num_tokens, watermark);
        }
        let local_tokens = hit_tokens;
        let hit_tokens = hit_tokens + external.num_tokens;
        let c = &self.config;
        let r = &mut self.requests[slot];
        // A held step admits only requests with nothing left but their last
        // token (full hits): the pass ends at the first with prompt to compute.
        let prompt_left = hit_tokens + 1 < r.num_tokens();
        if draft.hold_prefills && prompt_left {
            return Admit::Blocked;
        }
        let mut n = r.num_tokens() - hit_tokens;
        // With speculative decoding, an admission with only its last token
        // left is padded to a whole draft step (placeholder drafts the
        // runner rejects), keeping the step's decode shape uniform; never
        // beside a running prefill chunk (§4.13).
        let k = c.num_speculative_tokens;
        let mut padded = false;
        if k > 0
            && c.drafts_by_batch_size.is_none()
            && n == 1
            && !draft.running_prefill
            && (draft.running_scheduled || hit_tokens > 0)
            // room for the padded step and the token it samples
            && hit_tokens + k + 2 <= c.max_model_len
        {
            if 1 + k > budget {
                return Admit::Blocked; // rather not schedule it than unpadded
            }
            n = 1 + k;
            padded = true;
        }
        if draft.threshold > 0 && draft.threshold < n {
            n = draft.threshold;
        }
        // An encoder-only deployment chunks regardless: vLLM exempts it.
        if !chunked && n > budget && c.runner != Runner::EncoderOnly {
            return Admit::Blocked; // without chunking, the head blocks the queue (Q6)
        }
        n = n.min(budget);
        // A prefill chunk ends where a recurrent state is cached (§7.15);
        // when none fits, the request waits at the head.
        n = self.state_aligned_split(slot, n, hit_tokens);
        if n == 0 {
            return Admit::Blocked;
        }
        if padded && n != 1 + k {
            // The cut took placeholder drafts: unpadded, not shortened.
            n = 1;
            padded = false;
        }
        // Cut before an image the encoder cannot run this step.
        let plan = self.plan_encoder_inputs(slot, hit_tokens, n, draft);
        // Nor within a multi-module drafter's read-ahead of the prompt's end.
        let n = self.reserve_prefill_lookahead(slot, hit_tokens, plan.num_tokens);
        if n == 0 {
            return Admit::Skipped;
        }
        let r = &mut self.requests[slot];
        // A session's computed tokens are in its table already.
        let new_hit_tokens = if lookup { local_tokens } else { 0 };
        let hits: &[Vec<BlockId>] = if new_hit_tokens > 0 { &self.hits } else { &[] };
        let admission = Admission {
            full_sequence_must_fit: gate,
            watermark,
            // Cross-attention slots for the encoder inputs it runs (§4.17).
            encoder_tokens: match self.encoder {
                EncoderStore::EncoderDecoder(_) => plan.num_embeds,
                EncoderStore::Shared(_) => 0,
            },
            external_tokens: external.num_tokens,
            owner: Some(slot),
            ..Admission::default()
        };
        let allocated = self.kv.allocate(
            &mut r.tables,
            &r.seq,
            n,
            new_hit_tokens,
            hits,
            admission,
            r.in_flight_tokens,
        );
        if allocated.is_none() {
            // Its references to cached encoder outputs go too.
            self.release_all_encoded(slot);
            return Admit::Blocked;
        }
        // Counted on admission only (Q15), after a lookup, and never for a
        // request that does not read the cache.
        if lookup && !r.skip_reading_prefix_cache {
            self.kv
                .record_prefix_cache_stats(r.num_tokens(), local_tokens, r.num_preemptions > 0);
        }
        draft.carried_prefill |= prompt_left;
        draft.sync_kv_loads |= external.num_tokens > 0;
        // Still prefilling after this chunk: an async load keeps room for
        // it. One whose load arrived keeps its reservation for the rest of
        // this pass even when this chunk ends its prefill (vLLM only adds
        // to its set here and drops a request when the step is built).
        if hit_tokens + n < r.num_tokens() {
            r.inflight_prefill = true;
        }
        let kind = match r.status {
            RequestStatus::Waiting => Kind::New,
            _ => Kind::Resumed,
        };
        let before = (r.seq.num_computed_tokens, r.status);
        r.status = RequestStatus::Running;
        r.seq.num_computed_tokens = hit_tokens;
        self.undefer(slot);
        self.pop_waiting(from_kv);
        self.running.push(slot);
        self.notify_after_alloc(slot, external.num_tokens, before);
        let mut entry = self.entry(slot, n, kind, hit_tokens);
        if padded {
            entry.drafts = Drafts::Placeholders(n - 1);
        }
        draft.entries.push(entry);
        draft.token_budget -= n;
        draft.input_budget -= n + draft_slots;
        draft.drafts_needed |= !self.drafts_unused(slot, hit_tokens, n);
        self.commit_encoder_plan(slot, plan, draft);
        Admit::Admitted
    }

    /// The hit every group agrees on for the request in `slot` (into the
    /// scratch hits), no further than `max_tokens` when given, with where a
    /// shared prefix ends (§7.13) and, when its request asks, the hit
    /// reported as events.
    fn find_local_hit(&mut self, slot: Slot, max_tokens: Option<usize>) -> usize {
        let r = &mut self.requests[slot];
        let hit = self.kv.find_hit(&r.seq, max_tokens, &mut self.hits);
        r.seq.shared_prefix_boundary = hit.shared_prefix_boundary;
        if r.report_hits && hit.tokens > 0 {
            // (In hash blocks: each group counts its own.)
            let num_blocks = hit.tokens / self.kv.hash_block_size();
            self.kv.log_event(KvEvent::Hit {
                owner: slot,
                num_blocks,
            });
        }
        hit.tokens
    }

    /// Admit a request whose external tokens arrive over later steps
    /// (§4.19): blocks for its `hit_tokens` hit and its `external` tokens,
    /// kept clear of what in-flight prefills still need, none of its tokens
    /// scheduled. It waits, loading, among the block holders (the caller
    /// skips it back there).
    fn admit_loading(
        &mut self,
        slot: Slot,
        hit_tokens: usize,
        external: usize,
        watermark: usize,
    ) -> Admit {
        let reserved = self.reserved_for_inflight_prefills();
        let loaded_groups = self.connector_loaded_groups(slot);
        let admission = Admission {
            full_sequence_must_fit: self.config.scheduler_reserve_full_isl,
            watermark,
            external_tokens: external,
            reserved_blocks: reserved,
            load_async: true,
            owner: Some(slot),
            loaded_groups,
            ..Admission::default()
        };
        let r = &mut self.requests[slot];
        let hits: &[Vec<BlockId>] = if hit_tokens > 0 { &self.hits } else { &[] };
        let in_flight = r.in_flight_tokens;
        let allocated = self.kv.allocate(
            &mut r.tables,
            &r.seq,
            0,
            hit_tokens,
            hits,
            admission,
            in_flight,
        );
        if allocated.is_none() {
            return Admit::Blocked;
        }
        let before = (r.seq.num_computed_tokens, r.status);
        self.notify_after_alloc(slot, external, before);
        let r = &mut self.requests[slot];
        if !r.skip_reading_prefix_cache {
            self.kv
                .record_prefix_cache_stats(r.num_tokens(), hit_tokens, r.num_preemptions > 0);
        }
        r.status = RequestStatus::WaitingForRemoteKvs;
        r.seq.num_computed_tokens = hit_tokens + external;
        r.inflight_prefill = true;
        let num_computed_tokens = hit_tokens + external;
        self.aux_request_loading(slot, num_computed_tokens);
        self.kv.log_event(KvEvent::Loading {
            owner: slot,
            num_computed_tokens,
        });
        Admit::Skipped
    }
}
