//! Prompts given as embeddings (docs/scheduling.md §7.4): each block's
//! digest of them keys its hash, so equal token ids (vLLM holds 0 where an
//! embedding stands) never share KV unless the embeddings are equal too.

use super::tests::{new_request, sampled, scheduler, Setup};
use super::Scheduler;

/// A 40-token prompt of zeros (3 blocks of 16), its blocks' digests from
/// `seed` (block `k` gets `[seed, k]`), or plain tokens for `None`.
fn add(s: &mut Scheduler, id: &str, seed: Option<u8>) {
    let mut r = new_request(id, vec![0; 40], 4);
    r.prompt_embeds_digests = seed.map(|seed| (0..3).map(|k| vec![seed, k]).collect());
    s.add_request(r).unwrap();
}

fn hits(s: &mut Scheduler) -> Vec<(String, usize)> {
    let out = s.schedule();
    let rows = out
        .entries
        .iter()
        .filter(|e| e.kind != crate::step::Kind::Running)
        .map(|e| {
            (
                s.request(e.slot).unwrap().request_id.clone(),
                e.num_computed_tokens,
            )
        })
        .collect();
    let (tokens, offsets) = sampled(s, &out, |_| Some(100));
    s.update_from_output(&out, &tokens, &offsets).unwrap();
    rows
}

#[test]
fn prompt_embeddings_key_the_prefix_cache() {
    let mut s = scheduler(Setup::default());
    add(&mut s, "a", Some(1));
    hits(&mut s);
    add(&mut s, "same", Some(1));
    add(&mut s, "other", Some(2));
    add(&mut s, "tokens", None);
    let got = hits(&mut s);
    assert_eq!(
        got,
        [
            ("same".into(), 32),
            ("other".into(), 0),
            ("tokens".into(), 0)
        ]
    );
}

#[test]
fn a_digest_count_that_does_not_fit_the_prompt_is_refused() {
    let mut s = scheduler(Setup::default());
    let mut r = new_request("r", vec![0; 40], 4);
    r.prompt_embeds_digests = Some(vec![vec![1]; 2]);
    let e = s.add_request(r).unwrap_err().to_string();
    assert!(
        e.contains("prompt_embeds_digests") && e.contains("3 blocks"),
        "{e}"
    );
    assert_eq!(s.num_unfinished_requests(), 0);
}
