//! The simulation loop: a workload's requests arrive on a simulated clock,
//! the scheduler decides each step, the step model says how long the step
//! runs, and every sampling row gets a token, all in Rust.
//!
//! The clock follows vLLM's engine loop. Requests that arrived by the time
//! a `schedule()` call happens are added before it. A step launches after
//! the engine's CPU overhead, once the device is free, and runs for what
//! the step model says; its tokens exist when it ends.
//!
//! - Synchronous: step N's output is applied when it ends, and the next
//!   `schedule()` happens then: steps are `overhead + model` apart.
//! - Async (vLLM's `AsyncScheduler` with its batch queue of two): step N+1
//!   is scheduled once step N is launched and step N−1's output applied,
//!   so the overhead hides behind the device's work; outputs are applied
//!   one step late, in order.
//!
//! When nothing is unfinished and nothing is in flight, the clock jumps to
//! the next arrival (an idle engine does no steps).

use super::metrics::{Decisions, RequestRecords, StepSeries};
use super::step_time::{BatchShape, StepTime};
use super::trace_writer::TraceWriter;
use super::workload::Workload;
use crate::error::Error;
use crate::request::{NewRequest, StopRules};
use crate::scheduler::Scheduler;
use crate::scheduler_config::SchedulerConfig;
use crate::step::{Kind, StepOutput};

/// What to record besides the per-request times.
#[derive(Clone, Debug, Default)]
pub struct SimOptions {
    /// The token every sampling row gets (the workload's lengths decide
    /// when a request ends, not its tokens).
    pub sampled_token: u32,
    pub record_steps: bool,
    pub record_decisions: bool,
    /// Stop after this many steps (a safety net for huge runs); None runs
    /// until every request finished.
    pub max_steps: Option<u64>,
}

/// What a run produced.
#[derive(Clone, Debug, Default)]
pub struct SimOutput {
    pub requests: RequestRecords,
    pub steps: StepSeries,
    pub decisions: Decisions,
    pub num_steps: u64,
    /// The clock when the last step ended.
    pub end_s: f64,
    /// Every request finished (false when `max_steps` stopped the run).
    pub finished: bool,
}

/// A step launched and not yet applied: when it ends on the device.
struct InFlight {
    step: StepOutput,
    end_s: f64,
}

struct Run<'a> {
    sched: Scheduler,
    workload: &'a Workload,
    time: &'a StepTime,
    options: &'a SimOptions,
    out: SimOutput,
    /// The workload index of the request in each scheduler slot.
    slot_request: Vec<u32>,
    next_request: usize,
    prompt: Vec<u32>,
    trace: Option<&'a mut TraceWriter>,
}

/// Run `workload` through a fresh scheduler built from `config`, on the
/// clock of `time`.
pub fn simulate(
    config: SchedulerConfig,
    workload: &Workload,
    time: &StepTime,
    options: &SimOptions,
    trace: Option<&mut TraceWriter>,
) -> Result<SimOutput, Error> {
    workload.validate()?;
    time.validate()?;
    check_fits(&config, workload)?;
    if trace.is_some() && config.async_scheduling {
        return Err(Error::invalid(
            "trace: an ironbatch-trace/1 file describes synchronous scheduling only \
             (async_scheduling must be false)",
        ));
    }
    let prompt_tokens = (0..workload.len())
        .map(|i| workload.prompt_len(i) as u64)
        .collect();
    let mut run = Run {
        sched: Scheduler::new(config)?,
        workload,
        time,
        options,
        out: SimOutput {
            requests: RequestRecords::new(&workload.arrival_s, prompt_tokens),
            ..Default::default()
        },
        slot_request: Vec::new(),
        next_request: 0,
        prompt: Vec::new(),
        trace,
    };
    if let Some(t) = run.trace.as_deref_mut() {
        t.header(run.sched.config())?;
    }
    run.run()?;
    Ok(run.out)
}

/// vLLM's start-up check: the cache must hold one `max_model_len` sequence
/// (else a lone long request would preempt itself forever); and no prompt
/// may reach `max_model_len` (vLLM refuses such a request).
fn check_fits(config: &SchedulerConfig, workload: &Workload) -> Result<(), Error> {
    let c = &config.cache;
    let usable = c.num_blocks.saturating_sub(1) * c.block_size;
    if usable < config.max_model_len {
        return Err(Error::invalid(format!(
            "num_blocks = {} holds {usable} tokens at block_size {}; it must hold one \
             max_model_len ({}) sequence besides the null block",
            c.num_blocks, c.block_size, config.max_model_len
        )));
    }
    for i in 0..workload.len() {
        let len = workload.prompt_len(i);
        if len >= config.max_model_len {
            return Err(Error::invalid(format!(
                "request {i} has a {len}-token prompt; it must be shorter than max_model_len ({})",
                config.max_model_len
            )));
        }
    }
    Ok(())
}

impl Run<'_> {
    fn run(&mut self) -> Result<(), Error> {
        let n = self.workload.len();
        let async_scheduling = self.sched.config().async_scheduling;
        // When the next schedule() call happens, and when the device is free.
        let mut now = 0.0_f64;
        let mut device_free = 0.0_f64;
        let mut in_flight: Option<InFlight> = None;
        loop {
            if self.sched.num_unfinished_requests() == 0 {
                if let Some(f) = in_flight.take() {
                    self.apply(&f.step, f.end_s)?;
                    now = now.max(f.end_s);
                    continue;
                }
                if self.next_request == n {
                    self.out.finished = true;
                    break;
                }
                now = now.max(self.workload.arrival_s[self.next_request]);
            }
            if self
                .options
                .max_steps
                .is_some_and(|m| self.out.num_steps >= m)
            {
                break;
            }
            self.add_arrivals(now)?;
            let step = self.sched.schedule();
            let shape = BatchShape::of(&step);
            if shape.num_requests == 0 && in_flight.is_none() {
                // Nothing runs and nothing is in flight: only an arrival can
                // change that (no request fits otherwise).
                if self.next_request == n {
                    return Err(Error::invalid(format!(
                        "the simulation stalled at {now} s: {} requests are unfinished and \
                         none can be scheduled",
                        self.sched.num_unfinished_requests()
                    )));
                }
                now = now.max(self.workload.arrival_s[self.next_request]);
                continue;
            }
            let start = (now + self.time.overhead_s(shape.num_requests)).max(device_free);
            let end = start + self.time.model_s(&shape);
            device_free = end;
            self.record_step(&step, &shape, start, end - start);
            if async_scheduling {
                // Schedule the next step once this one is launched and the
                // one before it applied.
                now = start;
                if let Some(f) = in_flight.take() {
                    self.apply(&f.step, f.end_s)?;
                    now = now.max(f.end_s);
                }
                in_flight = Some(InFlight { step, end_s: end });
            } else {
                self.apply(&step, end)?;
                now = end;
            }
        }
        self.out.end_s = device_free;
        Ok(())
    }

    /// Add every request that arrived by `now`, in order.
    fn add_arrivals(&mut self, now: f64) -> Result<(), Error> {
        let w = self.workload;
        while self.next_request < w.len() && w.arrival_s[self.next_request] <= now {
            let i = self.next_request;
            w.prompt_into(i, &mut self.prompt);
            let new = NewRequest {
                request_id: i.to_string(),
                prompt_token_ids: std::mem::take(&mut self.prompt),
                stop: StopRules {
                    max_tokens: w.output_tokens[i],
                    min_tokens: 0,
                    eos_token_id: None,
                    stop_token_ids: Vec::new(),
                    repetition: None,
                },
                priority: 0,
                arrival_time: w.arrival_s[i],
                cache_salt: None,
                lora: None,
                mm_inputs: Vec::new(),
                prompt_embeds_digests: None,
                skip_reading_prefix_cache: false,
                structured_output: false,
                report_hits: false,
                resumable: false,
            };
            if let Some(t) = self.trace.as_deref_mut() {
                t.note_add(&new);
            }
            let slot = self.sched.add_request(new)? as usize;
            if self.slot_request.len() <= slot {
                self.slot_request.resize(slot + 1, u32::MAX);
            }
            self.slot_request[slot] = i as u32;
            self.next_request += 1;
        }
        Ok(())
    }

    fn record_step(&mut self, step: &StepOutput, shape: &BatchShape, start: f64, duration: f64) {
        let r = &mut self.out.requests;
        for e in &step.entries {
            let i = self.slot_request[e.slot as usize] as usize;
            if e.kind == Kind::New {
                r.first_scheduled_s[i] = start;
                r.prefix_hit_tokens[i] = e.num_computed_tokens as u64;
            }
        }
        for id in &step.preempted_req_ids {
            r.preemptions[request_index(id)] += 1;
        }
        if self.options.record_decisions {
            let d = &mut self.out.decisions;
            for e in &step.entries {
                d.request.push(self.slot_request[e.slot as usize]);
                d.num_tokens.push(e.num_tokens as u32);
            }
            d.offsets.push(d.request.len() as u64);
        }
        if self.options.record_steps {
            let (running, waiting) = self.sched.request_counts();
            let s = &mut self.out.steps;
            s.start_s.push(start);
            s.duration_s.push(duration);
            s.num_scheduled_reqs.push(shape.num_requests as u32);
            s.num_prefill_tokens.push(shape.num_prefill_tokens as u32);
            s.num_decode_tokens.push(shape.num_decode_tokens as u32);
            s.num_running.push(running as u32);
            s.num_waiting.push(waiting as u32);
            s.kv_usage.push(self.sched.kv().usage() as f32);
            s.num_preempted.push(step.preempted_req_ids.len() as u32);
        }
        self.out.num_steps += 1;
    }

    /// The step's tokens arrive at `end_s`: one per sampling row.
    fn apply(&mut self, step: &StepOutput, end_s: f64) -> Result<(), Error> {
        let token = self.options.sampled_token;
        let mut tokens = Vec::with_capacity(step.entries.len());
        let mut offsets = Vec::with_capacity(step.entries.len() + 1);
        offsets.push(0);
        for e in &step.entries {
            if e.samples {
                tokens.push(token);
            }
            offsets.push(tokens.len());
        }
        let update = self.sched.update_from_output(step, &tokens, &offsets)?;
        let r = &mut self.out.requests;
        let mut start = 0;
        for rec in &update.records {
            let i = self.slot_request[rec.slot as usize] as usize;
            r.output_tokens[i] += (rec.tokens_end - start) as u64;
            start = rec.tokens_end;
            if r.first_token_s[i].is_nan() {
                r.first_token_s[i] = end_s;
            }
        }
        for f in &update.finished {
            r.finish_s[request_index(&f.request_id)] = end_s;
        }
        if let Some(t) = self.trace.as_deref_mut() {
            t.step(
                step,
                &tokens,
                &offsets,
                &update,
                &self.slot_request,
                &self.sched,
            )?;
        }
        Ok(())
    }
}

/// The workload index a request id names (the loop names requests by it).
fn request_index(id: &str) -> usize {
    id.parse()
        .expect("the simulation names requests by their index")
}
