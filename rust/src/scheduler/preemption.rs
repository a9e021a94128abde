//! Who is preempted and what preemption does (docs/scheduling.md §4.3,
//! §4.4): recompute-style, the victim's blocks freed and its tokens computed
//! again when it is admitted again.

use super::{Scheduler, StepDraft};
use crate::request::RequestStatus;
use crate::scheduler_config::Policy;
use crate::slab::Slot;
use crate::spec_decode::Drafts;

impl Scheduler {
    /// Remove the victim from `running` and return it. FCFS: the last
    /// running request. Priority: the largest `(priority, arrival_time)`,
    /// the earliest in `running` on ties (Q9); if it was already scheduled
    /// this step, its entry is undone and its tokens go back to the budget.
    /// `cursor` (the running pass's position) follows the removal.
    pub(super) fn take_victim(
        &mut self,
        current: Slot,
        cursor: &mut usize,
        draft: &mut StepDraft,
    ) -> Slot {
        if self.config.policy == Policy::Fcfs {
            // Never scheduled already: the pass walks forward to it.
            return self.running.pop().expect("the current request is running");
        }
        let v = self.victim_index();
        let victim = self.running.remove(v);
        if v < *cursor {
            *cursor -= 1;
        }
        if victim != current {
            if let Some(e) = draft.entries.iter().position(|e| e.slot == victim) {
                let refund = draft.entries.remove(e).num_tokens;
                draft.token_budget += refund;
                draft.input_budget += refund + self.config.num_draft_slots;
                self.refund_encoder_inputs(victim, draft);
            }
        }
        victim
    }

    /// The victim [`Self::take_victim`] would take while `current` asks
    /// for blocks, left in `running`.
    pub(super) fn victim(&self, current: Slot) -> Slot {
        match self.config.policy {
            Policy::Fcfs => *self.running.last().unwrap_or(&current),
            Policy::Priority => self.running[self.victim_index()],
        }
    }

    /// Priority's victim: the index in `running` of the largest
    /// `(priority, arrival_time)`, the earliest on ties.
    fn victim_index(&self) -> usize {
        let mut v = 0;
        for (k, &slot) in self.running.iter().enumerate() {
            let (cand, best) = (&self.requests[slot], &self.requests[self.running[v]]);
            let greater = cand.priority > best.priority
                || (cand.priority == best.priority && cand.arrival_time > best.arrival_time);
            if greater {
                v = k;
            }
        }
        v
    }

    /// Preempt a request that already left `running`: free its blocks,
    /// forget what it computed, and put it at the head of the waiting queue.
    /// Its output in flight becomes stale (docs/scheduling.md §5.4): still
    /// delivered, but it keeps the request waiting until it drains;
    /// `drop_stale` (a reset) discards that share instead.
    pub(super) fn preempt(&mut self, slot: Slot, drop_stale: bool) {
        self.log_released(slot);
        self.release_all_encoded(slot);
        self.free_blocks_of(slot);
        let r = &mut self.requests[slot];
        r.status = RequestStatus::Preempted;
        r.seq.num_computed_tokens = 0;
        r.num_preemptions += 1;
        r.inflight_prefill = false;
        // A dropped share not yet drained stays dropped through this one.
        r.drop_stale = drop_stale || (r.drop_stale && r.stale_tokens > 0);
        r.stale_tokens = r.in_flight_tokens;
        r.num_output_placeholders = 0;
        r.drafts = Drafts::None;
        if !self.preempted_ids.contains(&r.request_id) {
            self.preempted_ids.push(r.request_id.clone());
        }
        self.waiting.prepend(slot, &self.requests);
        self.num_preempted += 1;
    }
}
