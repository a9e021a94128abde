//! A KV connector's side of the scheduler (docs/scheduling.md §4.19), with
//! a scripted connector: external hits loaded in the step or later, the
//! wait for a load, blocks held for a send or an unfinished load, the
//! reservation an async load keeps for in-flight prefills.

use super::tests::{config, new_request, Setup};
use super::{RequestErrors, Scheduler, SchedulerConfig};
use crate::attention_group::{AttentionKind, GroupSpec};
use crate::block::BlockId;
use crate::error::Error;
use crate::kv_connector::scripted::{Call, Observed, Scripted};
use crate::kv_connector::{ExternalHit, KvConnectorSetup, KvTransferReport, LoadFailurePolicy};
use crate::request::RequestStatus;
use crate::step::{StepOutput, UpdateOutput};
use std::sync::{Arc, Mutex};

/// Block size 4, `num_blocks` blocks, `budget` tokens a step, a scripted connector answering
/// `answers` (request id, external tokens, async) and holding `holds`.
fn with_connector(
    num_blocks: usize,
    budget: usize,
    answers: &[(&str, Option<(usize, bool)>)],
    holds: &[&str],
) -> (Scheduler, Arc<Mutex<Vec<Call>>>) {
    let setup = KvConnectorSetup::default();
    with_setup(num_blocks, budget, answers, holds, setup, false)
}

/// [`with_connector`] under a load-failure policy.
fn with_policy(
    num_blocks: usize,
    budget: usize,
    answers: &[(&str, Option<(usize, bool)>)],
    holds: &[&str],
    policy: LoadFailurePolicy,
) -> (Scheduler, Arc<Mutex<Vec<Call>>>) {
    let setup = KvConnectorSetup {
        load_failure_policy: policy,
        ..KvConnectorSetup::default()
    };
    with_setup(num_blocks, budget, answers, holds, setup, false)
}

/// [`with_connector`] with a connector setup, async scheduling or not.
fn with_setup(
    num_blocks: usize,
    budget: usize,
    answers: &[(&str, Option<(usize, bool)>)],
    holds: &[&str],
    setup: KvConnectorSetup,
    async_scheduling: bool,
) -> (Scheduler, Arc<Mutex<Vec<Call>>>) {
    attached(
        connector_config(num_blocks, budget, async_scheduling),
        answers,
        holds,
        setup,
    )
}

/// Block size 4, `num_blocks` blocks, `budget` tokens a step, a long
/// prompt leaving budget to the requests behind it.
fn connector_config(num_blocks: usize, budget: usize, async_scheduling: bool) -> SchedulerConfig {
    let mut c = config(Setup {
        num_blocks,
        max_model_len: 64,
        budget,
        max_num_seqs: 8,
        threshold: 20,
        async_scheduling,
        ..Setup::default()
    });
    c.cache.block_size = 4;
    c
}

/// A scheduler of config `c` with a scripted connector answering `answers`
/// (request id, external tokens, async) and holding `holds`.
fn attached(
    c: SchedulerConfig,
    answers: &[(&str, Option<(usize, bool)>)],
    holds: &[&str],
    setup: KvConnectorSetup,
) -> (Scheduler, Arc<Mutex<Vec<Call>>>) {
    let mut s = Scheduler::new(c).unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let connector = Scripted {
        answers: answers
            .iter()
            .map(|&(id, a)| {
                let hit = a.map(|(num_tokens, load_async)| ExternalHit {
                    num_tokens,
                    load_async,
                });
                (id.to_string(), hit)
            })
            .collect(),
        holds: holds.iter().map(|h| h.to_string()).collect(),
        log: log.clone(),
        ..Scripted::default()
    };
    s.set_kv_connector(Box::new(connector), setup).unwrap();
    (s, log)
}

fn counts(s: &Scheduler, out: &StepOutput) -> Vec<(String, usize, usize)> {
    out.entries
        .iter()
        .map(|e| {
            let id = s.request(e.slot).unwrap().request_id.clone();
            (id, e.num_computed_tokens, e.num_tokens)
        })
        .collect()
}

fn blocks_of(s: &Scheduler, id: &str) -> Vec<BlockId> {
    let slot = s.slot_of(id).unwrap();
    s.request(slot).unwrap().tables[0].block_ids().to_vec()
}

/// Apply a step, each sampling row getting token 7.
fn sampled(s: &mut Scheduler, out: &StepOutput) -> Vec<String> {
    let update = reported(s, out, &KvTransferReport::default()).unwrap();
    update.finished.into_iter().map(|f| f.request_id).collect()
}

/// Apply a step (each sampling row getting token 7) with the worker's
/// report of its KV transfers.
fn reported(
    s: &mut Scheduler,
    out: &StepOutput,
    report: &KvTransferReport,
) -> Result<UpdateOutput, Error> {
    let (tokens, offsets) = one_token_each(out);
    s.update_with_kv_report(
        out,
        &tokens,
        &offsets,
        &mut |_, _, _| true,
        report,
        RequestErrors::none(),
    )
}

/// Token 7 for each entry that samples: `(tokens, offsets)`.
fn one_token_each(out: &StepOutput) -> (Vec<u32>, Vec<usize>) {
    let mut tokens = Vec::new();
    let mut offsets = vec![0];
    for e in &out.entries {
        if e.samples {
            tokens.push(7);
        }
        offsets.push(tokens.len());
    }
    (tokens, offsets)
}

/// A report of finished transfers only.
fn transfers(recving: &[&str], sending: &[&str]) -> KvTransferReport {
    KvTransferReport {
        finished_recving: recving.iter().map(|id| id.to_string()).collect(),
        finished_sending: sending.iter().map(|id| id.to_string()).collect(),
        ..KvTransferReport::default()
    }
}

#[test]
fn a_load_arriving_two_steps_later_is_scheduled_once_reported() {
    // §4.19's decode instance, without the failed block: the whole 14-token
    // prompt is loaded; the last token is given back to compute.
    let (mut s, log) = with_connector(20, 64, &[("r", Some((14, true)))], &[]);
    s.add_request(new_request("r", (100..114).collect(), 4))
        .unwrap();
    let out = s.schedule();
    assert!(out.entries.is_empty());
    let slot = s.slot_of("r").unwrap();
    let r = s.request(slot).unwrap();
    assert_eq!(r.status, RequestStatus::WaitingForRemoteKvs);
    assert_eq!(r.seq.num_computed_tokens, 14);
    assert_eq!(blocks_of(&s, "r"), vec![1, 2, 3, 4]);
    assert_eq!(
        s.request(slot).unwrap().num_cached_blocks(),
        0,
        "cached only once loaded"
    );
    sampled(&mut s, &out);
    let out = s.schedule();
    assert!(out.entries.is_empty(), "still loading");
    reported(&mut s, &out, &transfers(&["r"], &[])).unwrap();
    let out = s.schedule();
    assert_eq!(counts(&s, &out), vec![("r".into(), 13, 1)]);
    assert_eq!(s.request(slot).unwrap().num_cached_blocks(), 3);
    assert_eq!(
        *log.lock().unwrap(),
        vec![
            Call::Matched("r".into(), 14, 0),
            Call::AfterAlloc("r".into(), vec![vec![1, 2, 3, 4]], 14),
            Call::AfterAlloc("r".into(), vec![vec![1, 2, 3, 4]], 0),
        ]
    );
}

#[test]
fn a_synchronous_hit_is_computed_from_past_it_in_the_same_step() {
    let (mut s, _) = with_connector(20, 64, &[("r", Some((6, false)))], &[]);
    s.add_request(new_request("r", (100..114).collect(), 4))
        .unwrap();
    let out = s.schedule();
    assert_eq!(counts(&s, &out), vec![("r".into(), 6, 8)]);
    assert!(out.has_sync_kv_loads);
    let out2 = {
        sampled(&mut s, &out);
        s.schedule()
    };
    assert!(!out2.has_sync_kv_loads);
}

#[test]
fn ask_again_later_skips_the_request_and_asks_it_next_step() {
    let (mut s, log) = with_connector(20, 64, &[("a", None)], &[]);
    s.add_request(new_request("a", (100..110).collect(), 4))
        .unwrap();
    s.add_request(new_request("b", (200..210).collect(), 4))
        .unwrap();
    let out = s.schedule();
    assert_eq!(counts(&s, &out), vec![("b".into(), 0, 10)]);
    sampled(&mut s, &out);
    s.schedule();
    let asked_a = log
        .lock()
        .unwrap()
        .iter()
        .filter(|c| matches!(c, Call::Matched(id, _, _) if id == "a"))
        .count();
    assert_eq!(asked_a, 2);
}

#[test]
fn a_broken_answer_counts_as_ask_again_later() {
    // A synchronous hit of every token leaves nothing to compute (vLLM
    // asserts); an async one of 0 tokens loads nothing.
    for answer in [(10, false), (0, true), (11, true)] {
        let (mut s, _) = with_connector(20, 64, &[("a", Some(answer))], &[]);
        s.add_request(new_request("a", (100..110).collect(), 4))
            .unwrap();
        assert!(s.schedule().entries.is_empty(), "{answer:?}");
        assert_eq!(s.kv.num_free_blocks(), 19);
    }
}

#[test]
fn blocks_held_for_a_send_are_freed_when_it_is_reported() {
    let (mut s, log) = with_connector(20, 64, &[], &["r"]);
    s.add_request(new_request("r", (100..110).collect(), 1))
        .unwrap();
    let out = s.schedule();
    assert_eq!(sampled(&mut s, &out), vec!["r".to_string()]);
    assert_eq!(s.kv.num_free_blocks(), 19 - 3, "held for the send");
    assert!(log.lock().unwrap().contains(&Call::Finished(
        "r".into(),
        vec![vec![1, 2, 3]],
        "FINISHED_LENGTH_CAPPED".into()
    )));
    // Reported finished once; no longer unfinished; its id not reusable.
    let out = s.schedule();
    assert_eq!(out.finished_req_ids, vec!["r".to_string()]);
    assert!(out.entries.is_empty());
    assert_eq!(s.num_unfinished_requests(), 0);
    assert!(s.add_request(new_request("r", vec![1, 2], 1)).is_err());
    assert!(s
        .finish_requests(&["r"], RequestStatus::FinishedAborted)
        .is_empty());
    let out = s.schedule();
    reported(&mut s, &out, &transfers(&[], &["r"])).unwrap();
    assert_eq!(s.kv.num_free_blocks(), 19);
    assert_eq!(s.slot_of("r"), None);
}

#[test]
fn a_request_aborted_while_loading_keeps_its_blocks_until_the_load_is_reported() {
    let (mut s, _) = with_connector(20, 64, &[("r", Some((8, true)))], &[]);
    s.add_request(new_request("r", (100..114).collect(), 4))
        .unwrap();
    s.schedule();
    assert_eq!(s.kv.num_free_blocks(), 19 - 2);
    s.finish_requests(&["r"], RequestStatus::FinishedAborted);
    assert_eq!(
        s.kv.num_free_blocks(),
        19 - 2,
        "the load may still write them"
    );
    let out = s.schedule();
    reported(&mut s, &out, &transfers(&["r"], &[])).unwrap();
    assert_eq!(s.kv.num_free_blocks(), 19);
}

#[test]
fn an_async_load_leaves_room_for_what_in_flight_prefills_still_need() {
    // 13 usable blocks. "p" (40 tokens, 10 blocks) takes a 20-token chunk (5 blocks) and still needs 5. "r" loads 8 of its 10
    // tokens: 2 blocks + 5 reserved <= 8 free. "q" loads 12 of 14: 3 blocks
    // + 6 reserved (p's 5, r's last 1) > 6 free, so it waits, though the
    // blocks themselves are free.
    let (mut s, _) = with_connector(
        14,
        32,
        &[("r", Some((8, true))), ("q", Some((12, true)))],
        &[],
    );
    s.add_request(new_request("p", (100..140).collect(), 4))
        .unwrap();
    s.add_request(new_request("r", (200..210).collect(), 4))
        .unwrap();
    s.add_request(new_request("q", (300..314).collect(), 4))
        .unwrap();
    let out = s.schedule();
    assert_eq!(counts(&s, &out), vec![("p".into(), 0, 20)]);
    let status = |id: &str| s.request(s.slot_of(id).unwrap()).unwrap().status;
    assert_eq!(status("r"), RequestStatus::WaitingForRemoteKvs);
    assert_eq!(status("q"), RequestStatus::Waiting);
    assert_eq!(s.kv.num_free_blocks(), 6);
}

#[test]
fn transfer_reports_for_unknown_or_unready_requests_are_refused_unchanged() {
    let (mut s, _) = with_connector(20, 64, &[], &[]);
    s.add_request(new_request("a", (100..110).collect(), 4))
        .unwrap();
    let out = s.schedule();
    assert_eq!(counts(&s, &out), vec![("a".into(), 0, 10)]);
    assert!(reported(&mut s, &out, &transfers(&["nobody"], &[])).is_err());
    assert!(
        reported(&mut s, &out, &transfers(&["a"], &[])).is_err(),
        "not loading"
    );
    assert!(
        reported(&mut s, &out, &transfers(&[], &["a"])).is_err(),
        "not finished"
    );
    let outside = KvTransferReport {
        invalid_block_ids: vec![20],
        ..KvTransferReport::default()
    };
    assert!(reported(&mut s, &out, &outside).is_err(), "no block 20");
    // Refused whole: the step's output still applies, once.
    assert_eq!(sampled(&mut s, &out), Vec::<String>::new());
    let slot = s.slot_of("a").unwrap();
    assert_eq!(s.request(slot).unwrap().num_tokens(), 11);
}

#[test]
fn a_connector_needs_one_full_attention_group_and_no_requests_yet() {
    let (mut s, _) = with_connector(20, 64, &[], &[]);
    s.add_request(new_request("a", vec![1, 2, 3], 4)).unwrap();
    let err = s
        .set_kv_connector(Box::new(Scripted::default()), KvConnectorSetup::default())
        .unwrap_err();
    assert!(
        err.to_string().contains("before the first request"),
        "{err}"
    );
}

/// A report of failures only.
fn failures(failed_recving: &[&str], invalid_block_ids: &[BlockId]) -> KvTransferReport {
    KvTransferReport {
        failed_recving: failed_recving.iter().map(|id| id.to_string()).collect(),
        invalid_block_ids: invalid_block_ids.to_vec(),
        ..KvTransferReport::default()
    }
}

/// §4.19's worked example up to its failure: "r"'s 14 tokens loaded into
/// blocks 1-4 over two steps, the second step's report naming the load
/// done and block 3 (tokens 8-11) failed.
fn worked_example(policy: LoadFailurePolicy) -> (Scheduler, Arc<Mutex<Vec<Call>>>, UpdateOutput) {
    let answers = [("r", Some((14, true)))];
    let (mut s, log) = with_policy(20, 64, &answers, &[], policy);
    s.add_request(new_request("r", (100..114).collect(), 4))
        .unwrap();
    let out = s.schedule();
    sampled(&mut s, &out);
    assert_eq!(s.kv.num_free_blocks(), 19 - 4);
    let out = s.schedule();
    let report = KvTransferReport {
        finished_recving: vec!["r".into()],
        invalid_block_ids: vec![3],
        ..KvTransferReport::default()
    };
    let update = reported(&mut s, &out, &report).unwrap();
    (s, log, update)
}

#[test]
fn a_load_with_a_failed_block_computes_from_that_block_under_recompute() {
    let (mut s, log, update) = worked_example(LoadFailurePolicy::Recompute);
    assert!(update.errored.is_empty());
    let slot = s.slot_of("r").unwrap();
    assert_eq!(s.request(slot).unwrap().seq.num_computed_tokens, 8);
    let out = s.schedule();
    assert_eq!(counts(&s, &out), vec![("r".into(), 8, 6)]);
    assert_eq!(
        s.request(slot).unwrap().num_cached_blocks(),
        3,
        "blocks 1-2 that arrived, block 3 as this step fills it"
    );
    assert_eq!(blocks_of(&s, "r"), vec![1, 2, 3, 4]);
    assert_eq!(
        log.lock().unwrap().last(),
        Some(&Call::AfterAlloc("r".into(), vec![vec![1, 2, 3, 4]], 0))
    );
}

#[test]
fn a_load_with_a_failed_block_ends_the_request_under_fail() {
    let (mut s, log, update) = worked_example(LoadFailurePolicy::Fail);
    assert_eq!(update.errored.len(), 1);
    assert_eq!(update.errored[0].request_id, "r");
    // Ended while its load was out (blocks held), then the same report's
    // finished_recving lets them go.
    assert_eq!(s.kv.num_free_blocks(), 19);
    assert_eq!(s.slot_of("r"), None);
    assert_eq!(
        log.lock().unwrap().last(),
        Some(&Call::Finished(
            "r".into(),
            vec![vec![1, 2]],
            "FINISHED_ERROR".into()
        )),
        "told with the blocks before the cut"
    );
    assert_eq!(s.schedule().finished_req_ids, vec!["r".to_string()]);
}

#[test]
fn a_load_failed_whole_asks_the_connector_again_under_recompute() {
    let (mut s, log) = with_policy(
        20,
        64,
        &[("r", Some((8, true)))],
        &[],
        LoadFailurePolicy::Recompute,
    );
    s.add_request(new_request("r", (100..110).collect(), 4))
        .unwrap();
    let out = s.schedule();
    let report = KvTransferReport {
        finished_recving: vec!["r".into()],
        failed_recving: vec!["r".into(), "nobody".into()],
        ..KvTransferReport::default()
    };
    reported(&mut s, &out, &report).unwrap();
    // The next pass frees its blocks and asks again: the same answer, a
    // load into fresh blocks (the freed ones, last first).
    let out = s.schedule();
    assert!(out.entries.is_empty());
    let slot = s.slot_of("r").unwrap();
    assert_eq!(
        s.request(slot).unwrap().status,
        RequestStatus::WaitingForRemoteKvs
    );
    let matched = log
        .lock()
        .unwrap()
        .iter()
        .filter(|c| matches!(c, Call::Matched(..)))
        .count();
    assert_eq!(matched, 2);
    assert_eq!(s.kv.num_free_blocks(), 19 - 2);
}

#[test]
fn a_running_request_whose_sync_load_failed_drops_its_output_and_computes_again() {
    // "a" hits 8 tokens synchronously (blocks 1, 2) and runs 2 more; block
    // 2 failed: under recompute it goes back to token 4, its sampled token
    // dropped.
    let (mut s, _) = with_policy(
        20,
        64,
        &[("a", Some((8, false)))],
        &[],
        LoadFailurePolicy::Recompute,
    );
    s.add_request(new_request("a", (100..110).collect(), 4))
        .unwrap();
    let out = s.schedule();
    assert_eq!(counts(&s, &out), vec![("a".into(), 8, 2)]);
    assert!(out.has_sync_kv_loads);
    let update = reported(&mut s, &out, &failures(&[], &[2])).unwrap();
    assert!(update.records.is_empty(), "no output this step");
    let slot = s.slot_of("a").unwrap();
    assert_eq!(s.request(slot).unwrap().num_tokens(), 10);
    let out = s.schedule();
    assert_eq!(counts(&s, &out), vec![("a".into(), 4, 6)]);
}

#[test]
fn a_failed_block_two_requests_share_is_recomputed_by_the_first() {
    // "a" and "b" share a 4-token prefix; "a" loaded it synchronously (block
    // 1), "b" hit it locally in the same step. Block 1 fails: "a" claims it
    // and goes back to 0; "b" keeps it as computed and loses only this
    // step's tokens.
    let (mut s, _) = with_policy(
        20,
        64,
        &[("a", Some((4, false)))],
        &[],
        LoadFailurePolicy::Recompute,
    );
    let prefix: Vec<u32> = (100..104).collect();
    let a: Vec<u32> = prefix.iter().copied().chain(200..204).collect();
    let b: Vec<u32> = prefix.iter().copied().chain(300..304).collect();
    s.add_request(new_request("a", a, 4)).unwrap();
    let out = s.schedule();
    sampled(&mut s, &out);
    s.add_request(new_request("b", b, 4)).unwrap();
    let out = s.schedule();
    assert_eq!(
        counts(&s, &out),
        vec![("a".into(), 8, 1), ("b".into(), 4, 4)]
    );
    let update = reported(&mut s, &out, &failures(&[], &[1])).unwrap();
    assert!(update.records.is_empty());
    let computed = |id: &str| {
        s.request(s.slot_of(id).unwrap())
            .unwrap()
            .seq
            .num_computed_tokens
    };
    assert_eq!((computed("a"), computed("b")), (0, 4));
}

fn fenced(num_blocks: usize) -> Scheduler {
    let setup = KvConnectorSetup {
        defer_block_free: true,
        ..KvConnectorSetup::default()
    };
    with_setup(num_blocks, 64, &[], &[], setup, true).0
}

#[test]
fn a_fenced_free_waits_for_the_step_in_flight() {
    // Async: "a" is in steps 1 and 2 and is aborted before either comes
    // back: its blocks wait for step 2's output.
    let mut s = fenced(20);
    s.add_request(new_request("a", (100..110).collect(), 4))
        .unwrap();
    let step1 = s.schedule();
    let step2 = s.schedule();
    assert_eq!(counts(&s, &step2), vec![("a".into(), 10, 1)]);
    s.finish_requests(&["a"], RequestStatus::FinishedAborted);
    assert_eq!(s.kv.num_free_blocks(), 19 - 3, "fenced by step 2");
    let fences: Vec<u64> = s.deferred_frees().map(|d| d.fence).collect();
    assert_eq!(fences, vec![2]);
    sampled(&mut s, &step1);
    assert_eq!(s.kv.num_free_blocks(), 19 - 3, "step 2 is still out");
    sampled(&mut s, &step2);
    assert_eq!(s.kv.num_free_blocks(), 19);
    assert_eq!(s.deferred_frees().count(), 0);
}

#[test]
fn a_victim_fenced_by_a_step_in_flight_is_not_preempted() {
    // 5 usable blocks of 4 tokens; "a" and "b" (8 tokens each) take 4 in
    // step 1. In step 2 (async, step 1 still out) "a" takes the last free
    // block for its decode, and "b" needs one: its own blocks are the
    // victim's, fenced by step 1, so the pass ends without preempting. In
    // step 3, step 1 back, "b" is preempted as usual.
    let mut s = fenced(6);
    s.add_request(new_request("a", (100..108).collect(), 20))
        .unwrap();
    s.add_request(new_request("b", (200..208).collect(), 20))
        .unwrap();
    let step1 = s.schedule();
    assert_eq!(
        counts(&s, &step1),
        vec![("a".into(), 0, 8), ("b".into(), 0, 8)]
    );
    let step2 = s.schedule();
    assert_eq!(counts(&s, &step2), vec![("a".into(), 8, 1)]);
    assert!(step2.preempted_req_ids.is_empty());
    sampled(&mut s, &step1);
    let step3 = s.schedule();
    assert_eq!(step3.preempted_req_ids, vec!["b".to_string()]);
}

#[test]
fn each_call_shows_the_request_as_vllm_holds_it_then() {
    // Before vLLM's admission moves the computed count and status: the ask
    // and the load's allocation see 0 computed and WAITING; the allocation
    // after the load sees what arrived (13 of 14: the last is given back)
    // and the three full blocks cached when the load settled; the finish
    // sees the final state.
    let mut s = Scheduler::new({
        let mut c = config(Setup {
            num_blocks: 20,
            max_model_len: 64,
            budget: 64,
            max_num_seqs: 8,
            ..Setup::default()
        });
        c.cache.block_size = 4;
        c
    })
    .unwrap();
    let observed = Arc::new(Mutex::new(Vec::new()));
    let connector = Scripted {
        answers: [(
            "r".to_string(),
            Some(ExternalHit {
                num_tokens: 14,
                load_async: true,
            }),
        )]
        .into_iter()
        .collect(),
        observed: observed.clone(),
        ..Scripted::default()
    };
    s.set_kv_connector(Box::new(connector), KvConnectorSetup::default())
        .unwrap();
    s.add_request(new_request("r", (100..114).collect(), 1))
        .unwrap();
    let out = s.schedule();
    sampled(&mut s, &out);
    let out = s.schedule();
    reported(&mut s, &out, &transfers(&["r"], &[])).unwrap();
    let out = s.schedule();
    assert_eq!(counts(&s, &out), vec![("r".into(), 13, 1)]);
    sampled(&mut s, &out);
    let seen = |num_tokens, num_computed_tokens, status, num_cached_blocks| Observed {
        request_id: "r".into(),
        num_tokens,
        num_computed_tokens,
        status,
        num_cached_blocks,
    };
    assert_eq!(
        *observed.lock().unwrap(),
        vec![
            seen(14, 0, "WAITING", 0),
            seen(14, 0, "WAITING", 0),
            seen(14, 13, "WAITING", 3),
            seen(15, 14, "FINISHED_LENGTH_CAPPED", 3),
        ]
    );
}

#[test]
fn the_caller_orders_the_requests_the_fail_policy_ends() {
    // Two loads fail whole in one report: ended in the caller's order (the
    // drop-in's: vLLM's set order), or as found without one.
    for reverse in [false, true] {
        let answers = [("a", Some((8, true))), ("b", Some((8, true)))];
        let (mut s, _log) = with_policy(40, 64, &answers, &[], LoadFailurePolicy::Fail);
        for id in ["a", "b"] {
            s.add_request(new_request(id, (100..112).collect(), 4))
                .unwrap();
        }
        let out = s.schedule();
        let report = KvTransferReport {
            finished_recving: vec!["a".into(), "b".into()],
            failed_recving: vec!["a".into(), "b".into()],
            ..KvTransferReport::default()
        };
        let mut seen = None;
        let mut order = |g: &super::ErrorGroups| {
            seen = Some(g.clone());
            let mut whole = g.whole.clone();
            if reverse {
                whole.reverse();
            }
            whole
        };
        let update = s
            .update_with_kv_report(
                &out,
                &[],
                &[0],
                &mut |_, _, _| true,
                &report,
                RequestErrors {
                    request_ids: &[],
                    order: Some(&mut order),
                },
            )
            .unwrap();
        let ended: Vec<&str> = update
            .errored
            .iter()
            .map(|f| f.request_id.as_str())
            .collect();
        assert_eq!(ended, if reverse { ["b", "a"] } else { ["a", "b"] });
        let groups = seen.unwrap();
        assert_eq!(
            (
                groups.whole.len(),
                groups.loading.len(),
                groups.running.len(),
                groups.requested.len()
            ),
            (2, 0, 0, 0)
        );
    }
}

/// "a" loads and its load fails whole; "c" and "d" run ("d" stops in
/// its first step); the caller names `named` to end with an error, in
/// `order`'s order. The scheduler after, the ids ended in order.
fn ending_with_errors<'a>(
    named: &'a [String],
    order: Option<super::EndOrder<'a>>,
) -> (Scheduler, Vec<String>, UpdateOutput) {
    let answers = [("a", Some((8, true)))];
    let (mut s, _log) = with_policy(40, 64, &answers, &[], LoadFailurePolicy::Fail);
    for (id, first, max_tokens) in [("a", 100, 4), ("c", 200, 4), ("d", 300, 1)] {
        let n = if id == "a" { 12 } else { 4 };
        s.add_request(new_request(id, (first..first + n).collect(), max_tokens))
            .unwrap();
    }
    let out = s.schedule();
    let report = KvTransferReport {
        finished_recving: vec!["a".into()],
        failed_recving: vec!["a".into()],
        ..KvTransferReport::default()
    };
    let (tokens, offsets) = one_token_each(&out);
    let errors = RequestErrors {
        request_ids: named,
        order,
    };
    let update = s
        .update_with_kv_report(
            &out,
            &tokens,
            &offsets,
            &mut |_, _, _| true,
            &report,
            errors,
        )
        .unwrap();
    let ended = update
        .errored
        .iter()
        .map(|e| e.request_id.clone())
        .collect();
    (s, ended, update)
}

#[test]
fn the_callers_errors_end_with_the_failed_loads_in_one_order_before_loads_settle() {
    // "zz" is unknown and "d" stops in this very step: both are skipped,
    // as vLLM's finish_requests skips them. One order covers both sources.
    let mut seen = None;
    let mut order = |g: &super::ErrorGroups| {
        seen = Some(g.clone());
        g.requested.iter().chain(&g.whole).copied().collect()
    };
    let named = ["zz", "c", "d", "c"].map(String::from);
    let (s, ended, update) = ending_with_errors(&named, Some(&mut order));
    assert_eq!(ended, ["c", "a"], "the caller's order, each once");
    let groups = seen.unwrap();
    assert_eq!((groups.whole.len(), groups.requested.len()), (1, 1));
    assert_eq!(s.slot_of("c"), None);
    assert_eq!(s.slot_of("a"), None, "its load settled after it ended");
    let d = update.finished.iter().find(|f| f.request_id == "d");
    assert_eq!(
        d.map(|f| f.status),
        Some(RequestStatus::FinishedLengthCapped)
    );
    let c = update.errored.iter().find(|e| e.request_id == "c").unwrap();
    assert_eq!(
        (c.token_ids.len(), c.num_computed_tokens),
        (5, 4),
        "its state as it ended: this step's token kept"
    );
    // Without an order: as found, the failed loads first.
    let (_, ended, _) = ending_with_errors(&["c".to_string()], None);
    assert_eq!(ended, ["a", "c"]);
}

#[test]
fn an_external_hit_beside_a_window_group_pads_its_past_and_takes_every_groups_blocks_first() {
    // A connector with hybrid support beside a 2-token window and full
    // attention (vLLM keeps both groups). A sync hit of 12 of 14 tokens:
    // the window reads back one token, so its first two blocks stay null;
    // every group's blocks for the hit come before any group's new ones.
    let mut c = connector_config(30, 64, false);
    c.cache.groups = vec![
        GroupSpec {
            kind: AttentionKind::SlidingWindow { window: 2 },
            admission_cap_blocks: None,
            block_size: None,
        },
        GroupSpec::FULL,
    ];
    let answers = [("r", Some((12, false)))];
    let (mut s, log) = attached(c, &answers, &[], KvConnectorSetup::default());
    s.add_request(new_request("r", (100..114).collect(), 1))
        .unwrap();
    let out = s.schedule();
    assert_eq!(counts(&s, &out), vec![("r".into(), 12, 2)]);
    let allocated = vec![vec![0, 0, 1, 5], vec![2, 3, 4, 6]];
    assert_eq!(sampled(&mut s, &out), vec!["r".to_string()]);
    // At its finish the window's block out of reach goes before the
    // connector is shown the tables.
    let finished = vec![vec![0, 0, 0, 5], vec![2, 3, 4, 6]];
    assert_eq!(
        *log.lock().unwrap(),
        vec![
            Call::Matched("r".into(), 14, 0),
            Call::AfterAlloc("r".into(), allocated, 12),
            Call::Finished("r".into(), finished, "FINISHED_LENGTH_CAPPED".into()),
        ]
    );
}
