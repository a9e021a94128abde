//! The simulation loop's clock, arrivals and records, on workloads small
//! enough to work out by hand.

use super::*;
use crate::attention_group::GroupSpec;
use crate::kv_cache_manager::KvCacheConfig;
use crate::scheduler_config::{Policy, Runner, SchedulerConfig};

fn config(async_scheduling: bool) -> SchedulerConfig {
    SchedulerConfig {
        max_num_seqs: 8,
        max_num_batched_tokens: 64,
        max_num_scheduled_tokens: 64,
        max_num_active_seqs: 8,
        max_model_len: 256,
        enable_chunked_prefill: true,
        long_prefill_token_threshold: 0,
        long_prefill_token_threshold_adaptive: false,
        watermark_blocks: 0,
        policy: Policy::Fcfs,
        scheduler_reserve_full_isl: true,
        async_scheduling,
        prefill_schedule_interval: 1,
        decode_stagger: 0,
        num_speculative_tokens: 0,
        num_draft_slots: 0,
        drafts_by_batch_size: None,
        max_loras: None,
        drafter_read_ahead: 0,
        encoder: None,
        runner: Runner::Generate,
        cache: KvCacheConfig {
            num_blocks: 64,
            block_size: 16,
            max_model_len: 256,
            enable_prefix_caching: true,
            num_lookahead_tokens: 0,
            num_hash_lookahead_tokens: 0,
            drop_eagle_block: false,
            eagle_groups: None,
            groups: vec![GroupSpec::FULL],
            sparse_retention: true,
            retention_interval: 0,
            mixed_precision: false,
        },
    }
}

/// Requests with prompts of their own (one segment each).
fn workload(arrivals: &[f64], prompts: &[usize], outputs: &[usize]) -> Workload {
    let n = arrivals.len();
    Workload {
        arrival_s: arrivals.to_vec(),
        output_tokens: outputs.to_vec(),
        segment_offsets: (0..=n).collect(),
        segment_keys: (0..n as u64).map(|i| 1000 + i).collect(),
        segment_lengths: prompts.to_vec(),
        literal_offsets: vec![0; n + 1],
        literal_tokens: Vec::new(),
        vocab_size: 32000,
    }
}

/// 10 ms a step plus 1 ms per token; 2 ms of CPU per step.
fn clock() -> StepTime {
    StepTime {
        model: StepModel::Linear(LinearModel {
            intercept_s: 0.010,
            per_prefill_token_s: 0.001,
            per_decode_token_s: 0.001,
            ..Default::default()
        }),
        overhead: CpuOverhead {
            per_step_s: 0.002,
            per_request_s: 0.0,
        },
    }
}

fn options() -> SimOptions {
    SimOptions {
        sampled_token: 5,
        record_steps: true,
        record_decisions: true,
        max_steps: None,
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-12
}

#[test]
fn a_lone_request_advances_the_clock_by_the_model_and_the_overhead() {
    // A 40-token prompt in one step (40 tokens: 50 ms), then 2 decodes
    // (11 ms each), each step 2 ms of CPU after the one before.
    let w = workload(&[1.0], &[40], &[3]);
    let out = simulate(config(false), &w, &clock(), &options(), None).unwrap();
    let r = &out.requests;
    assert!(close(r.first_scheduled_s[0], 1.002));
    assert!(close(r.first_token_s[0], 1.052));
    assert!(close(r.finish_s[0], 1.052 + 2.0 * 0.013));
    assert_eq!((r.output_tokens[0], r.prompt_tokens[0]), (3, 40));
    assert_eq!(out.num_steps, 3);
    assert!(out.finished);
    assert_eq!(out.decisions.num_tokens, [40, 1, 1]);
    assert_eq!(out.steps.num_prefill_tokens, [40, 0, 0]);
    assert_eq!(out.steps.num_decode_tokens, [0, 1, 1]);
}

#[test]
fn async_scheduling_hides_the_overhead_behind_the_device() {
    let w = workload(&[0.0], &[40], &[3]);
    let out = simulate(config(true), &w, &clock(), &options(), None).unwrap();
    let r = &out.requests;
    // Launched after one overhead, then back to back on the device.
    assert!(close(r.first_token_s[0], 0.052));
    assert!(close(r.finish_s[0], 0.052 + 2.0 * 0.011));
    let starts = &out.steps.start_s;
    assert!(
        close(starts[1], 0.052) && close(starts[2], 0.063),
        "{starts:?}"
    );
}

#[test]
fn an_idle_engine_jumps_to_the_next_arrival() {
    let w = workload(&[0.0, 100.0], &[16, 16], &[1, 1]);
    let out = simulate(config(false), &w, &clock(), &options(), None).unwrap();
    assert_eq!(out.num_steps, 2);
    assert!(close(out.requests.first_scheduled_s[1], 100.002));
    assert!(close(out.requests.finish_s[1], 100.002 + 0.026));
}

#[test]
fn a_request_arriving_during_a_step_waits_for_the_next_schedule() {
    // The second arrives 1 ms into the first's 36 ms step.
    let w = workload(&[0.0, 0.003], &[24, 24], &[2, 2]);
    let out = simulate(config(false), &w, &clock(), &options(), None).unwrap();
    let d = &out.decisions;
    assert_eq!(&d.request[..1], [0]);
    assert_eq!(
        &d.request[d.offsets[1] as usize..d.offsets[2] as usize],
        [0, 1]
    );
    assert!(close(out.requests.first_scheduled_s[1], 0.036 + 0.002));
}

#[test]
fn a_shared_segment_is_a_prefix_cache_hit() {
    let mut w = workload(&[0.0, 10.0], &[32, 32], &[1, 1]);
    w.segment_keys[1] = w.segment_keys[0];
    let out = simulate(config(false), &w, &clock(), &options(), None).unwrap();
    // The whole 32-token prompt but its last block's last token (vLLM
    // always computes the last prompt token): two 16-token blocks, the
    // second recomputed, so one block hits.
    assert_eq!(out.requests.prefix_hit_tokens, [0, 16]);
}

#[test]
fn a_cache_too_small_for_max_model_len_is_refused() {
    let mut c = config(false);
    c.cache.num_blocks = 8;
    let w = workload(&[0.0], &[16], &[1]);
    let e = simulate(c, &w, &clock(), &options(), None).unwrap_err();
    assert!(e.to_string().contains("num_blocks = 8"), "{e}");
}

#[test]
fn preemptions_are_counted_per_request() {
    let mut c = config(false);
    c.cache.num_blocks = 17; // 256 tokens: one max_model_len sequence
    let w = workload(&[0.0, 0.0, 0.0], &[100, 100, 100], &[100, 100, 100]);
    let out = simulate(c, &w, &clock(), &options(), None).unwrap();
    assert!(out.finished);
    assert!(out.requests.preemptions.iter().sum::<u32>() > 0);
    assert_eq!(out.requests.output_tokens, [100, 100, 100]);
}
