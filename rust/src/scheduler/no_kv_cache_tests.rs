//! A scheduler without a KV cache (docs/scheduling.md §7.14): no KV-cache
//! group, the pool the null block alone, every allocation granted with no
//! block; and an encoder-only deployment (§4.18), which samples nothing and
//! ends each request once its prompt is consumed.

use super::tests::{config, new_request, Setup};
use super::Scheduler;
use crate::multimodal::MultimodalInput;
use crate::request::RequestStatus;
use crate::scheduler_config::{EncoderConfig, Runner, SchedulerConfig};
use crate::step::StepOutput;

/// `Setup` with no KV-cache group: one block (the null block), prefix
/// caching off, as vLLM builds an attention-free model's cache.
fn no_kv_cache(s: Setup) -> SchedulerConfig {
    let mut c = config(s);
    c.cache.groups.clear();
    c.cache.num_blocks = 1;
    c.cache.enable_prefix_caching = false;
    c
}

/// An embedding model with encoder-only attention (BERT and kin): pooling,
/// no chunked prefill, no KV cache.
fn bert(budget: usize) -> Scheduler {
    let mut c = no_kv_cache(Setup {
        max_model_len: 64,
        budget,
        max_num_seqs: 8,
        runner: Runner::Pooling,
        ..Setup::default()
    });
    c.enable_chunked_prefill = false;
    Scheduler::new(c).unwrap()
}

/// `--mm-encoder-only`: the encoder runner, 32 tokens a step, an encoder
/// budget of 24 embeddings.
fn encoder_only(chunked: bool) -> Scheduler {
    let mut c = no_kv_cache(Setup {
        max_model_len: 64,
        budget: 32,
        max_num_seqs: 8,
        runner: Runner::EncoderOnly,
        encoder: Some(EncoderConfig {
            compute_budget: 24,
            cache_size: 48,
            disable_chunked_mm_input: false,
        }),
        ..Setup::default()
    });
    if !chunked {
        c.enable_chunked_prefill = false;
        c.max_num_batched_tokens = 64;
        c.max_num_scheduled_tokens = 64;
    }
    Scheduler::new(c).unwrap()
}

/// Each entry's request id and token count.
fn counts(s: &Scheduler, out: &StepOutput) -> Vec<(String, usize)> {
    out.entries
        .iter()
        .map(|e| (s.request(e.slot).unwrap().request_id.clone(), e.num_tokens))
        .collect()
}

/// Apply a step that sampled nothing; the ids it finished.
fn nothing_sampled(s: &mut Scheduler, out: &StepOutput) -> Vec<String> {
    let offsets = vec![0; out.entries.len() + 1];
    let update = s.update_from_output(out, &[], &offsets).unwrap();
    assert!(update.tokens.is_empty());
    for f in &update.finished {
        assert_eq!(f.status, RequestStatus::FinishedStopped);
    }
    update.finished.into_iter().map(|f| f.request_id).collect()
}

#[test]
fn without_a_kv_cache_every_admission_fits_and_takes_no_block() {
    let mut s = bert(64);
    for (id, n) in [("a", 40), ("b", 20), ("c", 30), ("d", 64)] {
        s.add_request(new_request(id, vec![7; n], 1)).unwrap();
    }
    // Without chunking the token budget alone decides: c (30) does not fit
    // beside a and b, and it blocks the queue (Q6).
    let out = s.schedule();
    assert_eq!(counts(&s, &out), [("a".into(), 40), ("b".into(), 20)]);
    // No block, no slot: one offset (0) for the rows' zero groups.
    assert_eq!(out.new_block_offsets, [0]);
    assert!(out.new_block_ids.is_empty() && out.slot_mapping().is_empty());
    assert_eq!(s.kv.usage(), 0.0);
    let pooled = vec![true; out.entries.len()];
    s.update_from_pooler_output(&out, &pooled).unwrap();
    let out = s.schedule();
    assert_eq!(counts(&s, &out), [("c".into(), 30)]);
    s.update_from_pooler_output(&out, &[true]).unwrap();
    let out = s.schedule();
    assert_eq!(counts(&s, &out), [("d".into(), 64)]);
    s.update_from_pooler_output(&out, &[true]).unwrap();
    assert_eq!(s.num_unfinished_requests(), 0);
}

#[test]
fn an_encoder_only_request_ends_once_its_prompt_is_consumed() {
    let mut s = encoder_only(true);
    let mut r = new_request("img", vec![1; 40], 16);
    r.mm_inputs = vec![MultimodalInput::new(4, 20, "x")];
    s.add_request(r).unwrap();
    s.add_request(new_request("text", vec![2; 10], 16)).unwrap();
    // 32 tokens: img's first chunk (its image whole inside), then text's 0.
    let out = s.schedule();
    assert_eq!(counts(&s, &out), [("img".into(), 32)]);
    assert_eq!(out.scheduled_encoder_inputs.len(), 1);
    assert!(
        nothing_sampled(&mut s, &out).is_empty(),
        "a chunk ends nothing"
    );
    let out = s.schedule();
    assert_eq!(counts(&s, &out), [("img".into(), 8), ("text".into(), 10)]);
    assert_eq!(nothing_sampled(&mut s, &out), ["img", "text"]);
    assert_eq!(s.num_unfinished_requests(), 0);
}

#[test]
fn an_encoder_only_deployment_chunks_even_with_chunked_prefill_off() {
    let mut s = encoder_only(false);
    s.add_request(new_request("a", vec![1; 40], 16)).unwrap();
    s.add_request(new_request("b", vec![2; 40], 16)).unwrap();
    // b's 40 tokens do not fit beside a's: a generating runner would stop
    // the pass, an encoder-only one schedules the 24 left (vLLM's exemption).
    let out = s.schedule();
    assert_eq!(counts(&s, &out), [("a".into(), 40), ("b".into(), 24)]);
    assert_eq!(nothing_sampled(&mut s, &out), ["a"]);
    let out = s.schedule();
    assert_eq!(counts(&s, &out), [("b".into(), 16)]);
    assert_eq!(nothing_sampled(&mut s, &out), ["b"]);
}

#[test]
fn an_encoder_only_runner_refuses_tokens_and_what_it_cannot_serve() {
    let mut s = encoder_only(true);
    s.add_request(new_request("a", vec![1; 8], 16)).unwrap();
    let out = s.schedule();
    let e = s.update_from_output(&out, &[5], &[0, 1]).unwrap_err();
    assert!(e.to_string().contains("samples no tokens"), "{e}");
    assert_eq!(
        nothing_sampled(&mut s, &out),
        ["a"],
        "the step still applies"
    );
    let mut session = new_request("s", vec![1; 8], 16);
    session.resumable = true;
    let e = s.add_request(session).unwrap_err();
    assert!(e.to_string().contains("runner 'encoder_only'"), "{e}");
    let mut c = s.config().clone();
    c.encoder = None;
    let e = Scheduler::new(c).unwrap_err();
    assert!(e.to_string().contains("encoder budget"), "{e}");
    let mut c = s.config().clone();
    c.num_speculative_tokens = 1;
    let e = Scheduler::new(c).unwrap_err();
    assert!(e.to_string().contains("runner 'encoder_only'"), "{e}");
}

#[test]
fn no_kv_cache_with_prefix_caching_is_refused() {
    let mut c = no_kv_cache(Setup::default());
    c.cache.enable_prefix_caching = true;
    let e = Scheduler::new(c).unwrap_err();
    assert!(e.to_string().contains("kv_cache_groups is empty"), "{e}");
    // A single block is a cache of nothing: refused where a group needs one.
    let mut c = config(Setup::default());
    c.cache.num_blocks = 1;
    assert!(Scheduler::new(c).is_err());
}

#[test]
fn a_prefix_cache_reset_succeeds_with_no_pool_to_reset_and_no_event() {
    let mut s = bert(64);
    s.kv.enable_events();
    assert!(s.reset_prefix_cache(false));
    assert!(
        s.kv.take_events().is_empty(),
        "vLLM's coordinator resets no pool"
    );
    assert!(s.make_stats().prefix_cache_stats.reset);
}
