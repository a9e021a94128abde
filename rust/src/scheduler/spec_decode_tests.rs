//! Speculative decoding scenarios (docs/scheduling.md §4.13, §5.7): drafts
//! scheduled, rejected ones rolled back, padding, the max_model_len cut, and
//! what a drafter with its own forward pass adds (lookahead slots, hash
//! lookahead, drafting slots).

use super::tests::{add, sampled, scheduler, Setup};
use super::Scheduler;
use crate::spec_decode::{Drafts, DRAFT_PADDING};

fn speculating(k: usize) -> Scheduler {
    scheduler(Setup {
        num_speculative_tokens: k,
        ..Setup::default()
    })
}

/// A speculating scheduler whose request "a" (prompt 1..=5) has sampled its
/// first token, 50, and decodes next.
fn decoding(k: usize) -> Scheduler {
    let mut s = speculating(k);
    add(&mut s, "a", 1..=5);
    let out = s.schedule();
    let (t, o) = sampled(&s, &out, |_| Some(50));
    s.update_from_output(&out, &t, &o).unwrap();
    s
}

#[test]
fn drafts_are_scheduled_and_rejected_ones_rolled_back() {
    let mut s = decoding(3);
    s.update_draft_token_ids(&["a"], &[60, 61, 62], &[0, 3])
        .unwrap();
    // The decode verifies three drafts: four tokens, the drafts last.
    let out = s.schedule();
    assert_eq!(out.entries[0].num_tokens, 4);
    assert_eq!(out.entries[0].drafts, Drafts::Tokens(vec![60, 61, 62]));
    assert_eq!(out.full_columns().spec_token_ids, vec![60, 61, 62]);
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
fn more_tokens_than_one_after_the_drafts_are_refused_and_change_nothing() {
    // With one draft scheduled a step samples at most two tokens; with none
    // (a plain decode, speculation on or off), at most one.
    for drafts in [vec![60], vec![]] {
        let mut s = decoding(1);
        s.update_draft_token_ids(&["a"], &drafts, &[0, drafts.len()])
            .unwrap();
        let out = s.schedule();
        let before = s.request(out.entries[0].slot).unwrap().num_tokens();
        let most = drafts.len() + 1;
        let tokens = vec![60; most + 1];
        let err = s
            .update_from_output(&out, &tokens, &[0, most + 1])
            .unwrap_err()
            .to_string();
        assert!(err.contains(&format!("samples at most {most}")), "{err}");
        assert_eq!(s.request(out.entries[0].slot).unwrap().num_tokens(), before);
        s.update_from_output(&out, &tokens[..most], &[0, most])
            .unwrap();
    }
}

#[test]
fn padded_drafts_are_scheduled_counted_and_rejected_as_vllm_keeps_them() {
    // ngram_gpu hands over k drafts, -1 where it found no match; vLLM
    // schedules all k and counts them as drafts.
    let mut s = decoding(4);
    s.update_draft_token_ids(&["a"], &[10, 11, DRAFT_PADDING, DRAFT_PADDING], &[0, 4])
        .unwrap();
    let out = s.schedule();
    assert_eq!(out.entries[0].num_tokens, 5);
    assert_eq!(out.full_columns().spec_token_ids, vec![10, 11, -1, -1]);
    // Both real drafts accepted; the padding cannot be.
    let u = s.update_from_output(&out, &[10, 11, 70], &[0, 3]).unwrap();
    let stats = u.spec_decoding_stats.unwrap();
    assert_eq!((stats.num_draft_tokens, stats.num_accepted_tokens), (4, 2));
    assert_eq!(stats.num_draft_tokens_per_pos, vec![1, 1, 1, 1]);
    let r = s.request(out.entries[0].slot).unwrap();
    assert_eq!((r.num_tokens(), r.seq.num_computed_tokens), (9, 8));
}

#[test]
fn a_negative_draft_other_than_the_padding_is_refused_and_changes_nothing() {
    let mut s = decoding(4);
    s.update_draft_token_ids(&["a"], &[7], &[0, 1]).unwrap();
    for bad in [-2, i64::from(u32::MAX) + 1] {
        let e = s.update_draft_token_ids(&["a"], &[10, bad], &[0, 2]);
        assert!(e.unwrap_err().to_string().contains("nor -1"), "{bad}");
    }
    assert_eq!(s.schedule().full_columns().spec_token_ids, vec![7]);
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

#[test]
fn lookahead_slots_are_allocated_past_the_scheduled_tokens() {
    // Fifteen prompt tokens fit one 16-token block; two lookahead slots do not.
    let blocks = |lookahead: usize| {
        let mut s = scheduler(Setup {
            num_speculative_tokens: 2,
            num_lookahead_tokens: lookahead,
            ..Setup::default()
        });
        add(&mut s, "a", 1..=15);
        let out = s.schedule();
        out.block_ids_of(0).len()
    };
    assert_eq!((blocks(0), blocks(1), blocks(2)), (1, 1, 2));
}

#[test]
fn a_lookahead_hash_needs_the_next_token_to_match_too() {
    // `b` shares `a`'s first block but not the token after it.
    let hit = |lookahead: usize| {
        let mut s = scheduler(Setup {
            num_speculative_tokens: 1,
            num_hash_lookahead_tokens: lookahead,
            ..Setup::default()
        });
        add(&mut s, "a", 1..=40);
        let out = s.schedule();
        let (t, o) = sampled(&s, &out, |_| Some(50));
        s.update_from_output(&out, &t, &o).unwrap();
        let mut b: Vec<u32> = (1..=16).collect();
        b.extend(100..120);
        let mut r = super::tests::new_request("b", b, 4);
        r.arrival_time = 1.0;
        s.add_request(r).unwrap();
        s.schedule().entries[1].num_computed_tokens
    };
    assert_eq!((hit(0), hit(1)), (16, 0));
}

#[test]
fn without_lookahead_hashes_a_hit_drops_its_last_block() {
    // `b` repeats `a`'s first 40 tokens: two whole blocks cached, one
    // kept once the drafter's block is dropped; none from a one-block hit.
    let hit = |drop_eagle_block: bool, shared: u32| {
        let mut s = scheduler(Setup {
            num_speculative_tokens: 1,
            drop_eagle_block,
            ..Setup::default()
        });
        add(&mut s, "a", 1..=40);
        let out = s.schedule();
        let (t, o) = sampled(&s, &out, |_| Some(50));
        s.update_from_output(&out, &t, &o).unwrap();
        let mut b: Vec<u32> = (1..=shared).collect();
        b.extend(100..120);
        let mut r = super::tests::new_request("b", b, 4);
        r.arrival_time = 1.0;
        s.add_request(r).unwrap();
        let out = s.schedule();
        (
            out.entries[1].num_computed_tokens,
            out.block_ids_of(1).len(),
        )
    };
    assert_eq!(hit(false, 40), (32, 4));
    assert_eq!(hit(true, 40), (16, 4));
    assert_eq!(hit(true, 20), (0, 3));
}

#[test]
fn drafting_slots_come_out_of_the_input_budget_only() {
    let mut s = scheduler(Setup {
        budget: 12,
        max_num_seqs: 4,
        num_speculative_tokens: 2,
        num_draft_slots: 2,
        ..Setup::default()
    });
    add(&mut s, "a", 1..=5);
    add(&mut s, "b", 11..=20);
    let out = s.schedule();
    // `a` takes 5 tokens and 2 slots; `b` the 12 − 7 − 2 = 3 left for tokens.
    let n: Vec<usize> = out.entries.iter().map(|e| e.num_tokens).collect();
    assert_eq!(n, vec![5, 3]);
}

#[test]
fn drafts_are_needed_unless_every_request_is_a_chunk_or_at_its_last_token() {
    let mut s = scheduler(Setup {
        budget: 8,
        max_num_seqs: 4,
        threshold: 4,
        num_speculative_tokens: 2,
        ..Setup::default()
    });
    add(&mut s, "a", 1..=20);
    let mut r = super::tests::new_request("b", vec![5, 6], 1);
    r.arrival_time = 1.0;
    s.add_request(r).unwrap();
    // `a` is a prefill chunk short of its prompt's end (it samples nothing);
    // `b`'s token is its last by max_tokens, whatever the drafts.
    let out = s.schedule();
    assert_eq!(out.entries.len(), 2);
    assert!(!out.drafts_needed);
    let mut r = super::tests::new_request("c", vec![7, 8], 5);
    r.arrival_time = 2.0;
    s.add_request(r).unwrap();
    let out = s.schedule();
    assert!(out.entries.len() == 2 && out.drafts_needed);
}

#[test]
fn a_prefill_chunk_leaves_a_multi_module_drafter_its_read_ahead() {
    // A 20-token prompt under an 18-token budget: with three modules the
    // chunk stops 3 short of the end (17), with one it takes the 18.
    let chunks = |drafter_read_ahead: usize| {
        let mut s = scheduler(Setup {
            budget: 18,
            max_num_seqs: 4,
            num_speculative_tokens: 3,
            drafter_read_ahead,
            ..Setup::default()
        });
        add(&mut s, "a", 1..=20);
        let first = s.schedule();
        let (t, o) = sampled(&s, &first, |_| None);
        s.update_from_output(&first, &t, &o).unwrap();
        (
            first.entries[0].num_tokens,
            s.schedule().entries[0].num_tokens,
        )
    };
    assert_eq!(chunks(1), (18, 2));
    assert_eq!(chunks(3), (17, 3));
}

#[test]
fn a_multi_module_drafters_last_tokens_are_not_hash_cached() {
    // `a` computes 33 tokens and ends: two full blocks, but with three
    // modules the last two tokens may be prefilled again, so only the first
    // is cached.
    let hit = |drafter_read_ahead: usize| {
        let mut s = scheduler(Setup {
            num_speculative_tokens: 3,
            drafter_read_ahead,
            ..Setup::default()
        });
        s.add_request(super::tests::new_request("a", (1..=33).collect(), 1))
            .unwrap();
        let out = s.schedule();
        let (t, o) = sampled(&s, &out, |_| Some(50));
        s.update_from_output(&out, &t, &o).unwrap();
        let mut b: Vec<u32> = (1..=33).collect();
        b.extend(100..120);
        let mut r = super::tests::new_request("b", b, 4);
        r.arrival_time = 1.0;
        s.add_request(r).unwrap();
        s.schedule().entries[0].num_computed_tokens
    };
    assert_eq!((hit(1), hit(3)), (32, 16));
}
