//! Which encoder inputs a step runs (docs/scheduling.md §4.15; vLLM's
//! `_try_schedule_encoder_inputs`): an image's embeddings must be in the
//! encoder cache before the step that computes any of its placeholder
//! tokens, and the encoder runs an image whole (its attention is
//! bidirectional). So a request's tokens this step are cut just before the
//! first image that does not fit the step's encoder budget or the cache;
//! with `disable_chunked_mm_input`, also before an image the step would
//! only partly cover. An encoder-decoder model (§4.17) runs its encoder
//! input once, in the step that computes its first decoder token.

use super::ec_transfer::{has_cache_item, notify_allocated};
use super::{EncoderStore, Scheduler, StepDraft};
use crate::ec_connector::EcConnector;
use crate::encoder_decoder_cache::EncoderDecoderCache;
use crate::multimodal::{inputs_in_window, MultimodalInput};
use crate::request::Request;
use crate::slab::Slot;
use smallvec::SmallVec;

/// The encoder's share of one request's step.
#[derive(Debug, Default)]
pub(super) struct EncoderPlan {
    /// Inputs the encoder runs for it (vLLM's `scheduled_encoder_inputs`).
    pub scheduled: SmallVec<[u32; 2]>,
    /// Inputs an encoder-cache connector supplies (§4.20): they take cache
    /// space, not encoder budget.
    pub external: SmallVec<[u32; 2]>,
    /// Inputs whose identifier an earlier input of this step runs or loads
    /// already: they reference that entry.
    pub duplicates: SmallVec<[u32; 2]>,
    /// Its tokens, after the cuts.
    pub num_tokens: usize,
    /// Embeddings the scheduled inputs take from the step's budget.
    pub num_embeds: usize,
    /// Embeddings the connector's inputs take in the cache.
    pub num_external_embeds: usize,
    /// The step's encoder budget when planned: committing sets the budget
    /// to it less `num_embeds` (vLLM's `new_encoder_compute_budget`), so a
    /// refund from a victim preempted meanwhile is lost, as in vLLM.
    pub budget_at_plan: usize,
}

/// A request's encoder inputs run this step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScheduledEncoderInputs {
    pub slot: Slot,
    /// Indices into its inputs, ascending.
    pub input_ids: Vec<u32>,
}

impl Scheduler {
    /// Plan the encoder inputs of `n` tokens after `computed` for the
    /// request in `slot`. Inputs the cache holds already are referenced
    /// now, and entries evicted to make room are gone, whether or not the
    /// request is scheduled (as in vLLM). An identifier the cache holds with
    /// another number of embeddings (a client reusing an id for other
    /// content) schedules nothing and ends the request with an error.
    pub(super) fn plan_encoder_inputs(
        &mut self,
        slot: Slot,
        computed: usize,
        n: usize,
        draft: &mut StepDraft,
    ) -> EncoderPlan {
        let mut plan = EncoderPlan {
            num_tokens: n,
            budget_at_plan: draft.encoder_budget,
            ..Default::default()
        };
        let inputs = &self.requests[slot].mm_inputs;
        let Some(encoder) = &self.config.encoder else {
            return plan;
        };
        if n == 0 || inputs.is_empty() {
            return plan;
        }
        let shift = self.config.drafter_read_ahead;
        let window_end = computed + n + shift;
        let mut budget = draft.encoder_budget;
        let connector = &mut self.ec_connector;
        let cache = match &mut self.encoder {
            EncoderStore::Shared(cache) => cache,
            EncoderStore::EncoderDecoder(cache) => {
                plan_cross_inputs(cache, inputs, computed, window_end, budget, &mut plan);
                return plan;
            }
        };
        for i in inputs_in_window(inputs, computed, window_end) {
            let m = &inputs[i];
            let num_embeds = m.num_embeds();
            if encoder.disable_chunked_mm_input
                && computed <= m.offset
                && computed + plan.num_tokens < m.end()
            {
                // Not split: stop before it (and before the drafter's read
                // of its first placeholder).
                plan.num_tokens = m.offset.saturating_sub(computed + shift);
                break;
            }
            let earlier = plan
                .scheduled
                .iter()
                .chain(&plan.external)
                .find(|&&j| inputs[j as usize].identifier == m.identifier);
            if let Some(&j) = earlier {
                if inputs[j as usize].num_embeds() != num_embeds {
                    return mismatch(slot, draft);
                }
                plan.duplicates.push(i as u32);
                continue;
            }
            if let Some(cached) = cache.cached_num_embeds(&m.identifier) {
                if cached != num_embeds {
                    return mismatch(slot, draft);
                }
            }
            if cache.reference_cached(slot, inputs, i as u32) {
                continue;
            }
            let num_to_schedule = plan.num_embeds + plan.num_external_embeds;
            if !cache.make_room(num_embeds, budget, num_to_schedule) {
                // Its tokens wait for a step with room; a prefix hit past
                // its start leaves nothing to schedule before it.
                plan.num_tokens = if computed < m.offset {
                    plan.num_tokens.min(m.offset - computed)
                } else {
                    0
                };
                break;
            }
            let start = computed.saturating_sub(m.offset);
            let end = m.length.min(window_end - m.offset);
            if m.embeds_in(start, end).is_empty() {
                continue; // the step covers none of its embeddings
            }
            if has_cache_item(connector, m) {
                plan.num_external_embeds += num_embeds;
                plan.external.push(i as u32);
                continue;
            }
            plan.num_embeds += num_embeds;
            budget -= num_embeds;
            plan.scheduled.push(i as u32);
        }
        plan
    }

    /// Take cache space for a scheduled request's planned inputs and its
    /// budget from the step's.
    pub(super) fn commit_encoder_plan(
        &mut self,
        slot: Slot,
        plan: EncoderPlan,
        draft: &mut StepDraft,
    ) {
        if plan.scheduled.is_empty() && plan.external.is_empty() && plan.duplicates.is_empty() {
            return;
        }
        let r = &self.requests[slot];
        let inputs = &r.mm_inputs;
        match &mut self.encoder {
            EncoderStore::Shared(cache) => {
                // Those the encoder runs, then those the connector loads,
                // each told to the connector (vLLM's order).
                for &id in plan.scheduled.iter().chain(&plan.external) {
                    cache.allocate(slot, inputs, id);
                }
                notify_allocated(&mut self.ec_connector, &r.request_id, &plan.scheduled);
                notify_allocated(&mut self.ec_connector, &r.request_id, &plan.external);
                for &id in &plan.duplicates {
                    cache.reference_cached(slot, inputs, id);
                }
            }
            EncoderStore::EncoderDecoder(cache) => {
                for &id in &plan.scheduled {
                    cache.allocate(&inputs[id as usize]);
                }
            }
        }
        if !plan.scheduled.is_empty() {
            draft.encoder_budget = plan.budget_at_plan - plan.num_embeds;
            draft.encoder_inputs.push(ScheduledEncoderInputs {
                slot,
                input_ids: plan.scheduled.to_vec(),
            });
        }
    }

    /// A victim scheduled earlier this step gives its encoder inputs' share
    /// of the budget back (the cache space stays taken until it frees).
    pub(super) fn refund_encoder_inputs(&mut self, victim: Slot, draft: &mut StepDraft) {
        let Some(k) = draft.encoder_inputs.iter().position(|s| s.slot == victim) else {
            return;
        };
        let taken = draft.encoder_inputs.remove(k);
        let inputs = &self.requests[victim].mm_inputs;
        let refund: usize = taken
            .input_ids
            .iter()
            .map(|&id| inputs[id as usize].num_embeds())
            .sum();
        draft.encoder_budget += refund;
    }

    /// Drop every encoder-cache reference of the request in `slot`.
    pub(super) fn release_all_encoded(&mut self, slot: Slot) {
        let inputs = &self.requests[slot].mm_inputs;
        if !inputs.is_empty() {
            self.encoder.release_all(slot, inputs);
        }
    }
}

/// A cached identifier with another embedding count: nothing this step,
/// and the caller ends the request (vLLM's `encoder_cache_mismatch_reqs`).
fn mismatch(slot: Slot, draft: &mut StepDraft) -> EncoderPlan {
    if !draft.encoder_mismatch.contains(&slot) {
        draft.encoder_mismatch.push(slot);
    }
    EncoderPlan::default()
}

/// An encoder-decoder's plan (§4.17): every input is the encoder's, at
/// position 0, run before the decoder's first token and never again once
/// any token is computed; it is not shared by identifier and no rule keeps
/// it whole in a chunk (each input is whole or waits).
fn plan_cross_inputs(
    cache: &EncoderDecoderCache,
    inputs: &[MultimodalInput],
    computed: usize,
    window_end: usize,
    mut budget: usize,
    plan: &mut EncoderPlan,
) {
    if computed > 0 {
        return; // its cross-attention KV is written already
    }
    let hi = inputs.partition_point(|m| m.offset < window_end);
    for (i, m) in inputs[..hi].iter().enumerate() {
        let num_embeds = m.num_embeds();
        if !cache.can_allocate(num_embeds, budget, plan.num_embeds) {
            // It sits at 0: no decoder token comes before it this step.
            plan.num_tokens = 0;
            return;
        }
        let end = m.length.min(window_end - m.offset);
        if m.embeds_in(0, end).is_empty() {
            continue;
        }
        plan.num_embeds += num_embeds;
        budget -= num_embeds;
        plan.scheduled.push(i as u32);
    }
}

/// After a step ran: release the inputs of request `r` (in `slot`) whose
/// placeholders are all computed: in its KV cache now, and past any draft
/// that a rejection could roll back into (vLLM's `_free_encoder_inputs`).
/// An encoder-decoder's are released whenever it has a computed token,
/// every step again (vLLM's arithmetic, §4.17).
pub(super) fn release_encoded(
    store: &mut EncoderStore,
    connector: &mut Option<Box<dyn EcConnector>>,
    slot: Slot,
    r: &Request,
) {
    if r.mm_inputs.is_empty() {
        return;
    }
    let cache = match store {
        EncoderStore::Shared(cache) => cache,
        EncoderStore::EncoderDecoder(cache) => {
            if r.seq.num_computed_tokens > 0 {
                cache.release_all(&r.mm_inputs);
            }
            return;
        }
    };
    let done = r
        .seq
        .num_computed_tokens
        .saturating_sub(r.num_output_placeholders);
    let held: SmallVec<[u32; 4]> = cache.held(slot).into();
    for id in held {
        if r.mm_inputs[id as usize].end() <= done {
            cache.release(slot, &r.mm_inputs, id);
            if let Some(connector) = connector.as_mut() {
                connector.update_state_after_free(&r.request_id, id);
            }
        }
    }
}
