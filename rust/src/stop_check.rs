//! Stop checks after each appended token, in vLLM 0.33's order
//! (docs/scheduling.md §5.2): EOS, stop tokens, length, then (once
//! `min_tokens` are out) a repeating pattern. `min_tokens` gates none of the
//! first three (Q3): the sampler keeps EOS and stop tokens from being
//! produced too early.

use crate::request::{Repetition, Request, RequestStatus, StopReason};

/// Whether `r` stops on its last token; sets its status (and `stop_reason`
/// for a stop token or a repetition) if so.
pub fn check_stop(r: &mut Request, max_model_len: usize) -> bool {
    let last = *r.seq.tokens().last().expect("a request has tokens");
    if r.stop.eos_token_id == Some(last) {
        r.status = RequestStatus::FinishedStopped;
        return true;
    }
    if r.stop.stop_token_ids.contains(&last) {
        r.status = RequestStatus::FinishedStopped;
        r.stop_reason = Some(StopReason::Token(last));
        return true;
    }
    if r.num_tokens() >= max_model_len || r.num_output_tokens() >= r.stop.max_tokens {
        r.status = RequestStatus::FinishedLengthCapped;
        return true;
    }
    // min_tokens gates the repetition check alone (vLLM 0.33's order).
    if r.num_output_tokens() < r.stop.min_tokens {
        return false;
    }
    if let Some(rules) = &r.stop.repetition {
        let output = &r.seq.tokens()[r.seq.num_prompt_tokens()..];
        if repeats(output, rules) {
            r.status = RequestStatus::FinishedRepetition;
            r.stop_reason = Some(StopReason::Repetition);
            return true;
        }
    }
    false
}

/// Whether `output` ends in a pattern of some length in
/// `min_pattern_size..=max_pattern_size` (0 means 1) repeated `min_count`
/// times, the shortest length first; vLLM gives up at the first length
/// whose repeats would not fit.
pub fn repeats(output: &[u32], rules: &Repetition) -> bool {
    let min_len = rules.min_pattern_size.max(1);
    if rules.max_pattern_size == 0 || rules.min_count < 2 || min_len > rules.max_pattern_size {
        return false;
    }
    for len in min_len..=rules.max_pattern_size {
        if len.saturating_mul(rules.min_count) > output.len() {
            return false;
        }
        let end = output.len();
        let repeated = (1..=len)
            .all(|n| (1..rules.min_count).all(|m| output[end - (len * m + n)] == output[end - n]));
        if repeated {
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block_hash::BlockHasher;
    use crate::request::{NewRequest, StopRules};
    use crate::sequence::Sequence;

    fn request(max_tokens: usize, stop_token_ids: Vec<u32>) -> Request {
        let stop = StopRules {
            max_tokens,
            min_tokens: 5, // gates nothing here (Q3)
            eos_token_id: Some(2),
            stop_token_ids,
            repetition: None,
        };
        let seq = Sequence::new(vec![9; 4], &[], &BlockHasher::with_key([0; 32]), 4);
        let new = NewRequest {
            request_id: "r".into(),
            prompt_token_ids: vec![],
            stop,
            priority: 0,
            arrival_time: 0.0,
            cache_salt: None,
            lora: None,
            mm_inputs: Vec::new(),
            prompt_embeds_digests: None,
            skip_reading_prefix_cache: false,
            structured_output: false,
            report_hits: false,
            resumable: false,
        };
        Request::waiting(new, seq, 1)
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
            (RequestStatus::FinishedStopped, Some(StopReason::Token(7)))
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

    #[test]
    fn repetition_waits_for_min_tokens_then_stops() {
        let rules = Repetition {
            min_pattern_size: 1,
            max_pattern_size: 2,
            min_count: 3,
        };
        assert!(repeats(&[7, 8, 7, 8, 7, 8], &rules));
        assert!(!repeats(&[7, 8, 7, 8, 7], &rules));
        assert!(repeats(&[9, 9, 9], &rules));
        // A length whose repeats do not fit ends the search.
        let long = Repetition {
            min_pattern_size: 4,
            max_pattern_size: 8,
            min_count: 2,
        };
        assert!(!repeats(&[1, 2, 3, 1, 2, 3], &long));
        let mut r = request(100, vec![]);
        r.stop.repetition = Some(Box::new(rules));
        r.stop.min_tokens = 5;
        for k in 1..=5 {
            append(&mut r, 9);
            assert_eq!(check_stop(&mut r, 64), k == 5, "output {k}");
        }
        assert_eq!(
            (r.status, r.stop_reason),
            (
                RequestStatus::FinishedRepetition,
                Some(StopReason::Repetition)
            )
        );
    }
}
