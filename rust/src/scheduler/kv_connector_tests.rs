//! A KV connector's side of the scheduler (docs/scheduling.md §4.19), with
//! a scripted connector: external hits loaded in the step or later, the
//! wait for a load, blocks held for a send or an unfinished load, the
//! reservation an async load keeps for in-flight prefills.

use super::tests::{config, new_request, Setup};
use super::Scheduler;
use crate::block::BlockId;
use crate::kv_connector::scripted::{Call, Scripted};
use crate::kv_connector::ExternalHit;
use crate::request::RequestStatus;
use crate::step::StepOutput;
use std::sync::{Arc, Mutex};

/// Block size 4, `num_blocks` blocks, `budget` tokens a step, a scripted connector answering
/// `answers` (request id, external tokens, async) and holding `holds`.
fn with_connector(
    num_blocks: usize,
    budget: usize,
    answers: &[(&str, Option<(usize, bool)>)],
    holds: &[&str],
) -> (Scheduler, Arc<Mutex<Vec<Call>>>) {
    let mut c = config(Setup {
        num_blocks,
        max_model_len: 64,
        budget,
        max_num_seqs: 8,
        // A long prompt leaves budget to the requests behind it.
        threshold: 20,
        ..Setup::default()
    });
    c.cache.block_size = 4;
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
    };
    s.set_kv_connector(Box::new(connector)).unwrap();
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
    let mut tokens = Vec::new();
    let mut offsets = vec![0];
    for e in &out.entries {
        if e.samples {
            tokens.push(7);
        }
        offsets.push(tokens.len());
    }
    let update = s.update_from_output(out, &tokens, &offsets).unwrap();
    update.finished.into_iter().map(|f| f.request_id).collect()
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
    sampled(&mut s, &out);
    s.apply_kv_transfers(&["r"], &[]).unwrap();
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
    s.apply_kv_transfers::<&str>(&[], &["r"]).unwrap();
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
    s.apply_kv_transfers::<&str>(&["r"], &[]).unwrap();
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
    assert!(s.apply_kv_transfers(&["nobody"], &[]).is_err());
    assert!(s.apply_kv_transfers(&["a"], &[]).is_err(), "not loading");
    assert!(
        s.apply_kv_transfers::<&str>(&[], &["a"]).is_err(),
        "not finished"
    );
    let out = s.schedule();
    assert_eq!(counts(&s, &out), vec![("a".into(), 0, 10)]);
}

#[test]
fn a_connector_needs_one_full_attention_group_and_no_requests_yet() {
    let (mut s, _) = with_connector(20, 64, &[], &[]);
    s.add_request(new_request("a", vec![1, 2, 3], 4)).unwrap();
    let err = s
        .set_kv_connector(Box::new(Scripted::default()))
        .unwrap_err();
    assert!(
        err.to_string().contains("before the first request"),
        "{err}"
    );
}
