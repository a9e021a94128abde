//! Multimodal scenarios (docs/scheduling.md §4.15): the encoder budget and
//! cache cutting a step's tokens, shared cache entries, their release and
//! eviction, and images keying the prefix cache.

use super::tests::{admitted_hits, new_request, sampled, scheduler, Setup};
use super::Scheduler;
use crate::multimodal::MultimodalInput;
use crate::scheduler_config::EncoderConfig;
use crate::RequestStatus;

fn with_encoder(budget: usize, compute: usize, cache: usize, whole: bool) -> Scheduler {
    scheduler(Setup {
        budget,
        max_num_seqs: 8,
        encoder: Some(EncoderConfig {
            compute_budget: compute,
            cache_size: cache,
            disable_chunked_mm_input: whole,
        }),
        ..Setup::default()
    })
}

fn add_with(s: &mut Scheduler, id: &str, prompt: Vec<u32>, images: &[(usize, usize, &str)]) {
    let mut r = new_request(id, prompt, 40);
    r.mm_inputs = images
        .iter()
        .map(|&(offset, length, identifier)| MultimodalInput::new(offset, length, identifier))
        .collect();
    s.add_request(r).unwrap();
}

/// One step, applied: per request scheduled, its id, tokens and the
/// encoder inputs run for it; and the entries evicted.
struct Stepped {
    rows: Vec<(String, usize, Vec<u32>)>,
    freed: Vec<String>,
    mismatch: Vec<String>,
}

fn step(s: &mut Scheduler) -> Stepped {
    let out = s.schedule();
    let name = |slot| s.request(slot).unwrap().request_id.clone();
    let rows = out
        .entries
        .iter()
        .map(|e| {
            let inputs = out
                .scheduled_encoder_inputs
                .iter()
                .find(|x| x.slot == e.slot)
                .map_or(vec![], |x| x.input_ids.clone());
            (name(e.slot), e.num_tokens, inputs)
        })
        .collect();
    let mismatch = out
        .encoder_mismatch
        .iter()
        .map(|&slot| name(slot))
        .collect();
    let freed = out.free_encoder_mm_hashes.clone();
    let (tokens, offsets) = sampled(s, &out, |_| Some(100));
    s.update_from_output(&out, &tokens, &offsets).unwrap();
    s.encoder_cache().unwrap().check_invariants().unwrap();
    Stepped {
        rows,
        freed,
        mismatch,
    }
}

fn row(id: &str, n: usize, inputs: &[u32]) -> (String, usize, Vec<u32>) {
    (id.into(), n, inputs.to_vec())
}

#[test]
fn an_image_straddling_a_chunk_boundary_runs_whole_in_the_first_chunk() {
    // 100-token prompt, an image at 40..70, 50 tokens a step.
    let mut s = with_encoder(50, 1000, 1000, false);
    add_with(&mut s, "r", (0..100).collect(), &[(40, 30, "img")]);
    assert_eq!(step(&mut s).rows, [row("r", 50, &[0])]);
    // Its embeddings wait in the cache for positions 50..70: nothing re-runs.
    assert_eq!(step(&mut s).rows, [row("r", 50, &[])]);
    assert_eq!(
        s.encoder_cache().unwrap().num_used(),
        30,
        "kept (unreferenced) for reuse"
    );
}

#[test]
fn without_chunked_mm_input_the_chunk_stops_before_the_image() {
    let mut s = with_encoder(50, 1000, 1000, true);
    add_with(&mut s, "r", (0..100).collect(), &[(40, 30, "img")]);
    assert_eq!(step(&mut s).rows, [row("r", 40, &[])]);
    assert_eq!(step(&mut s).rows, [row("r", 50, &[0])]);
    assert_eq!(step(&mut s).rows, [row("r", 10, &[])]);
}

#[test]
fn the_encoder_budget_cuts_the_second_request_before_its_image() {
    // Room for one 30-embedding image a step.
    let mut s = with_encoder(200, 30, 1000, false);
    add_with(&mut s, "a", (0..60).collect(), &[(10, 30, "x")]);
    add_with(&mut s, "b", (100..160).collect(), &[(20, 30, "y")]);
    add_with(&mut s, "c", (200..260).collect(), &[(0, 30, "z")]);
    // b gets the 20 tokens before its image; c, whose image comes first,
    // is skipped for this step.
    assert_eq!(step(&mut s).rows, [row("a", 60, &[0]), row("b", 20, &[])]);
    assert_eq!(s.request_counts(), (2, 1));
    // Next step b's image runs; c still waits for budget.
    assert_eq!(step(&mut s).rows, [row("a", 1, &[]), row("b", 40, &[0])]);
    assert_eq!(
        step(&mut s).rows,
        [row("a", 1, &[]), row("b", 1, &[]), row("c", 60, &[0])]
    );
}

#[test]
fn a_shared_image_runs_once_and_its_entry_outlives_the_first_request() {
    let mut s = with_encoder(200, 1000, 1000, false);
    add_with(&mut s, "a", (0..40).collect(), &[(8, 16, "same")]);
    add_with(&mut s, "b", (50..90).collect(), &[(4, 16, "same")]);
    // a runs it; b, later in the same step, references a's entry.
    assert_eq!(step(&mut s).rows, [row("a", 40, &[0]), row("b", 40, &[])]);
    s.finish_requests(&["a", "b"], RequestStatus::FinishedAborted);
    add_with(&mut s, "c", (100..140).collect(), &[(0, 16, "same")]);
    assert_eq!(step(&mut s).rows, [row("c", 40, &[])], "still cached");
}

#[test]
fn the_cache_evicts_the_oldest_unreferenced_entry_and_says_so() {
    let mut s = with_encoder(200, 100, 40, false);
    add_with(&mut s, "a", (0..40).collect(), &[(0, 20, "p")]);
    add_with(&mut s, "b", (50..90).collect(), &[(0, 20, "q")]);
    step(&mut s); // both encoded; the cache is full
                  // Both computed past their images: released, kept, evictable.
    add_with(&mut s, "c", (100..140).collect(), &[(0, 20, "r")]);
    let third = step(&mut s);
    assert_eq!(third.rows.last().unwrap(), &row("c", 40, &[0]));
    assert_eq!(third.freed, ["p"]);
}

#[test]
fn a_full_cache_of_referenced_entries_makes_the_request_wait() {
    // A cache of 30 embeddings; 50 tokens a request a step.
    let mut s = scheduler(Setup {
        budget: 200,
        max_num_seqs: 8,
        threshold: 50,
        encoder: Some(EncoderConfig {
            compute_budget: 100,
            cache_size: 30,
            disable_chunked_mm_input: false,
        }),
        ..Setup::default()
    });
    add_with(&mut s, "a", (0..150).collect(), &[(20, 30, "p")]);
    add_with(&mut s, "b", (200..260).collect(), &[(0, 30, "q")]);
    // a's image fills the cache while a's step computes it: b, whose image
    // comes first, is skipped.
    let first = step(&mut s);
    assert_eq!(first.rows, [row("a", 50, &[0])]);
    assert_eq!(s.request_counts(), (1, 1));
    // a is past its image: its entry is evicted for b's.
    let second = step(&mut s);
    assert_eq!(second.rows, [row("a", 50, &[]), row("b", 50, &[0])]);
    assert_eq!(second.freed, ["p"]);
}

#[test]
fn images_key_the_prefix_cache() {
    let mut s = with_encoder(200, 1000, 1000, false);
    let prompt: Vec<u32> = vec![7; 48]; // placeholder tokens: all the same
    add_with(&mut s, "a", prompt.clone(), &[(0, 32, "cat")]);
    add_with(&mut s, "k", prompt.clone(), &[(0, 12, "kit")]);
    step(&mut s);
    add_with(&mut s, "same", prompt.clone(), &[(0, 32, "cat")]);
    add_with(&mut s, "other", prompt.clone(), &[(0, 32, "dog")]);
    add_with(&mut s, "moved", prompt.clone(), &[(16, 32, "cat")]);
    // The same image, two tokens on, within the same first block.
    add_with(&mut s, "shifted", prompt, &[(2, 12, "kit")]);
    let out = s.schedule();
    assert_eq!(
        admitted_hits(&s, &out),
        [
            ("same".into(), 32),
            ("other".into(), 0),
            ("moved".into(), 0),
            ("shifted".into(), 0)
        ]
    );
}

#[test]
fn an_identifier_reused_with_other_embeddings_ends_the_request() {
    let mut s = with_encoder(200, 1000, 1000, false);
    add_with(&mut s, "a", (0..40).collect(), &[(0, 16, "id")]);
    step(&mut s);
    add_with(&mut s, "b", (50..90).collect(), &[(0, 20, "id")]);
    let stepped = step(&mut s);
    assert_eq!(stepped.mismatch, ["b"]);
    assert!(stepped.rows.iter().all(|(id, _, _)| id != "b"));
}

#[test]
fn bad_inputs_are_refused_and_change_nothing() {
    let mut s = with_encoder(200, 1000, 1000, false);
    let mut r = new_request("r", (0..20).collect(), 4);
    r.mm_inputs = vec![MultimodalInput::new(10, 20, "x")];
    let e = s.add_request(r).unwrap_err().to_string();
    assert!(
        e.contains("mm_features[0]") && e.contains("past the prompt"),
        "{e}"
    );
    assert_eq!(s.num_unfinished_requests(), 0);
    let mut text = scheduler(Setup::default());
    let mut r = new_request("r", (0..20).collect(), 4);
    r.mm_inputs = vec![MultimodalInput::new(0, 4, "x")];
    let e = text.add_request(r).unwrap_err().to_string();
    assert!(e.contains("no encoder"), "{e}");
}

#[test]
fn a_session_chunk_brings_an_image_placed_after_what_the_session_keeps() {
    let mut s = with_encoder(64, 100, 100, false);
    let mut first = new_request("s", vec![1; 8], 1);
    first.resumable = true;
    first.mm_inputs = vec![MultimodalInput::new(2, 3, "a")];
    s.add_request(first).unwrap();
    // The turn: the prompt (running image "a"), one token, then it waits.
    assert_eq!(step(&mut s).rows, [row("s", 8, &[0])]);
    let slot = s.slot_of("s").unwrap();
    assert_eq!(
        s.request(slot).unwrap().status,
        RequestStatus::WaitingForStreamingReq
    );
    // The chunk's image sits at 2..5 of its 6 tokens: 10..13 of the session
    // (its 9 tokens less the last sampled one, then the chunk).
    let mut chunk = new_request("s", vec![2; 6], 1);
    chunk.resumable = true;
    chunk.mm_inputs = vec![MultimodalInput::new(2, 3, "b")];
    s.add_request(chunk).unwrap();
    let r = s.request(slot).unwrap();
    let placed: Vec<_> = r.mm_inputs.iter().map(|m| (m.offset, m.length)).collect();
    assert_eq!(placed, [(2, 3), (10, 3)]);
    // The next turn computes 8..14 and runs the chunk's image, input 1.
    assert_eq!(step(&mut s).rows, [row("s", 6, &[1])]);
}

#[test]
fn a_session_chunk_image_past_the_chunk_is_refused_and_changes_nothing() {
    let mut s = with_encoder(64, 100, 100, false);
    let mut first = new_request("s", vec![1; 8], 4);
    first.resumable = true;
    s.add_request(first).unwrap();
    let mut chunk = new_request("s", vec![2; 4], 1);
    chunk.resumable = true;
    chunk.mm_inputs = vec![MultimodalInput::new(2, 3, "b")];
    let e = s.add_request(chunk).unwrap_err().to_string();
    assert!(e.contains("ends past the prompt's 4 tokens"), "{e}");
    let slot = s.slot_of("s").unwrap();
    assert!(s.request(slot).unwrap().mm_inputs.is_empty());
    assert_eq!(step(&mut s).rows, [row("s", 8, &[])]);
}

#[test]
fn a_victims_encoder_budget_is_lost_when_its_preempter_runs_an_image() {
    // Under priority, A's allocation preempts V, scheduled earlier in the
    // step with an image: V's budget comes back, but A then commits the
    // budget it planned with (vLLM's `new_encoder_compute_budget`), so C's
    // 15-embedding image finds 10 left, not 20, and C waits.
    let mut s = scheduler(Setup {
        num_blocks: 9, // 8 usable blocks of 16
        budget: 200,
        max_num_seqs: 8,
        threshold: 20,
        policy: crate::scheduler_config::Policy::Priority,
        encoder: Some(EncoderConfig {
            compute_budget: 30,
            cache_size: 1000,
            disable_chunked_mm_input: false,
        }),
        ..Setup::default()
    });
    let add =
        |s: &mut Scheduler, id: &str, len: u32, arrival: f64, images: &[(usize, usize, &str)]| {
            let priority = if id == "V" { 1 } else { 0 };
            let mut r = new_request(
                id,
                (0..len).map(|t| t + 1000 * arrival as u32).collect(),
                40,
            );
            r.priority = priority;
            r.arrival_time = arrival;
            r.mm_inputs = images
                .iter()
                .map(|&(offset, length, identifier)| {
                    MultimodalInput::new(offset, length, identifier)
                })
                .collect();
            s.add_request(r).unwrap();
        };
    add(&mut s, "V", 60, 1.0, &[(20, 10, "v0"), (40, 10, "v1")]);
    // F, done in one step, only keeps V's first chunk at the threshold.
    let mut f = new_request("F", vec![7, 8], 1);
    f.priority = 2;
    s.add_request(f).unwrap();
    assert_eq!(step(&mut s).rows, [row("V", 20, &[]), row("F", 2, &[])]);
    add(&mut s, "A", 60, 2.0, &[(20, 10, "a0")]);
    add(&mut s, "C", 40, 3.0, &[(20, 15, "c0")]);
    let second = step(&mut s).rows;
    assert_eq!(
        second,
        [row("V", 20, &[0]), row("A", 20, &[]), row("C", 20, &[])]
    );
    // V (4 blocks) is preempted for A's third block; C's image does not fit.
    assert_eq!(step(&mut s).rows, [row("A", 20, &[0])]);
}
