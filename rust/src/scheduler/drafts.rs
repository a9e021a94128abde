//! Draft tokens in (docs/scheduling.md §4.13): after each synchronous
//! step's output, the model runner's proposer hands over the drafts each
//! request should verify in its next step (vLLM's `update_draft_token_ids`).

use super::Scheduler;
use crate::error::Error;
use crate::slab::Slot;
use crate::spec_decode::{Drafts, DRAFT_PADDING};

impl Scheduler {
    /// Whether drafts proposed after this step for the request in `slot`,
    /// scheduled for `n` tokens after `computed`, are sure to go unverified:
    /// the step is a prefill chunk short of the prompt's end (it samples
    /// nothing), or the token it samples is the request's last by
    /// `max_tokens` even if every draft is rejected (async: the token in
    /// flight counts too). Stop tokens cannot be foreseen, so they do not
    /// count (vLLM's `_drafts_unused`).
    pub(super) fn drafts_unused(&self, slot: Slot, computed: usize, n: usize) -> bool {
        let r = &self.requests[slot];
        if computed + n < r.num_tokens() {
            return true;
        }
        let in_flight = usize::from(r.num_output_placeholders > 0);
        r.num_output_tokens() + 1 + in_flight >= r.stop.max_tokens
    }

    /// Give request `request_ids[i]` the drafts
    /// `tokens[offsets[i]..offsets[i + 1]]`, replacing any it had. Ids of
    /// requests that finished meanwhile are skipped, and a request whose
    /// last step was a prefill chunk gets none (its drafts would follow
    /// tokens it has not computed). A token is an id or `DRAFT_PADDING`
    /// (kept as a draft, as vLLM keeps it). Checked first: an `Err` changes
    /// nothing.
    pub fn update_draft_token_ids<S: AsRef<str>>(
        &mut self,
        request_ids: &[S],
        tokens: &[i64],
        offsets: &[usize],
    ) -> Result<(), Error> {
        let k = self.config.num_speculative_tokens;
        let n = request_ids.len();
        if let Some(i) = tokens
            .iter()
            .position(|&t| t != DRAFT_PADDING && !(0..=i64::from(u32::MAX)).contains(&t))
        {
            return Err(Error::invalid(format!(
                "draft_token_ids: token {} (at {i}) is neither a token id in [0, {}] nor \
                 {DRAFT_PADDING}, the padding of an empty draft slot",
                tokens[i],
                u32::MAX
            )));
        }
        if offsets.len() != n + 1 || offsets[0] != 0 || offsets[n] != tokens.len() {
            return Err(Error::invalid(format!(
                "draft_token_ids: offsets must rise from 0 to {} over {} requests",
                tokens.len(),
                n
            )));
        }
        for (i, w) in offsets.windows(2).enumerate() {
            if w[0] > w[1] {
                return Err(Error::invalid("draft_token_ids: offsets must rise"));
            }
            if w[1] - w[0] > k {
                return Err(Error::invalid(format!(
                    "draft_token_ids: request {:?} got {} drafts, more than \
                     num_speculative_tokens={k}",
                    request_ids[i].as_ref(),
                    w[1] - w[0]
                )));
            }
        }
        for (i, id) in request_ids.iter().enumerate() {
            let Some(&slot) = self.ids.get(id.as_ref()) else {
                continue; // finished (or aborted) since
            };
            let r = &mut self.requests[slot];
            r.drafts = if r.prefill_chunk || offsets[i] == offsets[i + 1] {
                Drafts::None
            } else {
                Drafts::Tokens(tokens[offsets[i]..offsets[i + 1]].to_vec())
            };
        }
        Ok(())
    }
}
