//! The RUNNING pass (docs/scheduling.md §4.2): every running request, in
//! order, gets the tokens it is behind by, within the budget; when no block
//! is free for it, victims are preempted until one is, or until it is the
//! victim itself.

use super::{Scheduler, StepDraft};
use crate::kv_cache_manager::Admission;
use crate::request::Request;
use crate::scheduler_config::Policy;
use crate::slab::Slot;
use crate::spec_decode::Drafts;
use crate::step::{Kind, StepEntry};

/// What a running request's allocation came to.
enum Grant {
    /// Its tables cover the tokens (each records what it grew by).
    Granted,
    /// It was the victim itself.
    PreemptedItself,
    /// Too few blocks, and the KV connector is about to free some, or the
    /// victim's blocks are fenced by a step in flight: the pass ends
    /// without preempting.
    AwaitingFrees,
}

impl Scheduler {
    /// Schedule the running requests into `draft`.
    pub(super) fn schedule_running(&mut self, draft: &mut StepDraft) {
        // The lines of every running request that the pass reads (at 256
        // running, half the pass's time in a profile of the Azure replay was
        // the first read of each request).
        self.read_ahead(self.running.iter().copied(), Request::touch_hot_lines);
        // A drafter's own input slots (draft models, parallel drafting) come
        // out of the input budget beside each request's tokens.
        let draft_slots = self.config.num_draft_slots;
        let mut i = 0;
        while i < self.running.len() && draft.token_budget > 0 && draft.input_budget > draft_slots {
            let slot = self.running[i];
            let r = &self.requests[slot];
            // Async: its last token is in flight already. Pipeline
            // parallelism: its last decode is still a few stages away. A held
            // step skips running prefill chunks (§4.11).
            if last_token_in_flight(r)
                || self.current_step < r.next_decode_step
                || (draft.hold_prefills && r.prefill_chunk)
            {
                i += 1;
                continue;
            }
            // An encoder output it needs is still on its way (§4.20). Its
            // confirmed tokens, as vLLM counts them: below zero where a
            // failed load cut it back under the tokens in flight.
            let confirmed = r.seq.num_computed_tokens as i64 - r.num_output_placeholders as i64;
            if self.ec_transfer_pending(slot, confirmed) {
                i += 1;
                continue;
            }
            let n = self.num_running_tokens(slot, draft);
            if n == 0 {
                // Nothing to compute this step: skip it, don't end the pass
                // (Q17); later requests may still need tokens.
                i += 1;
                continue;
            }
            let computed = self.requests[slot].seq.num_computed_tokens;
            // A prefill chunk ends where a recurrent state is cached (§7.15).
            let n = self.state_aligned_split(slot, n, computed);
            if n == 0 {
                i += 1;
                continue;
            }
            // Cut before an image the encoder cannot run this step (§4.15).
            let plan = self.plan_encoder_inputs(slot, computed, n, draft);
            // Nor within a multi-module drafter's read-ahead of the prompt's end.
            let n = self.reserve_prefill_lookahead(slot, computed, plan.num_tokens);
            if n == 0 {
                i += 1;
                continue;
            }
            match self.allocate_or_preempt(slot, n, &mut i, draft) {
                Grant::Granted => {
                    self.commit_encoder_plan(slot, plan, draft);
                    draft.carried_prefill |= self.requests[slot].prefill_chunk;
                    draft.running_prefill |= self.requests[slot].prefill_chunk;
                    let mut entry = self.entry(slot, n, Kind::Running, computed);
                    entry.drafts = self.take_scheduled_drafts(slot, n);
                    draft.entries.push(entry);
                    draft.token_budget -= n;
                    draft.input_budget -= n + draft_slots;
                    // One request that verifies drafts is enough to know.
                    draft.drafts_needed =
                        draft.drafts_needed || !self.drafts_unused(slot, computed, n);
                    i += 1;
                }
                // It preempted itself. Under priority, running[i] is now the
                // next request and the pass goes on (Q10); FCFS ends it.
                Grant::PreemptedItself if self.config.policy == Policy::Priority => continue,
                Grant::PreemptedItself | Grant::AwaitingFrees => break,
            }
        }
    }

    /// Tokens the running request in `slot` gets this step; 0 to skip it.
    fn num_running_tokens(&self, slot: Slot, draft: &StepDraft) -> usize {
        let r = &self.requests[slot];
        let computed = r.seq.num_computed_tokens;
        let placeholders = r.num_output_placeholders;
        // Its drafts count against the budget and max_model_len (§4.13).
        // Saturating: a second synchronous step scheduled before the first's
        // output finds its drafts' positions computed already (nothing to do).
        let mut n = (r.num_tokens() + r.drafts.len() + placeholders).saturating_sub(computed);
        if draft.threshold > 0 && draft.threshold < n {
            n = draft.threshold;
        }
        // A generating request never computes the last position of
        // max_model_len (nothing would sample after it); a pooled one may.
        let sampled = self.config.runner.sampled_tokens_per_step();
        let room = (self.config.max_model_len - sampled).saturating_sub(computed);
        let input_room = draft.input_budget - self.config.num_draft_slots;
        n.min(draft.token_budget).min(input_room).min(room)
    }

    /// The drafts among the `n` tokens scheduled for the running request in
    /// `slot` (a prefix of its drafts when the budget or max_model_len cut
    /// the step short); its drafts are used up either way.
    fn take_scheduled_drafts(&mut self, slot: Slot, n: usize) -> Drafts {
        let r = &mut self.requests[slot];
        if r.drafts.is_empty() {
            return Drafts::None;
        }
        let drafts = std::mem::take(&mut r.drafts);
        let known = r.num_tokens() + r.num_output_placeholders;
        let scheduled = (r.seq.num_computed_tokens + n).saturating_sub(known);
        if scheduled == 0 {
            Drafts::None
        } else {
            drafts.first(scheduled)
        }
    }

    /// Blocks for `n` more tokens of the running request in `slot`
    /// (`running[*cursor]`). While too few are free, a victim is preempted;
    /// the cursor and the budget follow what that removes. Returns how many
    /// blocks the table grew by, or why it got none.
    fn allocate_or_preempt(
        &mut self,
        slot: Slot,
        n: usize,
        cursor: &mut usize,
        draft: &mut StepDraft,
    ) -> Grant {
        loop {
            let r = &mut self.requests[slot];
            let admission = Admission {
                owner: Some(slot),
                ..Admission::default()
            };
            let in_flight = r.in_flight_tokens;
            if self
                .kv
                .allocate(&mut r.tables, &r.seq, n, 0, &[], admission, in_flight)
                .is_some()
            {
                return Grant::Granted;
            }
            // A KV connector is about to free blocks: wait for them rather
            // than preempt (§4.19).
            if self.connector_frees_pending() {
                return Grant::AwaitingFrees;
            }
            // A victim a step in flight may still write cannot give its
            // blocks back yet: the pass ends as if none were to be had.
            if !self.blocks_can_be_freed(self.victim(slot)) {
                return Grant::AwaitingFrees;
            }
            let victim = self.take_victim(slot, cursor, draft);
            self.preempt(victim, self.kv_setup.requires_kv_delivery);
            draft.preempted_any = true;
            if victim == slot {
                return Grant::PreemptedItself;
            }
        }
    }

    /// A step entry for the request in `slot`: `n` tokens after `computed`
    /// (its tables record the blocks they grew by).
    #[inline] // once per scheduled request: out of line, ~50 instructions each
    pub(super) fn entry(&self, slot: Slot, n: usize, kind: Kind, computed: usize) -> StepEntry {
        let r = &self.requests[slot];
        StepEntry {
            slot,
            generation: self.requests.generation(slot),
            num_tokens: n,
            kind,
            num_computed_tokens: computed,
            samples: computed + n >= r.num_tokens(),
            num_output_tokens: 0, // written as the step ends
            drafts: Drafts::None,
        }
    }
}

/// Async: the token in flight is the request's last one (max_tokens), so
/// another step could only compute a position nobody samples.
fn last_token_in_flight(r: &Request) -> bool {
    let placeholders = r.num_output_placeholders;
    placeholders > 0
        && r.seq.num_computed_tokens + 2
            >= placeholders + r.seq.num_prompt_tokens() + r.stop.max_tokens
}
