//! The core's steady decode step alone, without Python: N requests
//! prefilled and decoding (one token each per step), timed over
//! `Scheduler::schedule` + `Scheduler::update_from_output`, warm and after
//! reading a buffer larger than L2 (the state a step finds after the
//! model's host work or another scheduler's step). The Python façade's
//! share is what `benches/cold_step.py` adds on top.
//!
//!     cargo bench --bench decode_step [-- RUNNING [STEPS [EVICT_KIB [EVICT_EVERY]]]]
//!
//! Every `EVICT_EVERY`-th step is a cold one (default 2: warm and cold in
//! turn; 1: every step cold, as `decode_instructions.sh` counts misses).

use ironbatch::{KvCacheConfig, NewRequest, Policy, Runner, Scheduler, SchedulerConfig, StopRules};
use std::time::Instant;

const BLOCK_SIZE: usize = 16;
const PROMPT: usize = 512;

fn scheduler(running: usize) -> Scheduler {
    let max_model_len = 8192;
    Scheduler::new(SchedulerConfig {
        max_num_seqs: running,
        max_num_batched_tokens: 8192.max(running),
        max_num_scheduled_tokens: 8192.max(running),
        max_num_active_seqs: running,
        max_model_len,
        enable_chunked_prefill: true,
        long_prefill_token_threshold: 0,
        long_prefill_token_threshold_adaptive: false,
        watermark_blocks: 0,
        policy: Policy::Fcfs,
        scheduler_reserve_full_isl: true,
        async_scheduling: false,
        prefill_schedule_interval: 1,
        decode_stagger: 0,
        num_speculative_tokens: 0,
        num_draft_slots: 0,
        drafts_by_batch_size: None,
        max_loras: None,
        drafter_read_ahead: 0,
        encoder: None,
        runner: Runner::Generate,
        cache: KvCacheConfig::new(
            running * (max_model_len / BLOCK_SIZE) + 1,
            BLOCK_SIZE,
            max_model_len,
            true,
        ),
    })
    .expect("a valid config")
}

fn request(i: usize) -> NewRequest {
    NewRequest {
        request_id: format!("r{i}"),
        // Distinct prompts: no prefix hits.
        prompt_token_ids: (0..PROMPT as u32).map(|k| (i as u32) << 12 | k).collect(),
        stop: StopRules {
            max_tokens: 7000,
            min_tokens: 0,
            eos_token_id: Some(2),
            stop_token_ids: vec![],
            repetition: None,
        },
        priority: 0,
        arrival_time: i as f64,
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

/// One step: schedule, then one sampled token (never a stop) per sampling row.
fn step(s: &mut Scheduler, tokens: &mut Vec<u32>, offsets: &mut Vec<usize>) -> usize {
    let out = s.schedule();
    tokens.clear();
    offsets.clear();
    offsets.push(0);
    for e in &out.entries {
        if e.samples {
            tokens.push(1000);
        }
        offsets.push(tokens.len());
    }
    s.update_from_output(&out, tokens, offsets)
        .expect("a valid update");
    out.entries.len()
}

/// The timed step, apart from the prefill's (a profiler's toggle: valgrind
/// --toggle-collect='*timed_step*').
#[inline(never)]
fn timed_step(s: &mut Scheduler, tokens: &mut Vec<u32>, offsets: &mut Vec<usize>) -> usize {
    step(s, tokens, offsets)
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * q) as usize]
}

fn main() {
    let mut args = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse::<usize>().ok());
    let running = args.next().unwrap_or(1024);
    let steps = args.next().unwrap_or(2000);
    // 2 MiB: L2 holds none of the step's lines; past 32 MiB, nor does L3.
    let evict_kib = args.next().unwrap_or(2048);
    let evict_every = args.next().unwrap_or(2).max(1);
    let mut s = scheduler(running);
    for i in 0..running {
        s.add_request(request(i)).expect("a valid request");
    }
    let (mut tokens, mut offsets) = (Vec::new(), Vec::new());
    // Prefill until every request decodes alone.
    while step(&mut s, &mut tokens, &mut offsets) < running
        || s.request(0).unwrap().seq.num_computed_tokens < PROMPT
    {}
    let mut buffer = vec![1u64; evict_kib * 1024 / 8];
    let (mut warm, mut cold) = (Vec::new(), Vec::new());
    for k in 0..steps {
        let evict = k % evict_every == evict_every - 1;
        if evict {
            let mut sum = 0u64;
            for v in buffer.iter_mut() {
                sum = sum.wrapping_add(*v);
                *v = sum;
            }
            std::hint::black_box(sum);
        }
        let start = Instant::now();
        let rows = timed_step(&mut s, &mut tokens, &mut offsets);
        let us = start.elapsed().as_nanos() as f64 / 1e3;
        assert_eq!(rows, running, "every request decodes every step");
        if evict { &mut cold } else { &mut warm }.push(us);
    }
    for v in [&mut warm, &mut cold] {
        v.sort_by(f64::total_cmp);
        if v.is_empty() {
            v.push(f64::NAN); // every step cold (or none): no median to show
        }
    }
    println!("| running | warm median (p90) µs | cold median (p90) µs | warm ns/request |");
    println!("|---|---|---|---|");
    println!(
        "| {running} | {:.1} ({:.1}) | {:.1} ({:.1}) | {:.0} |",
        percentile(&warm, 0.5),
        percentile(&warm, 0.9),
        percentile(&cold, 0.5),
        percentile(&cold, 0.9),
        percentile(&warm, 0.5) * 1e3 / running as f64,
    );
}
