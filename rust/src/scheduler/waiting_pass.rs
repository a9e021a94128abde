//! The WAITING pass (docs/scheduling.md §4.5): admit waiting requests from
//! the head of the queue while the budget, `max_num_seqs` and the KV cache
//! allow, each with its longest cached prefix.

use super::{Scheduler, StepDraft};
use crate::grammar::Reached;
use crate::kv_events::KvEvent;
use crate::request::RequestStatus;
use crate::slab::Slot;
use crate::step::Kind;

impl Scheduler {
    /// Admit waiting requests into `draft` (only when nobody was preempted
    /// this step and admissions are not paused).
    pub(super) fn schedule_waiting(&mut self, draft: &mut StepDraft) {
        let mut skipped: Vec<Slot> = Vec::new();
        while draft.token_budget > 0
            && draft.input_budget > 0
            && self.running.len() < self.config.max_num_active_seqs
        {
            let Some(slot) = self.waiting.peek() else {
                break;
            };
            // Held for its grammar (§4.10); the compile result counts now.
            if let Some(grammar) = self.requests[slot].grammar.as_mut() {
                match grammar.reach() {
                    Reached::Held => {
                        self.skip(slot, &mut skipped);
                        continue;
                    }
                    Reached::Failed => {
                        draft.grammar_failed.push(slot);
                        self.skip(slot, &mut skipped);
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
                self.skip(slot, &mut skipped);
                continue;
            }
            if !self.admit(slot, draft) {
                break; // it stays at the head
            }
        }
        // Skipped requests go back to the head, in their order (Q11).
        for &slot in skipped.iter().rev() {
            self.waiting.prepend(slot, &self.requests[slot]);
        }
    }

    /// Whether a preempted request's earlier output is still on its way
    /// (docs/scheduling.md §5.4): it waits until that drains, unless a reset
    /// dropped it.
    fn output_in_flight(&self, slot: Slot) -> bool {
        let r = &self.requests[slot];
        r.stale_tokens > 0 && !r.drop_stale
    }

    /// Take the head out of this pass; it goes back at the end.
    fn skip(&mut self, slot: Slot, skipped: &mut Vec<Slot>) {
        self.defer(slot);
        self.waiting.pop();
        skipped.push(slot);
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

    /// Admit the request at the head of the queue, after its prefix hits;
    /// false when it cannot be admitted now (the pass ends there).
    fn admit(&mut self, slot: Slot, draft: &mut StepDraft) -> bool {
        let c = &self.config;
        let (chunked, gate) = (c.enable_chunked_prefill, c.scheduler_reserve_full_isl);
        // Headroom kept free for those already running (none when alone).
        let watermark = if self.running.is_empty() {
            0
        } else {
            c.watermark_blocks
        };
        let budget = draft.token_budget.min(draft.input_budget);
        let r = &mut self.requests[slot];
        self.hits.clear();
        // A request that must compute every prompt token (vLLM: it wants
        // prompt logprobs) reads no hits; its blocks are still cached.
        let hit_tokens = if r.skip_reading_prefix_cache {
            0
        } else {
            self.kv.get_computed_blocks(&r.seq, &mut self.hits)
        };
        if r.report_hits && hit_tokens > 0 {
            let num_blocks = self.hits.len();
            self.kv.log_event(KvEvent::Hit {
                owner: slot,
                num_blocks,
            });
        }
        // A held step admits only requests with nothing left but their last
        // token (full hits): the pass ends at the first with prompt to compute.
        let prompt_left = hit_tokens + 1 < r.num_tokens();
        if draft.hold_prefills && prompt_left {
            return false;
        }
        let mut n = r.num_tokens() - hit_tokens;
        if draft.threshold > 0 && draft.threshold < n {
            n = draft.threshold;
        }
        if !chunked && n > budget {
            return false; // without chunking, the head blocks the queue (Q6)
        }
        n = n.min(budget);
        let Some(grown) = self.kv.allocate(
            &mut r.table,
            &r.seq,
            n,
            hit_tokens,
            &self.hits,
            gate,
            watermark,
        ) else {
            return false;
        };
        // Counted on admission only (Q15), and never for a request that
        // does not read the cache.
        if !r.skip_reading_prefix_cache {
            self.kv
                .record_prefix_cache_stats(r.num_tokens(), hit_tokens, r.num_preemptions > 0);
        }
        draft.carried_prefill |= prompt_left;
        let kind = match r.status {
            RequestStatus::Waiting => Kind::New,
            _ => Kind::Resumed,
        };
        r.status = RequestStatus::Running;
        r.seq.num_computed_tokens = hit_tokens;
        if r.deferred {
            r.deferred = false;
            self.num_deferred -= 1;
        }
        // Its new blocks were cached by the allocation, after the hits.
        let first = self.hits.len();
        self.log_stored(slot, first);
        self.waiting.pop();
        self.running.push(slot);
        let entry = self.entry(slot, n, kind, hit_tokens, grown);
        draft.entries.push(entry);
        draft.token_budget -= n;
        draft.input_budget -= n;
        true
    }
}
