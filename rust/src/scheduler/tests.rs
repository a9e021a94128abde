//! The scheduler scenarios of docs/scheduling.md §9.2 (vLLM 0.33.0's own
//! values) at the core's level, so `cargo test` alone catches a broken
//! rule; tests/test_scheduler_scenarios.py runs the same on both backends
//! through the Python API.

use super::*;
use crate::kv_cache_manager::KvCacheConfig;
use crate::kv_events::KvEvent;
use crate::request::{StopReason, StopRules};
use crate::scheduler_config::{EncoderConfig, Runner};

pub(super) struct Setup {
    pub(super) num_blocks: usize,
    pub(super) max_model_len: usize,
    pub(super) budget: usize,
    pub(super) max_num_seqs: usize,
    pub(super) threshold: usize,
    pub(super) policy: Policy,
    pub(super) num_speculative_tokens: usize,
    pub(super) num_lookahead_tokens: usize,
    pub(super) num_hash_lookahead_tokens: usize,
    pub(super) drop_eagle_block: bool,
    pub(super) num_draft_slots: usize,
    pub(super) max_loras: Option<usize>,
    pub(super) drafter_read_ahead: usize,
    pub(super) encoder: Option<EncoderConfig>,
    pub(super) runner: Runner,
    pub(super) async_scheduling: bool,
}

impl Default for Setup {
    fn default() -> Self {
        Setup {
            num_blocks: 10_000,
            max_model_len: 2048,
            budget: 2048,
            max_num_seqs: 128,
            threshold: 0,
            policy: Policy::Fcfs,
            num_speculative_tokens: 0,
            num_lookahead_tokens: 0,
            num_hash_lookahead_tokens: 0,
            drop_eagle_block: false,
            num_draft_slots: 0,
            max_loras: None,
            drafter_read_ahead: 0,
            encoder: None,
            runner: Runner::Generate,
            async_scheduling: false,
        }
    }
}

pub(super) fn scheduler(s: Setup) -> Scheduler {
    Scheduler::new(config(s)).unwrap()
}

/// The configuration `scheduler` builds from `s`.
pub(super) fn config(s: Setup) -> SchedulerConfig {
    SchedulerConfig {
        max_num_seqs: s.max_num_seqs,
        max_num_batched_tokens: s.budget,
        max_num_scheduled_tokens: s.budget,
        max_num_active_seqs: s.max_num_seqs,
        max_model_len: s.max_model_len,
        enable_chunked_prefill: true,
        long_prefill_token_threshold: s.threshold,
        long_prefill_token_threshold_adaptive: false,
        watermark_blocks: 0,
        policy: s.policy,
        scheduler_reserve_full_isl: true,
        async_scheduling: s.async_scheduling,
        prefill_schedule_interval: 1,
        decode_stagger: 0,
        num_speculative_tokens: s.num_speculative_tokens,
        num_draft_slots: s.num_draft_slots,
        drafts_by_batch_size: None,
        max_loras: s.max_loras,
        drafter_read_ahead: s.drafter_read_ahead,
        encoder: s.encoder,
        runner: s.runner,
        cache: KvCacheConfig {
            num_lookahead_tokens: s.num_lookahead_tokens,
            num_hash_lookahead_tokens: s.num_hash_lookahead_tokens,
            drop_eagle_block: s.drop_eagle_block,
            ..KvCacheConfig::new(s.num_blocks, 16, s.max_model_len, true)
        },
    }
}

pub(super) fn new_request(id: &str, prompt: Vec<u32>, max_tokens: usize) -> NewRequest {
    NewRequest {
        request_id: id.into(),
        prompt_token_ids: prompt,
        stop: StopRules {
            max_tokens,
            min_tokens: 0,
            eos_token_id: Some(2),
            stop_token_ids: vec![],
            repetition: None,
        },
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
    }
}

pub(super) fn add(s: &mut Scheduler, id: &str, tokens: std::ops::RangeInclusive<u32>) {
    s.add_request(new_request(id, tokens.collect(), 40))
        .unwrap();
}

fn add_prioritised(s: &mut Scheduler, id: &str, tokens: std::ops::RangeInclusive<u32>, p: i64) {
    let mut r = new_request(id, tokens.collect(), 40);
    r.priority = p;
    r.arrival_time = s.num_unfinished_requests() as f64 + 1.0;
    s.add_request(r).unwrap();
}

/// One scheduled request as the traces write it: id, tokens, computed
/// before the step, this step's block ids.
#[derive(Debug, PartialEq)]
struct Row(String, usize, usize, Vec<i32>);

fn row(id: &str, n: usize, computed: usize, blocks: impl IntoIterator<Item = i32>) -> Row {
    Row(id.into(), n, computed, blocks.into_iter().collect())
}

fn rows(s: &Scheduler, out: &StepOutput) -> Vec<Row> {
    out.entries
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let id = s.request(e.slot).unwrap().request_id.clone();
            Row(
                id,
                e.num_tokens,
                e.num_computed_tokens,
                out.block_ids_of(i).to_vec(),
            )
        })
        .collect()
}

/// The requests a step admitted (new or resumed), each with its prefix hit
/// in tokens.
pub(super) fn admitted_hits(s: &Scheduler, out: &StepOutput) -> Vec<(String, usize)> {
    out.entries
        .iter()
        .filter(|e| e.kind != crate::step::Kind::Running)
        .map(|e| {
            let id = s.request(e.slot).unwrap().request_id.clone();
            (id, e.num_computed_tokens)
        })
        .collect()
}

/// Each sampling entry's tokens: `token(request id)`, none where it gives
/// `None`.
pub(super) fn sampled(
    s: &Scheduler,
    out: &StepOutput,
    token: impl Fn(&str) -> Option<u32>,
) -> (Vec<u32>, Vec<usize>) {
    let (mut tokens, mut offsets) = (vec![], vec![0]);
    for e in &out.entries {
        if e.samples {
            if let Some(t) = token(&s.request(e.slot).unwrap().request_id) {
                tokens.push(t);
            }
        }
        offsets.push(tokens.len());
    }
    (tokens, offsets)
}

/// One step in which every request that reached its last token samples
/// 100; returns the rows and the preempted ids.
fn step(s: &mut Scheduler) -> (Vec<Row>, Vec<String>) {
    let out = s.schedule();
    let rows = rows(s, &out);
    let (tokens, offsets) = sampled(s, &out, |_| Some(100));
    s.update_from_output(&out, &tokens, &offsets).unwrap();
    assert_eq!(
        s.update_from_output(&out, &tokens, &offsets),
        Err(Error::StepAlreadyApplied)
    );
    (rows, out.preempted_req_ids)
}

#[test]
fn s1_the_threshold_chunks_long_prompts() {
    let mut s = scheduler(Setup {
        budget: 1024,
        threshold: 400,
        max_num_seqs: 16,
        ..Default::default()
    });
    for (i, t) in (10..13).enumerate() {
        s.add_request(new_request(&format!("r{i}"), vec![t; 800], 16))
            .unwrap();
    }
    let (r, _) = step(&mut s);
    assert_eq!(
        r,
        vec![
            row("r0", 400, 0, 1..=25),
            row("r1", 400, 0, 26..=50),
            row("r2", 224, 0, 51..=64)
        ]
    );
    step(&mut s);
    let (r, _) = step(&mut s);
    assert_eq!(
        r,
        vec![
            row("r0", 1, 800, [129]),
            row("r1", 1, 800, [130]),
            row("r2", 352, 448, 131..=152)
        ]
    );
}

#[test]
fn s3_a_prefix_is_shared_within_one_step() {
    // Blocks are hash-cached at allocation, so b hits a's blocks at once (Q8).
    let mut s = scheduler(Setup::default());
    add(&mut s, "a", 3..=102);
    add(&mut s, "b", 3..=102);
    let (r, _) = step(&mut s);
    assert_eq!(
        r,
        vec![
            row("a", 100, 0, 1..=7),
            row("b", 4, 96, [1, 2, 3, 4, 5, 6, 8])
        ]
    );
}

#[test]
fn s4_fcfs_preempts_the_last_running_request() {
    let mut s = scheduler(Setup {
        num_blocks: 11,
        max_model_len: 160,
        budget: 512,
        ..Default::default()
    });
    add(&mut s, "a", 3..=82);
    add(&mut s, "b", 103..=182);
    let (r, _) = step(&mut s);
    assert_eq!(r, vec![row("a", 80, 0, 1..=5), row("b", 80, 0, 6..=10)]);
    // b's cached blocks went to the tail last block first: 10 comes back at once.
    let (r, preempted) = step(&mut s);
    assert_eq!(r, vec![row("a", 1, 80, [10])]);
    assert_eq!(preempted, vec!["b".to_string()]);
    assert_eq!(s.kv().num_free_blocks(), 4);
}

#[test]
fn s4b_tokens_of_a_request_preempted_in_flight_stay_stale() {
    let mut s = scheduler(Setup {
        num_blocks: 11,
        max_model_len: 160,
        budget: 80,
        max_num_seqs: 16,
        ..Default::default()
    });
    add(&mut s, "r0", 3..=82);
    add(&mut s, "r1", 103..=182);
    let out1 = s.schedule();
    assert_eq!(rows(&s, &out1), vec![row("r0", 80, 0, 1..=5)]);
    let out2 = s.schedule(); // before out1's token: r0 has nothing to compute (Q17)
    assert_eq!(rows(&s, &out2), vec![row("r1", 80, 0, 6..=10)]);
    s.update_from_output(&out1, &[42], &[0, 1]).unwrap();
    let out3 = s.schedule();
    assert_eq!(rows(&s, &out3), vec![row("r0", 1, 80, [10])]);
    assert_eq!(out3.preempted_req_ids, vec!["r1".to_string()]);
    // r1's token arrives after its preemption: applied, counters untouched.
    let up = s.update_from_output(&out2, &[43], &[0, 1]).unwrap();
    assert_eq!(up.tokens, vec![43]);
    let r1 = s.request(s.slot_of("r1").unwrap()).unwrap();
    assert_eq!((r1.status, r1.num_tokens()), (RequestStatus::Preempted, 81));
    assert_eq!(r1.seq.num_computed_tokens, 0);
    assert_eq!(s.kv().num_free_blocks(), 4);
}

#[test]
fn s5_priority_undoes_a_scheduled_victim() {
    let setup = || Setup {
        num_blocks: 5,
        max_model_len: 64,
        budget: 256,
        max_num_seqs: 4,
        policy: Policy::Priority,
        ..Default::default()
    };
    let mut s = scheduler(setup());
    add_prioritised(&mut s, "A", 3..=32, 1);
    step(&mut s);
    add_prioritised(&mut s, "B", 103..=134, 0);
    let (r, _) = step(&mut s);
    assert_eq!(r, vec![row("A", 1, 30, []), row("B", 32, 0, [3, 4])]);
    // A, scheduled first, is the victim B needs: its entry is undone.
    let (r, preempted) = step(&mut s);
    assert_eq!(r, vec![row("B", 1, 32, [2])]);
    assert_eq!(preempted, vec!["A".to_string()]);
    assert_eq!(s.kv().num_free_blocks(), 1);
}

#[test]
fn s6_priority_self_preemption_continues_the_pass() {
    let mut s = scheduler(Setup {
        num_blocks: 5,
        max_model_len: 64,
        budget: 256,
        max_num_seqs: 4,
        policy: Policy::Priority,
        ..Default::default()
    });
    add_prioritised(&mut s, "C", 3..=32, 3);
    step(&mut s);
    add_prioritised(&mut s, "D", 103..=133, 0);
    step(&mut s);
    step(&mut s);
    let (r, preempted) = step(&mut s);
    assert_eq!(r, vec![row("D", 1, 32, [2])]);
    assert_eq!(preempted, vec!["C".to_string()]);
}

#[test]
fn s7_stops_in_vllm_order() {
    let mut s = scheduler(Setup {
        max_model_len: 64,
        ..Default::default()
    });
    let mut e = new_request("e", vec![5; 10], 3);
    e.stop.min_tokens = 3;
    let mut f = new_request("f", vec![6; 10], 5);
    f.stop.min_tokens = 4;
    f.stop.stop_token_ids = vec![7];
    for r in [e, f, new_request("h", vec![8; 60], 50)] {
        s.add_request(r).unwrap();
    }
    let plan: [&[(&str, u32)]; 4] = [
        &[("e", 50), ("f", 51), ("h", 52)],
        &[("e", 50), ("f", 7), ("h", 52)],
        &[("e", 2), ("h", 52)],
        &[("h", 52)],
    ];
    let mut finished = vec![];
    for tokens in plan {
        let out = s.schedule();
        let (t, o) = sampled(&s, &out, |id| {
            tokens.iter().find(|(rid, _)| *rid == id).map(|&(_, t)| t)
        });
        let up = s.update_from_output(&out, &t, &o).unwrap();
        finished.push(
            up.finished
                .iter()
                .map(|f| (f.request_id.clone(), f.status, f.stop_reason))
                .collect::<Vec<_>>(),
        );
    }
    use RequestStatus::{FinishedLengthCapped as Length, FinishedStopped as Stopped};
    assert!(finished[0].is_empty());
    // min_tokens does not delay a stop token (Q3) ...
    assert_eq!(
        finished[1],
        vec![("f".to_string(), Stopped, Some(StopReason::Token(7)))]
    );
    // ... and EOS as the last allowed token is a stop, not a length (Q4).
    assert_eq!(finished[2], vec![("e".to_string(), Stopped, None)]);
    assert_eq!(finished[3], vec![("h".to_string(), Length, None)]); // 64 = max_model_len
    assert_eq!(s.num_unfinished_requests(), 0);
    assert_eq!(s.kv().num_free_blocks(), 9_999);
}

#[test]
fn async_placeholders_stop_at_max_tokens() {
    // Prompt of 20, max_tokens 2, the next step scheduled while the
    // previous one is in flight (as vLLM's engine runs async mode).
    let mut config = scheduler(Setup::default()).config().clone();
    config.async_scheduling = true;
    let mut s = Scheduler::new(config).unwrap();
    s.add_request(new_request("a", (3..23).collect(), 2))
        .unwrap();
    let mut s_a = s.schedule();
    assert_eq!(s_a.entries[0].num_tokens, 20);
    // Position 20 holds the token step A samples: computed ahead of it.
    let s_b = s.schedule();
    let first = &s_b.entries[0];
    assert_eq!((first.num_tokens, first.num_computed_tokens), (1, 20));
    assert_eq!(s_b.full_columns().num_output_tokens, vec![1]); // one placeholder
    let up = s.update_from_output(&s_a, &[5], &[0, 1]).unwrap();
    assert!(up.finished.is_empty());
    // Step B samples the second and last token: nothing left to schedule.
    assert!(s.schedule().entries.is_empty());
    let up = s.update_from_output(&s_b, &[6], &[0, 1]).unwrap();
    assert_eq!(up.finished[0].status, RequestStatus::FinishedLengthCapped);
    s_a.step_id = u64::MAX; // a forged step is refused, not applied
    assert_eq!(
        s.update_from_output(&s_a, &[5], &[0, 1]),
        Err(Error::StepAlreadyApplied)
    );
}

#[test]
fn a_step_is_applied_only_by_the_scheduler_that_made_it() {
    let mut a = scheduler(Setup::default());
    let mut b = scheduler(Setup::default());
    add(&mut a, "x", 3..=10);
    add(&mut b, "x", 3..=10);
    let out = a.schedule();
    b.schedule();
    assert_eq!(
        b.update_from_output(&out, &[1], &[0, 1]),
        Err(Error::ForeignStep)
    );
    assert!(a.update_from_output(&out, &[1], &[0, 1]).is_ok());
}

#[test]
fn pause_states_hold_admissions_then_everything() {
    let mut s = scheduler(Setup {
        num_blocks: 11,
        max_model_len: 64,
        budget: 256,
        ..Default::default()
    });
    add(&mut s, "a", 3..=12);
    step(&mut s); // a runs
    add(&mut s, "b", 20..=29);
    s.set_pause(Pause::New); // running requests go on, nobody is admitted
    let (r, _) = step(&mut s);
    assert_eq!(r, vec![row("a", 1, 10, [])]);
    s.set_pause(Pause::All); // nothing is scheduled, but aborts still flush
    s.finish_requests(&["a"], RequestStatus::FinishedAborted);
    let out = s.schedule();
    assert!(out.entries.is_empty());
    assert_eq!(out.finished_req_ids, vec!["a".to_string()]);
    s.set_pause(Pause::Unpaused);
    let (r, _) = step(&mut s);
    // a's partial (unhashed) block went back to the head of the free queue.
    assert_eq!(r, vec![row("b", 10, 0, [1])]);
}

#[test]
fn refused_requests_change_nothing() {
    let mut s = scheduler(Setup {
        max_model_len: 64,
        ..Default::default()
    });
    add(&mut s, "a", 3..=9);
    let dup = new_request("a", vec![1], 1);
    assert_eq!(s.add_request(dup), Err(Error::DuplicateRequest("a".into())));
    for bad in [
        new_request("b", (0..64).collect(), 1), // not shorter than max_model_len
        new_request("b", vec![], 1),
        new_request("b", vec![1], 0),
    ] {
        assert!(matches!(s.add_request(bad), Err(Error::InvalidArgument(_))));
    }
    assert_eq!(s.num_unfinished_requests(), 1);
    let freed = s.finish_requests(&["a", "a", "zz"], RequestStatus::FinishedAborted);
    assert_eq!(freed.len(), 1);
    assert_eq!(s.num_unfinished_requests(), 0);
}

fn add_structured(s: &mut Scheduler, id: &str, tokens: std::ops::RangeInclusive<u32>) -> Slot {
    let mut r = new_request(id, tokens.collect(), 40);
    r.structured_output = true;
    s.add_request(r).unwrap()
}

#[test]
fn a_grammar_holds_its_request_until_a_pass_finds_it_compiled() {
    let mut s = scheduler(Setup::default());
    add(&mut s, "a", 3..=22);
    let b = add_structured(&mut s, "b", 30..=49);
    add(&mut s, "c", 60..=80);
    assert_eq!(s.make_stats().num_skipped_waiting_reqs, 1); // held from the start
    let out = s.schedule();
    // b is skipped, not a barrier; it keeps its place at the head.
    assert_eq!(
        rows(&s, &out),
        vec![row("a", 20, 0, [1, 2]), row("c", 21, 0, [3, 4])]
    );
    assert!(out.grammar_released.is_empty() && !out.has_structured_output_requests);
    let (tokens, offsets) = sampled(&s, &out, |_| Some(100));
    s.update_from_output(&out, &tokens, &offsets).unwrap();
    s.report_grammar("b", true).unwrap();
    let out = s.schedule();
    assert_eq!(out.grammar_released, vec![b]);
    assert_eq!(rows(&s, &out)[2], row("b", 20, 0, [5, 6]));
    assert!(out.has_structured_output_requests); // b samples this step
    assert_eq!(s.make_stats().num_skipped_waiting_reqs, 0);
    assert!(s.report_grammar("b", false).is_err()); // in use now
    assert!(s.report_grammar("a", true).is_err()); // no grammar
    assert!(s.report_grammar("zz", true).is_err()); // unknown
}

#[test]
fn a_failed_grammar_is_reported_when_reached_and_holds_until_ended() {
    let mut s = scheduler(Setup::default());
    let b = add_structured(&mut s, "b", 30..=49);
    s.report_grammar("b", false).unwrap();
    for _ in 0..2 {
        let out = s.schedule();
        assert!(out.entries.is_empty());
        assert_eq!(out.grammar_failed, vec![b]);
    }
    assert_eq!(
        s.finish_requests(&["b"], RequestStatus::FinishedError),
        vec![b]
    );
    assert_eq!(s.num_unfinished_requests(), 0);
    assert_eq!(s.make_stats().num_skipped_waiting_reqs, 0);
}

#[test]
fn a_rejected_output_ends_the_request_with_an_error() {
    let mut s = scheduler(Setup::default());
    let a = add_structured(&mut s, "a", 3..=22);
    add(&mut s, "b", 30..=49);
    s.report_grammar("a", true).unwrap();
    let out = s.schedule();
    let (tokens, offsets) = sampled(&s, &out, |id| Some(if id == "a" { 13 } else { 2 }));
    let mut asked = vec![];
    let update = s
        .update_from_output_checked(&out, &tokens, &offsets, &mut |slot, r, kept| {
            asked.push((slot, kept.to_vec(), r.num_tokens()));
            kept != [13]
        })
        .unwrap();
    assert_eq!(asked, vec![(a, vec![13], 21)]); // only the structured request
    let ends: Vec<_> = update
        .finished
        .iter()
        .map(|f| (f.request_id.as_str(), f.status))
        .collect();
    // Both end in this update, in row order (each is freed at its row).
    assert_eq!(
        ends,
        vec![
            ("a", RequestStatus::FinishedError),
            ("b", RequestStatus::FinishedStopped)
        ]
    );
    assert_eq!(s.num_unfinished_requests(), 0);
}

#[test]
fn kv_events_follow_caching_eviction_lookups_and_resets() {
    let mut s = scheduler(Setup {
        num_blocks: 6,
        ..Default::default()
    });
    s.enable_kv_events();
    let a = s
        .add_request(new_request("a", (3..=34).collect(), 40))
        .unwrap();
    step(&mut s); // 32 prompt tokens: two full blocks, cached when allocated
    let stored = |owner, first_block, block_ids: Vec<BlockId>| KvEvent::Stored {
        owner,
        group: 0,
        first_block,
        block_ids,
    };
    assert_eq!(s.take_kv_events(), vec![stored(a, 0, vec![1, 2])]);
    step(&mut s); // its first output starts block 3: nothing full yet
    assert!(s.take_kv_events().is_empty());
    // Freed last block first: unhashed 3 to the head, cached 2 and 1 to the tail.
    s.finish_requests(&["a"], RequestStatus::FinishedAborted);
    let b = s
        .add_request(new_request("b", (60..=123).collect(), 40))
        .unwrap();
    step(&mut s); // four blocks from [3, 4, 5, 2, 1]: reusing 2 evicts it
    let removed = |block_id| KvEvent::Removed { block_id };
    assert_eq!(
        s.take_kv_events(),
        vec![removed(2), stored(b, 0, vec![3, 4, 5, 2])]
    );
    let mut c = new_request("c", (60..=123).collect(), 40);
    c.report_hits = true;
    let c = s.add_request(c).unwrap();
    // b's next block evicts 1; no room is left for c, but its lookup found
    // 3 blocks, which it reports.
    s.schedule();
    let hit = KvEvent::Hit {
        owner: c,
        num_blocks: 3,
    };
    assert_eq!(s.take_kv_events(), vec![removed(1), hit]);
    s.finish_requests(&["b", "c"], RequestStatus::FinishedAborted);
    assert!(s.reset_prefix_cache(false));
    assert_eq!(s.take_kv_events(), vec![KvEvent::Cleared]);
}
