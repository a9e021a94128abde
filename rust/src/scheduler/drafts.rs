//! Draft tokens in (docs/scheduling.md §4.13): after each synchronous
//! step's output, the model runner's proposer hands over the drafts each
//! request should verify in its next step (vLLM's `update_draft_token_ids`).

use super::Scheduler;
use crate::error::Error;
use crate::spec_decode::Drafts;

impl Scheduler {
    /// Give request `request_ids[i]` the drafts
    /// `tokens[offsets[i]..offsets[i + 1]]`, replacing any it had. Ids of
    /// requests that finished meanwhile are skipped, and a request whose
    /// last step was a prefill chunk gets none (its drafts would follow
    /// tokens it has not computed). Checked first: an `Err` changes nothing.
    pub fn update_draft_token_ids<S: AsRef<str>>(
        &mut self,
        request_ids: &[S],
        tokens: &[u32],
        offsets: &[usize],
    ) -> Result<(), Error> {
        let k = self.config.num_speculative_tokens;
        let n = request_ids.len();
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
