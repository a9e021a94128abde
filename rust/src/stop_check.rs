//! Stop checks after each appended token, in vLLM 0.33's order (spec §5.2).
//! `min_tokens` gates none of them (Q3): the sampler keeps EOS and stop
//! tokens from being produced too early.

use crate::request::{Request, RequestStatus};

/// Whether `r` stops on its last token; sets its status (and `stop_reason`
/// for a stop token) if so.
pub fn check_stop(r: &mut Request, max_model_len: usize) -> bool {
    let last = *r.seq.tokens().last().expect("a request has tokens");
    if r.stop.eos_token_id == Some(last) {
        r.status = RequestStatus::FinishedStopped;
        return true;
    }
    if r.stop.stop_token_ids.contains(&last) {
        r.status = RequestStatus::FinishedStopped;
        r.stop_reason = Some(last);
        return true;
    }
    if r.num_tokens() >= max_model_len || r.num_output_tokens() >= r.stop.max_tokens {
        r.status = RequestStatus::FinishedLengthCapped;
        return true;
    }
    false
}
