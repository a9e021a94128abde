//! Stop checks after each appended token, in vLLM 0.33's order
//! (docs/scheduling.md §5.2).
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block_hash::BlockHasher;
    use crate::request::StopRules;
    use crate::sequence::Sequence;

    fn request(max_tokens: usize, stop_token_ids: Vec<u32>) -> Request {
        let stop = StopRules {
            max_tokens,
            min_tokens: 5, // gates nothing here (Q3)
            eos_token_id: Some(2),
            stop_token_ids,
        };
        let seq = Sequence::new(vec![9; 4], None, &BlockHasher::with_key([0; 32]), 4);
        Request::waiting("r".into(), stop, 0, 0.0, seq)
    }

    fn append(r: &mut Request, t: u32) {
        r.seq.append(&[t], &BlockHasher::with_key([0; 32]), 4);
    }

    #[test]
    fn eos_then_stop_tokens_then_length_in_vllm_order() {
        // EOS as the last allowed token is a stop, not a length cap (Q4).
        let mut r = request(1, vec![]);
        append(&mut r, 2);
        assert!(check_stop(&mut r, 64));
        assert_eq!(
            (r.status, r.stop_reason),
            (RequestStatus::FinishedStopped, None)
        );

        let mut r = request(3, vec![7]);
        append(&mut r, 7); // a stop token, before min_tokens
        assert!(check_stop(&mut r, 64));
        assert_eq!(
            (r.status, r.stop_reason),
            (RequestStatus::FinishedStopped, Some(7))
        );

        let mut r = request(2, vec![]);
        append(&mut r, 3);
        assert!(!check_stop(&mut r, 64));
        append(&mut r, 3);
        assert!(check_stop(&mut r, 64));
        assert_eq!(r.status, RequestStatus::FinishedLengthCapped);

        let mut r = request(100, vec![]);
        append(&mut r, 3); // 5 tokens = max_model_len
        assert!(check_stop(&mut r, 5));
        assert_eq!(r.status, RequestStatus::FinishedLengthCapped);
    }
}
