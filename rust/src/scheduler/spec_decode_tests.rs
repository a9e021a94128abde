//! Speculative decoding scenarios (docs/scheduling.md §4.13, §5.7): drafts
//! scheduled, rejected ones rolled back, padding, the max_model_len cut.

use super::tests::{add, sampled, scheduler, Setup};
use super::Scheduler;
use crate::spec_decode::Drafts;

fn speculating(k: usize) -> Scheduler {
    scheduler(Setup {
        num_speculative_tokens: k,
        ..Setup::default()
    })
}

#[test]
fn drafts_are_scheduled_and_rejected_ones_rolled_back() {
    let mut s = speculating(3);
    add(&mut s, "a", 1..=5);
    let out = s.schedule();
    let (t, o) = sampled(&s, &out, |_| Some(50));
    s.update_from_output(&out, &t, &o).unwrap();
    s.update_draft_token_ids(&["a"], &[60, 61, 62], &[0, 3])
        .unwrap();
    // The decode verifies three drafts: four tokens, the drafts last.
    let out = s.schedule();
    assert_eq!(out.entries[0].num_tokens, 4);
    assert_eq!(out.entries[0].drafts, Drafts::Tokens(vec![60, 61, 62]));
    assert_eq!(out.columns.spec_token_ids, vec![60, 61, 62]);
    // One draft accepted, plus the token sampled after it.
    let u = s.update_from_output(&out, &[60, 70], &[0, 2]).unwrap();
    let stats = u.spec_decoding_stats.unwrap();
    assert_eq!(
        (
            stats.num_drafts,
            stats.num_draft_tokens,
            stats.num_accepted_tokens
        ),
        (1, 3, 1)
    );
    assert_eq!(stats.num_accepted_tokens_per_pos, vec![1, 0, 0]);
    let r = s.request(out.entries[0].slot).unwrap();
    assert_eq!(r.num_tokens(), 8);
    // Two rejected positions are computed again: only the new last token is left.
    assert_eq!(r.seq.num_computed_tokens, 7);
    let out = s.schedule();
    assert_eq!(
        (
            out.entries[0].num_tokens,
            out.entries[0].num_computed_tokens
        ),
        (1, 7)
    );
}

#[test]
fn drafts_beyond_max_model_len_are_cut_and_too_many_refused() {
    let mut s = scheduler(Setup {
        max_model_len: 8,
        num_speculative_tokens: 4,
        ..Setup::default()
    });
    add(&mut s, "a", 1..=5);
    let out = s.schedule();
    let (t, o) = sampled(&s, &out, |_| Some(50));
    s.update_from_output(&out, &t, &o).unwrap();
    let too_many = s.update_draft_token_ids(&["a"], &[1, 2, 3, 4, 5], &[0, 5]);
    assert!(too_many
        .unwrap_err()
        .to_string()
        .contains("num_speculative_tokens=4"));
    s.update_draft_token_ids(&["a"], &[60, 61, 62, 63], &[0, 4])
        .unwrap();
    // 6 tokens, 5 computed: positions up to max_model_len - 1 leave room for 2.
    let out = s.schedule();
    assert_eq!(out.entries[0].num_tokens, 2);
    assert_eq!(out.entries[0].drafts, Drafts::Tokens(vec![60]));
}

#[test]
fn a_full_prefix_hit_is_padded_to_a_draft_step() {
    let mut s = speculating(2);
    add(&mut s, "a", 1..=33);
    let out = s.schedule();
    let (t, o) = sampled(&s, &out, |_| Some(50));
    s.update_from_output(&out, &t, &o).unwrap();
    // Its prompt is all cached but the last token: 1 + 2 placeholder drafts.
    add(&mut s, "b", 1..=33);
    let out = s.schedule();
    let b = &out.entries[1];
    assert_eq!((b.num_tokens, b.num_computed_tokens), (3, 32));
    assert_eq!(b.drafts, Drafts::Placeholders(2));
    // The runner rejects placeholders: both positions are computed again.
    let u = s.update_from_output(&out, &[51, 52], &[0, 1, 2]).unwrap();
    assert_eq!(u.spec_decoding_stats.unwrap().num_draft_tokens, 2);
    assert_eq!(s.request(b.slot).unwrap().seq.num_computed_tokens, 33);
}
