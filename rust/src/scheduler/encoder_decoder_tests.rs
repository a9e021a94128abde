//! Encoder-decoder scenarios (docs/scheduling.md §4.17; Whisper): the
//! encoder input runs once, with the decoder's first tokens; its
//! cross-attention blocks are taken on admission and held to the end; the
//! encoder budget and slot count hold a second audio back; preemption runs
//! the encoder again.

use super::tests::{config, new_request, sampled, Setup};
use super::Scheduler;
use crate::attention_group::{AttentionKind, GroupSpec};
use crate::multimodal::MultimodalInput;
use crate::scheduler_config::EncoderConfig;
use crate::step::Kind;

const CROSS: GroupSpec = GroupSpec {
    kind: AttentionKind::CrossAttention,
    admission_cap_blocks: None,
    block_size: None,
};

/// Whisper's shape: a decoder group and a cross-attention group of 16-token
/// blocks, no chunked prefill, no prefix caching.
fn whisper(num_blocks: usize, compute: usize, cache: usize) -> Scheduler {
    let mut c = config(Setup {
        num_blocks,
        budget: 448,
        max_model_len: 448,
        max_num_seqs: 8,
        encoder: Some(EncoderConfig {
            compute_budget: compute,
            cache_size: cache,
            disable_chunked_mm_input: true,
        }),
        ..Setup::default()
    });
    c.enable_chunked_prefill = false;
    c.cache.enable_prefix_caching = false;
    c.cache.groups = vec![GroupSpec::FULL, CROSS];
    Scheduler::new(c).unwrap()
}

/// A 4-token decoder prompt and an audio clip of `embeds` encoder tokens.
fn add_audio(s: &mut Scheduler, id: &str, embeds: usize) {
    let mut r = new_request(id, vec![1, 2, 3, 4], 40);
    r.mm_inputs = vec![MultimodalInput::new(0, embeds, format!("audio-{id}"))];
    s.add_request(r).unwrap();
}

/// One scheduled request: id, tokens, encoder inputs run, and the new
/// blocks of its decoder and cross-attention groups.
#[derive(Debug, PartialEq)]
struct Row {
    id: String,
    tokens: usize,
    inputs: Vec<u32>,
    decoder_blocks: usize,
    cross_blocks: usize,
    kind: Kind,
}

struct Stepped {
    rows: Vec<Row>,
    freed: Vec<String>,
    preempted: Vec<String>,
}

fn step(s: &mut Scheduler) -> Stepped {
    let out = s.schedule();
    let rows = out
        .entries
        .iter()
        .enumerate()
        .map(|(i, e)| Row {
            id: s.request(e.slot).unwrap().request_id.clone(),
            tokens: e.num_tokens,
            inputs: out
                .scheduled_encoder_inputs
                .iter()
                .find(|x| x.slot == e.slot)
                .map_or(vec![], |x| x.input_ids.clone()),
            decoder_blocks: out.group_block_ids_of(i, 0, 2).len(),
            cross_blocks: out.group_block_ids_of(i, 1, 2).len(),
            kind: e.kind,
        })
        .collect();
    let (tokens, offsets) = sampled(s, &out, |_| Some(100));
    s.update_from_output(&out, &tokens, &offsets).unwrap();
    Stepped {
        rows,
        freed: out.free_encoder_mm_hashes.clone(),
        preempted: out.preempted_req_ids.clone(),
    }
}

fn row(id: &str, tokens: usize, inputs: &[u32], blocks: (usize, usize), kind: Kind) -> Row {
    Row {
        id: id.into(),
        tokens,
        inputs: inputs.to_vec(),
        decoder_blocks: blocks.0,
        cross_blocks: blocks.1,
        kind,
    }
}

fn free_slots(s: &Scheduler) -> usize {
    s.encoder_decoder_cache().unwrap().num_free()
}

#[test]
fn the_encoder_runs_once_and_its_cross_blocks_are_taken_on_admission() {
    let mut s = whisper(100, 64, 64);
    add_audio(&mut s, "a", 40);
    let free_before = s.kv().num_free_blocks();
    let first = step(&mut s);
    // cdiv(40, 16) = 3 cross blocks beside the prompt's one.
    assert_eq!(first.rows, [row("a", 4, &[0], (1, 3), Kind::New)]);
    assert!(first.freed.is_empty());
    assert_eq!(s.kv().num_free_blocks(), free_before - 4);
    let second = step(&mut s);
    assert_eq!(second.rows, [row("a", 1, &[], (0, 0), Kind::Running)]);
    assert_eq!(
        second.freed,
        ["audio-a"],
        "dropped by the runner a step late"
    );
    assert!(step(&mut s).freed.is_empty());
    // Held until it finishes; then every block is back.
    s.finish_requests(&["a"], crate::RequestStatus::FinishedAborted);
    assert_eq!(s.kv().num_free_blocks(), free_before);
}

#[test]
fn every_step_with_a_computed_token_gives_its_slots_back_again() {
    // vLLM's EncoderDecoderCacheManager frees without having taken: the
    // count only bounds the first steps.
    let mut s = whisper(100, 64, 64);
    add_audio(&mut s, "a", 40);
    let out = s.schedule();
    assert_eq!(free_slots(&s), 24);
    let (tokens, offsets) = sampled(&s, &out, |_| Some(100));
    s.update_from_output(&out, &tokens, &offsets).unwrap();
    assert_eq!(free_slots(&s), 64);
    step(&mut s);
    step(&mut s);
    assert_eq!(free_slots(&s), 144);
}

#[test]
fn a_second_audio_over_the_encoder_budget_waits_a_step() {
    let mut s = whisper(100, 64, 1000);
    add_audio(&mut s, "a", 40);
    add_audio(&mut s, "b", 40);
    add_audio(&mut s, "c", 20);
    // b does not fit beside a (80 > 64) and is skipped; c does.
    let first = step(&mut s);
    assert_eq!(
        first.rows,
        [
            row("a", 4, &[0], (1, 3), Kind::New),
            row("c", 4, &[0], (1, 2), Kind::New),
        ]
    );
    let second = step(&mut s);
    assert_eq!(
        second.rows,
        [
            row("a", 1, &[], (0, 0), Kind::Running),
            row("c", 1, &[], (0, 0), Kind::Running),
            row("b", 4, &[0], (1, 3), Kind::New),
        ]
    );
}

#[test]
fn the_slot_count_holds_an_audio_back_when_the_budget_would_not() {
    let mut s = whisper(100, 1000, 64);
    add_audio(&mut s, "a", 40);
    add_audio(&mut s, "b", 40);
    assert_eq!(step(&mut s).rows.len(), 1);
    assert_eq!(step(&mut s).rows.len(), 2, "a's slots came back");
}

#[test]
fn a_preempted_request_runs_its_encoder_again() {
    // 8 free blocks: a and b take 1 + 3 each; a's 17th token needs a
    // decoder block, so b (the last admitted) is preempted.
    let mut s = whisper(9, 1000, 1000);
    add_audio(&mut s, "a", 40);
    add_audio(&mut s, "b", 40);
    assert_eq!(step(&mut s).rows.len(), 2);
    let mut preempted = None;
    for n in 0..20 {
        let stepped = step(&mut s);
        if !stepped.preempted.is_empty() {
            assert_eq!(stepped.preempted, ["b"]);
            preempted = Some(n);
            break;
        }
    }
    assert!(preempted.is_some(), "b was never preempted");
    // b comes back once a finishes (40 tokens) and runs its encoder again.
    let resumed = (0..60)
        .flat_map(|_| step(&mut s).rows)
        .find(|r| r.id == "b")
        .unwrap();
    assert_eq!(resumed.inputs, [0]);
    assert_eq!(resumed.kind, Kind::Resumed);
    assert_eq!(resumed.cross_blocks, 3);
    assert!(resumed.tokens > 4, "its output so far is computed again");
    assert_eq!(resumed.decoder_blocks, resumed.tokens.div_ceil(16));
}

#[test]
fn bad_encoder_decoder_setups_are_refused() {
    let base = || {
        let mut c = config(Setup {
            budget: 448,
            max_model_len: 448,
            encoder: Some(EncoderConfig {
                compute_budget: 64,
                cache_size: 64,
                disable_chunked_mm_input: true,
            }),
            ..Setup::default()
        });
        c.cache.enable_prefix_caching = false;
        c.cache.groups = vec![GroupSpec::FULL, CROSS];
        c
    };
    assert!(Scheduler::new(base()).is_ok());
    let err = |c| Scheduler::new(c).unwrap_err().to_string();
    let mut caching = base();
    caching.cache.enable_prefix_caching = true;
    assert!(err(caching).contains("enable_prefix_caching"));
    let mut no_encoder = base();
    no_encoder.encoder = None;
    assert!(err(no_encoder).contains("needs an encoder"));
    let mut cross_first = base();
    cross_first.cache.groups = vec![CROSS, GroupSpec::FULL];
    assert!(err(cross_first).contains("kv_cache_groups[0]"));
    // An encoder input not at position 0 is refused when added.
    let mut s = Scheduler::new(base()).unwrap();
    let mut r = new_request("r", vec![1, 2, 3, 4], 8);
    r.mm_inputs = vec![MultimodalInput::new(2, 40, "x")];
    let e = s.add_request(r).unwrap_err().to_string();
    assert!(e.contains("mm_position.offset must be 0"), "{e}");
    assert_eq!(s.num_unfinished_requests(), 0);
}
