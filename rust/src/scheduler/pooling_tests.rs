//! A pooling runner (docs/scheduling.md §4.16): prompts may fill
//! max_model_len, no position is held back for a sampled token, async
//! scheduling adds no placeholder, and the pooled result ends the request.

use super::tests::{new_request, sampled, scheduler, Setup};
use super::Scheduler;
use crate::request::RequestStatus;
use crate::scheduler_config::Runner;
use crate::step::StepOutput;

fn pooling(budget: usize, async_scheduling: bool) -> Scheduler {
    scheduler(Setup {
        max_model_len: 64,
        budget,
        max_num_seqs: 8,
        runner: Runner::Pooling,
        async_scheduling,
        ..Setup::default()
    })
}

/// Each entry's token count, by request id.
fn counts(s: &Scheduler, out: &StepOutput) -> Vec<(String, usize)> {
    out.entries
        .iter()
        .map(|e| (s.request(e.slot).unwrap().request_id.clone(), e.num_tokens))
        .collect()
}

/// The runner's pooled results: one where the step reached the prompt's end.
fn pool(s: &mut Scheduler, out: &StepOutput) -> Vec<String> {
    let pooled: Vec<bool> = out.entries.iter().map(|e| e.samples).collect();
    let update = s.update_from_pooler_output(out, &pooled).unwrap();
    assert!(update.tokens.is_empty());
    update.finished.into_iter().map(|f| f.request_id).collect()
}

#[test]
fn a_prompt_may_fill_max_model_len_and_is_chunked_to_its_last_position() {
    let mut s = pooling(24, false);
    s.add_request(new_request("full", vec![7; 64], 1)).unwrap();
    let mut seen = Vec::new();
    for _ in 0..3 {
        let out = s.schedule();
        seen.extend(counts(&s, &out));
        pool(&mut s, &out);
    }
    // 24 + 24 + 16: the last chunk reaches position 64, which a generating
    // runner never computes.
    let n: Vec<usize> = seen.iter().map(|(_, n)| *n).collect();
    assert_eq!(n, [24, 24, 16]);
    assert_eq!(s.num_unfinished_requests(), 0);
    assert_eq!(s.kv.num_free_blocks(), 10_000 - 1); // all but the null block
}

#[test]
fn a_generating_runner_refuses_the_same_prompt() {
    let mut s = scheduler(Setup {
        max_model_len: 64,
        ..Setup::default()
    });
    let e = s
        .add_request(new_request("full", vec![7; 64], 1))
        .unwrap_err();
    assert!(
        e.to_string().contains("shorter than max_model_len (64)"),
        "{e}"
    );
    let mut p = pooling(24, false);
    let e = p
        .add_request(new_request("long", vec![7; 65], 1))
        .unwrap_err();
    assert!(e.to_string().contains("at most max_model_len (64)"), "{e}");
    assert_eq!(p.num_unfinished_requests(), 0);
}

#[test]
fn the_pooled_result_finishes_the_request_stopped_and_a_chunk_brings_none() {
    let mut s = pooling(32, false);
    s.add_request(new_request("long", vec![1; 40], 1)).unwrap();
    s.add_request(new_request("short", vec![2; 20], 1)).unwrap();
    let out = s.schedule();
    assert_eq!(counts(&s, &out), [("long".into(), 32)]);
    assert_eq!(pool(&mut s, &out), Vec::<String>::new());
    let out = s.schedule();
    assert_eq!(counts(&s, &out), [("long".into(), 8), ("short".into(), 20)]);
    let pooled = vec![true, true];
    let update = s.update_from_pooler_output(&out, &pooled).unwrap();
    let ended: Vec<_> = update
        .finished
        .iter()
        .map(|f| (f.request_id.as_str(), f.status))
        .collect();
    assert_eq!(
        ended,
        [
            ("long", RequestStatus::FinishedStopped),
            ("short", RequestStatus::FinishedStopped)
        ]
    );
    assert_eq!(update.records.len(), 2);
    assert_eq!(s.num_unfinished_requests(), 0);
}

#[test]
fn a_pooled_result_for_a_chunk_is_refused_and_changes_nothing() {
    let mut s = pooling(16, false);
    s.add_request(new_request("r", vec![1; 40], 1)).unwrap();
    let out = s.schedule();
    let e = s.update_from_pooler_output(&out, &[true]).unwrap_err();
    assert!(e.to_string().contains("ended before the end"), "{e}");
    let e = s.update_from_pooler_output(&out, &[]).unwrap_err();
    assert!(e.to_string().contains("0 entries for a step of 1"), "{e}");
    // Tokens are refused too: a pooling runner samples none.
    let e = s.update_from_output(&out, &[5], &[0, 1]).unwrap_err();
    assert!(e.to_string().contains("samples no tokens"), "{e}");
    // The step is still pending and applies once, correctly.
    assert_eq!(pool(&mut s, &out), Vec::<String>::new());
    assert_eq!(s.num_unfinished_requests(), 1);
}

#[test]
fn a_generating_scheduler_refuses_pooled_results() {
    let mut s = scheduler(Setup::default());
    s.add_request(new_request("r", vec![1; 8], 1)).unwrap();
    let out = s.schedule();
    let e = s.update_from_pooler_output(&out, &[true]).unwrap_err();
    assert!(e.to_string().contains("runner='generate'"), "{e}");
    let (tokens, offsets) = sampled(&s, &out, |_| Some(3));
    s.update_from_output(&out, &tokens, &offsets).unwrap();
}

#[test]
fn async_scheduling_adds_no_placeholder_so_the_next_step_skips_the_request() {
    let mut s = pooling(64, true);
    // max_tokens 4 (vLLM gives pooling requests 1): the async cut for a
    // request whose last token is in flight does not hide a placeholder.
    s.add_request(new_request("r", vec![1; 20], 4)).unwrap();
    let first = s.schedule();
    assert_eq!(counts(&s, &first), [("r".into(), 20)]);
    // Scheduled again before the first step's output: nothing is left to
    // compute (a generating runner would schedule the sampled token's slot).
    let second = s.schedule();
    assert!(second.entries.is_empty());
    assert_eq!(pool(&mut s, &first), ["r"]);
    pool(&mut s, &second);
    assert_eq!(s.num_unfinished_requests(), 0);
}

#[test]
fn speculative_decoding_is_refused_for_a_pooling_runner() {
    let config = crate::scheduler_config::SchedulerConfig {
        num_speculative_tokens: 2,
        ..pooling(64, false).config().clone()
    };
    let e = Scheduler::new(config).unwrap_err();
    assert!(e.to_string().contains("num_speculative_tokens (2)"), "{e}");
}
