//! Streaming-input sessions at the scheduler (docs/scheduling.md §4.12):
//! chunks arriving under a live session's id, the end of a turn, and a
//! session continuing with its next chunk.

use super::Scheduler;
use crate::error::Error;
use crate::multimodal::check_inputs;
use crate::request::{check_turn, NewRequest, RequestStatus};
use crate::session::SessionUpdate;
use crate::slab::Slot;
use crate::spec_decode::Drafts;

impl Scheduler {
    /// `new` arrived under the id of the live request in `slot`: the next
    /// chunk of a session (or, when not resumable itself, the end of its
    /// input). Applied at once to a session waiting for input, queued
    /// otherwise; the end of input ends a waiting session as aborted, as
    /// vLLM does. Refused (nothing changed) for a request that was not added
    /// as a session, and for a chunk whose limits are wrong or that has no
    /// token.
    pub(super) fn add_session_chunk(&mut self, slot: Slot, new: NewRequest) -> Result<(), Error> {
        let id = &new.request_id;
        if self.requests[slot].session.is_none() {
            return Err(Error::DuplicateRequest(id.clone()));
        }
        check_turn(&new)?;
        if new.prompt_embeds_digests.is_some() {
            // vLLM refuses prompt embeddings in a session too.
            return Err(Error::invalid(format!(
                "prompt_embeds_digests of session {id:?}'s next chunk: a streaming session \
                 with prompt embeddings is not supported"
            )));
        }
        if !new.mm_inputs.is_empty() {
            if self.config.encoder.is_none() {
                return Err(Error::invalid(format!(
                    "mm_features of session {id:?}'s next chunk: this scheduler has no \
                     encoder (a text model); configure its encoder budget and cache size"
                )));
            }
            check_inputs(
                id,
                &new.mm_inputs,
                self.input_placement(new.prompt_token_ids.len()),
            )?;
        }
        // vLLM asserts later when a turn would have nothing to compute.
        if new.resumable && new.prompt_token_ids.is_empty() {
            return Err(Error::invalid(format!(
                "prompt_token_ids of session {id:?}'s next chunk must not be empty"
            )));
        }
        let update = new.resumable.then_some(SessionUpdate {
            prompt_token_ids: new.prompt_token_ids,
            mm_inputs: new.mm_inputs,
            stop: new.stop,
            arrival_time: new.arrival_time,
        });
        let r = &mut self.requests[slot];
        if r.status != RequestStatus::WaitingForStreamingReq {
            r.session.get_or_insert_default().push_back(update);
        } else if let Some(update) = update {
            if !self.fits(slot, &update) {
                return Err(Error::invalid(format!(
                    "prompt_token_ids of session {id:?}'s next chunk ({} tokens) would take it \
                     to max_model_len ({}) or beyond",
                    update.prompt_token_ids.len(),
                    self.config.max_model_len
                )));
            }
            self.continue_session(slot, update); // it stays where it waits
        } else {
            self.finish_requests(&[new.request_id], RequestStatus::FinishedAborted);
        }
        Ok(())
    }

    /// A turn of the request in `slot` stopped: whether it goes on as a
    /// streaming session (vLLM's `_handle_stopped_request`). A session drops
    /// its turn's work in flight and keeps what it computed; it takes its
    /// next chunk if one is queued (the end of input finishes it), or waits
    /// for one.
    pub(super) fn end_turn(&mut self, slot: Slot) -> bool {
        let r = &mut self.requests[slot];
        if !r.resumable {
            return false;
        }
        r.seq.num_computed_tokens -= r.num_output_placeholders.min(r.seq.num_computed_tokens);
        r.drop_stale = true;
        r.stale_tokens = r.in_flight_tokens;
        r.num_output_placeholders = 0;
        r.drafts = Drafts::None;
        match r.session.as_mut().and_then(|q| q.pop_front()) {
            Some(None) => false, // the input ended: finished with this turn
            // A chunk that would not fit max_model_len ends it too (vLLM would
            // schedule positions it has no room for).
            Some(Some(update)) => {
                let fits = self.fits(slot, &update);
                if fits {
                    self.continue_session(slot, update);
                }
                fits
            }
            None => {
                r.status = RequestStatus::WaitingForStreamingReq;
                self.num_waiting_for_input += 1;
                true
            }
        }
    }

    /// Whether the session in `slot` continued with `update` stays shorter
    /// than `max_model_len`, as every prompt must.
    fn fits(&self, slot: Slot, update: &SessionUpdate) -> bool {
        let keep = self.requests[slot].num_tokens() - 1;
        keep + update.prompt_token_ids.len() < self.config.max_model_len
    }

    /// Continue the session in `slot` with its next chunk (vLLM's
    /// `_update_request_as_session`): everything but its last sampled token
    /// becomes prompt, the chunk is appended, and the chunk's rules and
    /// arrival time replace the turn's. It waits again, wherever it waits.
    fn continue_session(&mut self, slot: Slot, update: SessionUpdate) {
        let (hasher, block_size) = (self.kv.hasher(), self.kv.hash_block_size());
        let r = &mut self.requests[slot];
        let keep = r.num_tokens() - 1;
        let mut inputs = update.mm_inputs;
        for m in &mut inputs {
            m.offset += keep; // vLLM's base: the session's tokens, all prompt now
        }
        r.seq
            .continue_session(keep, &update.prompt_token_ids, &inputs, hasher, block_size);
        if !inputs.is_empty() {
            // After the earlier chunks' images: their indices stay theirs.
            let mut all = std::mem::take(&mut r.mm_inputs).into_vec();
            all.extend(inputs);
            r.mm_inputs = all.into_boxed_slice();
        }
        debug_assert!(r.num_cached_blocks() <= r.seq.block_hashes().len());
        r.stop = update.stop;
        // In place, as vLLM does, even while it sits in a priority heap.
        r.arrival_time = update.arrival_time + 0.0;
        if r.status == RequestStatus::WaitingForStreamingReq {
            self.num_waiting_for_input -= 1;
        }
        r.status = RequestStatus::Waiting;
    }
}
