//! The scheduler (spec §4–6): vLLM 0.33's V1 continuous batching.
//!
//! There is no prefill phase and no decode phase. Every request is behind by
//! `num_tokens − num_computed_tokens` tokens, and each step hands out a token
//! budget to close those gaps: first to running requests, in order, then to
//! waiting ones. A running request that cannot get a block preempts a victim
//! (its blocks freed, its tokens recomputed later).
//!
//! Requests live in a slab indexed by [`Slot`]; a slot's generation changes
//! when it is freed, so a step's output applied late never touches a request
//! that reused the slot.

use crate::block::BlockId;
use crate::error::KvError;
use crate::kv_cache_manager::KvCacheManager;
use crate::limits::{check_range, MAX_TOKENS};
use crate::prefix_cache_stats::PrefixCacheStats;
use crate::request::{NewRequest, Request, RequestStatus};
use crate::request_queue::{Slot, WaitingQueue};
use crate::scheduler_config::{Policy, SchedulerConfig};
use crate::sequence::Sequence;
use crate::step::{Finished, Kind, StepEntry, StepOutput, UpdateOutput, UpdateRecord};
use crate::stop_check::check_stop;
use rustc_hash::FxHashMap;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};

static NEXT_SCHEDULER_ID: AtomicU64 = AtomicU64::new(1);

/// What `make_stats` reports (spec §7.10).
#[derive(Clone, Debug, PartialEq)]
pub struct SchedulerStats {
    pub num_running_reqs: usize,
    /// Waiting and not skipped by a waiting pass since.
    pub num_waiting_reqs: usize,
    /// Waiting, skipped by a waiting pass (output in flight) and not
    /// admitted since.
    pub num_skipped_waiting_reqs: usize,
    pub kv_cache_usage: f64,
    pub prefix_cache_stats: PrefixCacheStats,
    /// Preemptions since the stats were last taken.
    pub num_preempted_reqs: u64,
}

/// vLLM's pause states (`PauseState`): what a paused scheduler still does.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub enum Pause {
    /// Schedules as usual.
    #[default]
    Unpaused,
    /// Admits nobody; running requests go on.
    New,
    /// Schedules nothing (steps still report finished and preempted ids).
    All,
}

/// vLLM 0.33's V1 scheduler.
#[derive(Debug)]
pub struct Scheduler {
    config: SchedulerConfig,
    kv: KvCacheManager,
    slab: Vec<Option<Request>>,
    generations: Vec<u32>,
    free_slots: Vec<Slot>,
    ids: FxHashMap<String, Slot>,
    waiting: WaitingQueue,
    running: Vec<Slot>,
    finished_ids: Vec<String>,
    preempted_ids: Vec<String>,
    num_preempted: u64,
    num_deferred: usize,
    pause: Pause,
    id: u64,
    next_step: u64,
    pending_steps: VecDeque<u64>,
    hits: Vec<BlockId>,
}

fn err(msg: String) -> KvError {
    KvError::Invalid(msg)
}

impl Scheduler {
    /// A scheduler over a fresh KV cache.
    pub fn new(config: SchedulerConfig) -> Result<Self, KvError> {
        config.validate()?;
        let kv = KvCacheManager::new(&config.cache)?;
        let waiting = match config.policy {
            Policy::Fcfs => WaitingQueue::Fcfs(VecDeque::new()),
            Policy::Priority => WaitingQueue::Priority(Default::default()),
        };
        Ok(Scheduler {
            config,
            kv,
            slab: Vec::new(),
            generations: Vec::new(),
            free_slots: Vec::new(),
            ids: FxHashMap::default(),
            waiting,
            running: Vec::new(),
            finished_ids: Vec::new(),
            preempted_ids: Vec::new(),
            num_preempted: 0,
            num_deferred: 0,
            pause: Pause::Unpaused,
            id: NEXT_SCHEDULER_ID.fetch_add(1, Ordering::Relaxed),
            next_step: 0,
            pending_steps: VecDeque::new(),
            hits: Vec::new(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    /// The KV-cache manager, for inspection.
    pub fn kv(&self) -> &KvCacheManager {
        &self.kv
    }

    /// The live request in `slot`.
    pub fn request(&self, slot: Slot) -> Option<&Request> {
        self.slab.get(slot as usize)?.as_ref()
    }

    /// Whether the request a step entry scheduled is still live (not
    /// finished, its slot not reused).
    pub fn is_live(&self, entry: &StepEntry) -> bool {
        self.generations.get(entry.slot as usize) == Some(&entry.generation)
            && self.request(entry.slot).is_some()
    }

    /// The slot of the live request `request_id`.
    pub fn slot_of(&self, request_id: &str) -> Option<Slot> {
        self.ids.get(request_id).copied()
    }

    /// Running requests, in order.
    pub fn running(&self) -> &[Slot] {
        &self.running
    }

    /// Waiting requests, in admission order.
    pub fn waiting(&self) -> impl Iterator<Item = Slot> + '_ {
        self.waiting.iter()
    }

    /// Pause or resume scheduling (vLLM's `set_pause_state`).
    pub fn set_pause(&mut self, pause: Pause) {
        self.pause = pause;
    }

    /// The pause state.
    pub fn pause(&self) -> Pause {
        self.pause
    }

    /// (running, waiting) request counts.
    pub fn request_counts(&self) -> (usize, usize) {
        (self.running.len(), self.waiting.len())
    }

    /// Unfinished requests.
    pub fn num_unfinished_requests(&self) -> usize {
        self.running.len() + self.waiting.len()
    }

    fn req(&self, slot: Slot) -> &Request {
        self.slab[slot as usize].as_ref().expect("a live slot")
    }

    fn req_mut(&mut self, slot: Slot) -> &mut Request {
        self.slab[slot as usize].as_mut().expect("a live slot")
    }

    /// Queue a request; returns its slot. Rejected with nothing changed: a
    /// live duplicate id, an empty prompt, a prompt of `max_model_len` or
    /// more tokens, `max_tokens < 1`, `min_tokens > max_tokens`, a NaN
    /// arrival time.
    pub fn add_request(&mut self, new: NewRequest) -> Result<Slot, KvError> {
        let max_len = self.config.max_model_len;
        let id = &new.request_id;
        if self.ids.contains_key(id) {
            return Err(err(format!(
                "request_id {id:?} is already in the scheduler"
            )));
        }
        if new.prompt_token_ids.is_empty() {
            return Err(err(format!(
                "prompt_token_ids of request {id:?} must not be empty"
            )));
        }
        if new.prompt_token_ids.len() >= max_len {
            return Err(err(format!(
                "prompt_token_ids of request {id:?} has {} tokens; it must be shorter than \
                 max_model_len ({max_len})",
                new.prompt_token_ids.len()
            )));
        }
        check_range("max_tokens", new.stop.max_tokens, 1, MAX_TOKENS)?;
        if new.stop.min_tokens > new.stop.max_tokens {
            return Err(err(format!(
                "min_tokens must be in [0, max_tokens={}], got {}",
                new.stop.max_tokens, new.stop.min_tokens
            )));
        }
        if new.arrival_time.is_nan() {
            return Err(err("arrival_time must not be NaN".into()));
        }
        let seq = Sequence::new(
            new.prompt_token_ids,
            new.cache_salt.as_deref(),
            self.kv.hasher(),
            self.kv.block_size(),
        );
        let request = Request {
            request_id: new.request_id,
            stop: new.stop,
            priority: new.priority,
            arrival_time: new.arrival_time + 0.0, // -0.0 orders as 0.0, as in Python
            seq,
            table: Default::default(),
            status: RequestStatus::Waiting,
            stop_reason: None,
            num_preemptions: 0,
            in_flight_tokens: 0,
            stale_tokens: 0,
            drop_stale: false,
            num_output_placeholders: 0,
            deferred: false,
        };
        let slot = match self.free_slots.pop() {
            Some(s) => s,
            None => {
                self.slab.push(None);
                self.generations.push(0);
                (self.slab.len() - 1) as Slot
            }
        };
        self.ids.insert(request.request_id.clone(), slot);
        self.waiting.add(slot, &request);
        self.slab[slot as usize] = Some(request);
        Ok(slot)
    }

    /// End requests from outside (spec §6): unknown and repeated ids are
    /// ignored; the rest are freed in the order given. Returns their slots.
    pub fn finish_requests<S: AsRef<str>>(
        &mut self,
        request_ids: &[S],
        status: RequestStatus,
    ) -> Vec<Slot> {
        let mut found: Vec<Slot> = Vec::new();
        for id in request_ids {
            if let Some(&slot) = self.ids.get(id.as_ref()) {
                if !found.contains(&slot) {
                    found.push(slot);
                }
            }
        }
        for &slot in &found {
            if self.req(slot).status == RequestStatus::Running {
                if let Some(i) = self.running.iter().position(|&s| s == slot) {
                    self.running.remove(i);
                }
            } else {
                let r = self.slab[slot as usize].as_ref().expect("a live slot");
                self.waiting.remove(slot, r);
            }
        }
        for &slot in &found {
            self.req_mut(slot).status = status;
            self.free_request(slot);
        }
        found
    }

    fn free_request(&mut self, slot: Slot) {
        let mut r = self.slab[slot as usize].take().expect("a live slot");
        self.num_deferred -= r.deferred as usize;
        self.kv.free(&mut r.table);
        self.ids.remove(&r.request_id);
        self.generations[slot as usize] = self.generations[slot as usize].wrapping_add(1);
        self.free_slots.push(slot);
        self.finished_ids.push(r.request_id);
    }

    /// One scheduling decision (spec §4).
    pub fn schedule(&mut self) -> Result<StepOutput, KvError> {
        let c = &self.config;
        let (max_len, policy) = (c.max_model_len, c.policy);
        let mut budget = match self.pause {
            Pause::All => 0,
            _ => c.max_num_batched_tokens,
        };
        // Q1: with a single request in the system the threshold is off.
        let threshold = if self.running.len() + self.waiting.len() > 1 {
            c.long_prefill_token_threshold
        } else {
            0
        };
        let mut entries: Vec<StepEntry> = Vec::with_capacity(self.running.len() + 4);
        let mut preempted_any = false;

        // RUNNING pass: every running request catches up, in order.
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let slot = self.running[i];
            let r = self.req(slot);
            let computed = r.seq.num_computed_tokens;
            let placeholders = r.num_output_placeholders;
            // Async: the token in flight is its last one (max_tokens), so
            // another step could only compute a position nobody samples.
            if placeholders > 0
                && computed + 2 >= placeholders + r.seq.num_prompt_tokens() + r.stop.max_tokens
            {
                i += 1;
                continue;
            }
            let mut n = r.num_tokens() + placeholders - computed;
            if threshold > 0 && threshold < n {
                n = threshold;
            }
            n = n.min(budget).min((max_len - 1).saturating_sub(computed));
            if n == 0 {
                i += 1; // nothing to compute this step (Q17): skip, don't stop
                continue;
            }
            let grown = loop {
                let r = self.slab[slot as usize].as_mut().expect("a live slot");
                if let Some(k) = self
                    .kv
                    .allocate_slots(&mut r.table, &r.seq, n, 0, &[], false)?
                {
                    break Some(k);
                }
                let (victim, cursor, refund) = self.take_victim(slot, i, &mut entries);
                i = cursor;
                budget += refund;
                self.preempt(victim, false);
                preempted_any = true;
                if victim == slot {
                    break None;
                }
            };
            let Some(k) = grown else {
                if policy == Policy::Priority {
                    continue; // r preempted itself; running[i] is the next one (Q10)
                }
                break; // FCFS: the pass ends
            };
            let r = self.req(slot);
            entries.push(StepEntry {
                slot,
                generation: self.generations[slot as usize],
                num_tokens: n,
                kind: Kind::Running,
                num_computed_tokens: computed,
                samples: computed + n >= r.num_tokens(),
                block_start: r.table.len() - k,
            });
            budget -= n;
            i += 1;
        }

        // WAITING pass: only if nobody was preempted (Q5).
        if !preempted_any && self.pause == Pause::Unpaused {
            self.admit_waiting(budget, threshold, &mut entries)?;
        }
        Ok(self.finish_step(entries))
    }

    fn admit_waiting(
        &mut self,
        mut budget: usize,
        threshold: usize,
        entries: &mut Vec<StepEntry>,
    ) -> Result<(), KvError> {
        let c = &self.config;
        let (max_num_seqs, chunked, gate) = (
            c.max_num_seqs,
            c.enable_chunked_prefill,
            c.scheduler_reserve_full_isl,
        );
        let mut skipped: Vec<Slot> = Vec::new();
        while budget > 0 && !self.waiting.is_empty() {
            if self.running.len() >= max_num_seqs {
                break;
            }
            let slot = self.waiting.peek().expect("not empty");
            let r = self.slab[slot as usize].as_mut().expect("a live slot");
            if r.stale_tokens > 0 && !r.drop_stale {
                // Its output is still in flight (spec §5.4): skip it.
                if !r.deferred {
                    r.deferred = true;
                    self.num_deferred += 1;
                }
                self.waiting.pop();
                skipped.push(slot);
                continue;
            }
            self.hits.clear();
            let hit_tokens = self.kv.get_computed_blocks(&r.seq, &mut self.hits);
            let mut n = r.num_tokens() - hit_tokens;
            if threshold > 0 && threshold < n {
                n = threshold;
            }
            if !chunked && n > budget {
                break; // Q6: the head blocks the queue
            }
            n = n.min(budget);
            let grown =
                self.kv
                    .allocate_slots(&mut r.table, &r.seq, n, hit_tokens, &self.hits, gate)?;
            if grown.is_none() {
                break; // r stays at the head
            }
            self.kv
                .record_prefix_cache_stats(r.num_tokens(), hit_tokens, r.num_preemptions > 0);
            let kind = if r.status == RequestStatus::Waiting {
                Kind::New
            } else {
                Kind::Resumed
            };
            r.status = RequestStatus::Running;
            r.seq.num_computed_tokens = hit_tokens;
            if r.deferred {
                r.deferred = false;
                self.num_deferred -= 1;
            }
            let samples = hit_tokens + n >= r.num_tokens();
            self.waiting.pop();
            self.running.push(slot);
            entries.push(StepEntry {
                slot,
                generation: self.generations[slot as usize],
                num_tokens: n,
                kind,
                num_computed_tokens: hit_tokens,
                samples,
                block_start: 0,
            });
            budget -= n;
        }
        // Skipped requests go back to the head, keeping their order (Q11).
        for &slot in skipped.iter().rev() {
            let r = self.slab[slot as usize].as_ref().expect("a live slot");
            self.waiting.prepend(slot, r);
        }
        Ok(())
    }

    /// Remove the victim from `running` (spec §4.3); returns it, the cursor
    /// after the removal and the budget an undone entry gives back.
    fn take_victim(
        &mut self,
        current: Slot,
        i: usize,
        entries: &mut Vec<StepEntry>,
    ) -> (Slot, usize, usize) {
        if self.config.policy == Policy::Fcfs {
            // The last one: never already scheduled (the pass walks forward).
            let victim = self.running.pop().expect("current is running");
            return (victim, i, 0);
        }
        // The largest (priority, arrival_time); the earliest in running on ties.
        let mut v = 0;
        for (k, &slot) in self.running.iter().enumerate() {
            let (cand, best) = (self.req(slot), self.req(self.running[v]));
            let greater = cand.priority > best.priority
                || (cand.priority == best.priority && cand.arrival_time > best.arrival_time);
            if greater {
                v = k;
            }
        }
        let victim = self.running.remove(v);
        let cursor = if v < i { i - 1 } else { i };
        let mut refund = 0;
        if victim != current {
            if let Some(e) = entries.iter().position(|e| e.slot == victim) {
                refund = entries.remove(e).num_tokens;
            }
        }
        (victim, cursor, refund)
    }

    /// Recompute-style preemption (spec §4.4); `slot` already left running.
    fn preempt(&mut self, slot: Slot, drop_stale: bool) {
        let r = self.slab[slot as usize].as_mut().expect("a live slot");
        self.kv.free(&mut r.table);
        r.status = RequestStatus::Preempted;
        r.seq.num_computed_tokens = 0;
        r.num_preemptions += 1;
        r.drop_stale = drop_stale || (r.drop_stale && r.stale_tokens > 0);
        r.stale_tokens = r.in_flight_tokens;
        r.num_output_placeholders = 0;
        self.waiting.prepend(slot, r);
        if !self.preempted_ids.contains(&r.request_id) {
            self.preempted_ids.push(r.request_id.clone());
        }
        self.num_preempted += 1;
    }

    /// Write the model runner's columns and advance every scheduled request
    /// (optimistically, before the step runs).
    fn finish_step(&mut self, entries: Vec<StepEntry>) -> StepOutput {
        let total: usize = entries.iter().map(|e| e.num_tokens).sum();
        debug_assert!(total <= self.config.max_num_batched_tokens);
        debug_assert!(self.running.len() <= self.config.max_num_seqs);
        let n = entries.len();
        let mut out = StepOutput {
            req_slots: Vec::with_capacity(n),
            num_scheduled: Vec::with_capacity(n),
            num_computed_tokens: Vec::with_capacity(n),
            kinds: Vec::with_capacity(n),
            samples: Vec::with_capacity(n),
            num_output_tokens: Vec::with_capacity(n),
            positions: Vec::with_capacity(total),
            slot_mapping: Vec::with_capacity(total),
            query_start_loc: Vec::with_capacity(entries.len() + 1),
            seq_lens: Vec::with_capacity(entries.len()),
            new_block_offsets: Vec::with_capacity(entries.len() + 1),
            ..Default::default()
        };
        out.query_start_loc.push(0);
        out.new_block_offsets.push(0);
        for e in &entries {
            out.req_slots.push(e.slot as i32);
            out.num_scheduled.push(e.num_tokens as i32);
            out.num_computed_tokens.push(e.num_computed_tokens as i32);
            out.kinds.push(e.kind as u8);
            out.samples.push(e.samples);
            let r = self.slab[e.slot as usize].as_mut().expect("a live slot");
            out.num_output_tokens
                .push((r.num_output_tokens() + r.num_output_placeholders) as i32);
            let table = &r.table;
            if e.block_start < table.len() {
                out.new_block_ids
                    .extend(table.block_ids()[e.block_start..].iter().map(|&b| b as i32));
            }
            out.new_block_offsets.push(out.new_block_ids.len() as i32);
            let (start, end) = (e.num_computed_tokens, e.num_computed_tokens + e.num_tokens);
            for p in start..end {
                out.positions.push(p as i64);
                out.slot_mapping.push(self.kv.slot_of(table, p));
            }
            out.query_start_loc.push(out.positions.len() as i32);
            out.seq_lens.push(end as i32);
            r.seq.num_computed_tokens += e.num_tokens;
            r.in_flight_tokens += e.num_tokens;
            if self.config.async_scheduling && !r.is_prefill_chunk() {
                r.num_output_placeholders += 1; // the token this step samples
            }
        }
        out.entries = entries;
        self.preempted_ids.sort_unstable();
        self.finished_ids.sort_unstable();
        out.preempted_req_ids = std::mem::take(&mut self.preempted_ids);
        out.finished_req_ids = std::mem::take(&mut self.finished_ids);
        out.scheduler_id = self.id;
        out.step_id = self.next_step;
        self.pending_steps.push_back(self.next_step);
        self.next_step += 1;
        out
    }

    /// Apply a step's sampled tokens (spec §5): entry `i` of `step` gets
    /// `tokens[offsets[i]..offsets[i + 1]]`. Checked first, so an `Err`
    /// changes nothing.
    pub fn update_from_output(
        &mut self,
        step: &StepOutput,
        tokens: &[u32],
        offsets: &[usize],
    ) -> Result<UpdateOutput, KvError> {
        self.check_update(step, tokens, offsets)?;
        self.pending_steps.retain(|&s| s != step.step_id);
        self.touch_ahead(step);
        let max_len = self.config.max_model_len;
        let bs = self.kv.block_size();
        let mut out = UpdateOutput::default();
        let mut stopped: Vec<(Slot, RequestStatus)> = Vec::new();
        for (i, e) in step.entries.iter().enumerate() {
            if self.generations[e.slot as usize] != e.generation {
                continue; // finished (and maybe reused) meanwhile: no output
            }
            let Some(r) = self.slab[e.slot as usize].as_mut() else {
                continue;
            };
            r.in_flight_tokens = r.in_flight_tokens.saturating_sub(e.num_tokens);
            let stale = r.stale_tokens > 0;
            if stale {
                r.stale_tokens = r.stale_tokens.saturating_sub(e.num_tokens);
                if r.drop_stale {
                    continue; // preempted by a reset: discarded (spec §5.4)
                }
            }
            let sampled = &tokens[offsets[i]..offsets[i + 1]];
            if sampled.is_empty() {
                continue; // a partial prefill: no output
            }
            let status_before = r.status;
            let placeholders = r.num_output_placeholders;
            let start = out.tokens.len();
            let mut finished = false;
            for &t in sampled {
                r.seq.append(&[t], self.kv.hasher(), bs);
                out.tokens.push(t);
                if check_stop(r, max_len) {
                    finished = true;
                    break;
                }
            }
            let emitted = out.tokens.len() - start;
            if finished && !stale {
                r.seq.num_computed_tokens -=
                    (sampled.len() - emitted).min(r.seq.num_computed_tokens);
            }
            if !stale && placeholders > 0 {
                // Every returned token resolves a placeholder, trimmed or not.
                r.num_output_placeholders = placeholders.saturating_sub(sampled.len());
                if status_before == RequestStatus::Running {
                    // The blocks the arrived tokens filled can be cached now.
                    let upto = r.seq.num_computed_tokens.saturating_sub(r.in_flight_tokens);
                    self.kv.cache_full_blocks(&mut r.table, &r.seq, upto);
                }
            }
            out.records.push(UpdateRecord {
                entry: i as u32,
                slot: e.slot,
                tokens_end: out.tokens.len(),
                cached_tokens: self.kv.num_cached_tokens(&r.table),
            });
            if finished {
                out.finished.push(Finished {
                    record: out.records.len() - 1,
                    request_id: r.request_id.clone(),
                    status: r.status,
                    stop_reason: r.stop_reason,
                    token_ids: r.seq.tokens().to_vec(),
                    num_computed_tokens: r.seq.num_computed_tokens,
                });
                stopped.push((e.slot, status_before));
                // Freed in scheduling order: this shapes the free queue (Q18).
                let r = self.slab[e.slot as usize].as_ref().expect("a live slot");
                if status_before != RequestStatus::Running {
                    self.waiting.remove(e.slot, r);
                }
                self.free_request(e.slot);
            }
        }
        if stopped.iter().any(|&(_, s)| s == RequestStatus::Running) {
            let gone: Vec<Slot> = stopped
                .iter()
                .filter(|&&(_, s)| s == RequestStatus::Running)
                .map(|&(slot, _)| slot)
                .collect();
            self.running.retain(|s| !gone.contains(s));
        }
        Ok(out)
    }

    /// Read each scheduled request's last token once, in a tight loop with
    /// no dependencies between requests, so the CPU has many cache misses in
    /// flight at once; the update loop below then finds the lines cached.
    fn touch_ahead(&self, step: &StepOutput) {
        let mut sum = 0u32;
        for e in &step.entries {
            if let Some(r) = self.slab.get(e.slot as usize).and_then(Option::as_ref) {
                sum = sum.wrapping_add(r.seq.tokens().last().copied().unwrap_or(0));
            }
        }
        std::hint::black_box(sum);
    }

    fn check_update(
        &self,
        step: &StepOutput,
        tokens: &[u32],
        offsets: &[usize],
    ) -> Result<(), KvError> {
        if step.scheduler_id != self.id {
            return Err(err("this step was scheduled by another scheduler".into()));
        }
        if !self.pending_steps.contains(&step.step_id) {
            return Err(err("this step's output was already applied".into()));
        }
        let n = step.entries.len();
        if offsets.len() != n + 1 {
            return Err(err(format!(
                "sampled: {} offsets for a step of {n} requests (need {})",
                offsets.len(),
                n + 1
            )));
        }
        if offsets[0] != 0 || offsets.windows(2).any(|w| w[0] > w[1]) || offsets[n] != tokens.len()
        {
            return Err(err(
                "sampled: offsets must rise from 0 to the number of tokens".into(),
            ));
        }
        for (i, e) in step.entries.iter().enumerate() {
            if offsets[i + 1] > offsets[i] && !e.samples {
                return Err(err(format!(
                    "sampled: entry {i} got tokens, but its step ended before the request's \
                     last known token"
                )));
            }
        }
        Ok(())
    }

    /// Forget every cached block hash (spec §7.10); refused (false) while a
    /// block is held. With `reset_running_requests`, every running request
    /// is preempted first (popping from the back) and its in-flight output
    /// dropped.
    pub fn reset_prefix_cache(&mut self, reset_running_requests: bool) -> Result<bool, KvError> {
        if reset_running_requests {
            while let Some(slot) = self.running.pop() {
                self.preempt(slot, true);
            }
        }
        let done = self.kv.reset_prefix_cache();
        if reset_running_requests && !done {
            return Err(err(
                "reset_prefix_cache failed with every request preempted".into(),
            ));
        }
        Ok(done)
    }

    /// Counts and usage; takes (and zeroes) the prefix-cache and preemption
    /// counters.
    pub fn make_stats(&mut self) -> SchedulerStats {
        SchedulerStats {
            num_running_reqs: self.running.len(),
            num_waiting_reqs: self.waiting.len() - self.num_deferred,
            num_skipped_waiting_reqs: self.num_deferred,
            kv_cache_usage: self.kv.usage(),
            prefix_cache_stats: self.kv.make_prefix_cache_stats(),
            num_preempted_reqs: std::mem::take(&mut self.num_preempted),
        }
    }
}

#[cfg(test)]
mod tests {
    //! Core-level checks of a few spec §9.2 scenarios (the full set runs on
    //! both backends in tests/test_scheduler_scenarios.py).
    use super::*;
    use crate::kv_cache_manager::KvCacheConfig;
    use crate::request::StopRules;

    fn scheduler(
        num_blocks: usize,
        max_model_len: usize,
        budget: usize,
        policy: Policy,
    ) -> Scheduler {
        Scheduler::new(SchedulerConfig {
            max_num_seqs: 4,
            max_num_batched_tokens: budget,
            max_model_len,
            enable_chunked_prefill: true,
            long_prefill_token_threshold: 0,
            policy,
            scheduler_reserve_full_isl: true,
            async_scheduling: false,
            cache: KvCacheConfig {
                num_blocks,
                block_size: 16,
                max_model_len,
                enable_prefix_caching: true,
            },
        })
        .unwrap()
    }

    fn add(s: &mut Scheduler, id: &str, tokens: std::ops::Range<u32>, priority: i64, arrival: f64) {
        s.add_request(NewRequest {
            request_id: id.into(),
            prompt_token_ids: tokens.collect(),
            stop: StopRules {
                max_tokens: 40,
                min_tokens: 0,
                eos_token_id: Some(2),
                stop_token_ids: vec![],
            },
            priority,
            arrival_time: arrival,
            cache_salt: None,
        })
        .unwrap();
    }

    /// (id, tokens, computed before, this step's block ids).
    type Row = (String, usize, usize, Vec<i32>);

    /// One step; every request that reached its last token samples 100.
    /// Returns (id, tokens, computed before, this step's block ids) and the
    /// preempted ids.
    fn step(s: &mut Scheduler) -> (Vec<Row>, Vec<String>) {
        let out = s.schedule().unwrap();
        let rows = out
            .entries
            .iter()
            .enumerate()
            .map(|(i, e)| {
                let blocks = &out.new_block_ids
                    [out.new_block_offsets[i] as usize..out.new_block_offsets[i + 1] as usize];
                let id = s.request(e.slot).unwrap().request_id.clone();
                (id, e.num_tokens, e.num_computed_tokens, blocks.to_vec())
            })
            .collect();
        let mut tokens = vec![];
        let mut offsets = vec![0];
        for e in &out.entries {
            if e.samples {
                tokens.push(100);
            }
            offsets.push(tokens.len());
        }
        s.update_from_output(&out, &tokens, &offsets).unwrap();
        assert!(
            s.update_from_output(&out, &tokens, &offsets).is_err(),
            "applied twice"
        );
        (rows, out.preempted_req_ids)
    }

    fn row(
        id: &str,
        n: usize,
        computed: usize,
        blocks: &[i32],
    ) -> (String, usize, usize, Vec<i32>) {
        (id.into(), n, computed, blocks.to_vec())
    }

    #[test]
    fn s4_fcfs_preempts_the_last_running_request() {
        let mut s = scheduler(11, 160, 512, Policy::Fcfs);
        add(&mut s, "a", 3..83, 0, 0.0);
        add(&mut s, "b", 103..183, 0, 0.0);
        let (rows, _) = step(&mut s);
        assert_eq!(
            rows,
            vec![
                row("a", 80, 0, &[1, 2, 3, 4, 5]),
                row("b", 80, 0, &[6, 7, 8, 9, 10])
            ]
        );
        let (rows, preempted) = step(&mut s);
        assert_eq!(rows, vec![row("a", 1, 80, &[10])]);
        assert_eq!(preempted, vec!["b".to_string()]);
        assert_eq!(s.kv().num_free_blocks(), 4);
    }

    #[test]
    fn s6_priority_self_preemption_continues_the_pass() {
        let mut s = scheduler(5, 64, 256, Policy::Priority);
        add(&mut s, "C", 3..33, 3, 1.0);
        step(&mut s);
        add(&mut s, "D", 103..134, 0, 2.0);
        step(&mut s);
        step(&mut s);
        let (rows, preempted) = step(&mut s);
        assert_eq!(rows, vec![row("D", 1, 32, &[2])]);
        assert_eq!(preempted, vec!["C".to_string()]);
    }

    #[test]
    fn async_placeholders_stop_at_max_tokens() {
        // Prompt of 20, max_tokens 2, the next step scheduled while the
        // previous one is in flight (as vLLM's engine runs async mode).
        let mut config = scheduler(11, 64, 256, Policy::Fcfs).config().clone();
        config.async_scheduling = true;
        let mut s = Scheduler::new(config).unwrap();
        s.add_request(NewRequest {
            request_id: "a".into(),
            prompt_token_ids: (3..23).collect(),
            stop: StopRules {
                max_tokens: 2,
                min_tokens: 0,
                eos_token_id: Some(2),
                stop_token_ids: vec![],
            },
            priority: 0,
            arrival_time: 0.0,
            cache_salt: None,
        })
        .unwrap();
        let mut s_a = s.schedule().unwrap();
        assert_eq!(s_a.entries[0].num_tokens, 20);
        // Position 20 holds the token step A samples: computed ahead of it.
        let s_b = s.schedule().unwrap();
        assert_eq!(
            (
                s_b.entries[0].num_tokens,
                s_b.entries[0].num_computed_tokens
            ),
            (1, 20)
        );
        assert_eq!(s_b.num_output_tokens, vec![1]); // one placeholder
        let up = s.update_from_output(&s_a, &[5], &[0, 1]).unwrap();
        assert!(up.finished.is_empty());
        // Step B samples the second and last token: nothing left to schedule.
        let s_c = s.schedule().unwrap();
        assert!(s_c.entries.is_empty());
        let up = s.update_from_output(&s_b, &[6], &[0, 1]).unwrap();
        assert_eq!(up.finished[0].status, RequestStatus::FinishedLengthCapped);
        s_a.step_id = u64::MAX; // a forged step is refused, not applied
        assert!(s.update_from_output(&s_a, &[5], &[0, 1]).is_err());
    }

    #[test]
    fn pause_states_hold_admissions_then_everything() {
        let mut s = scheduler(11, 64, 256, Policy::Fcfs);
        add(&mut s, "a", 3..13, 0, 0.0);
        step(&mut s); // a runs
        add(&mut s, "b", 20..30, 0, 1.0);
        s.set_pause(Pause::New); // running requests go on, nobody is admitted
        let (rows, _) = step(&mut s);
        assert_eq!(rows, vec![row("a", 1, 10, &[])]);
        s.set_pause(Pause::All); // nothing is scheduled, but aborts still flush
        s.finish_requests(&["a"], RequestStatus::FinishedAborted);
        let out = s.schedule().unwrap();
        assert!(out.entries.is_empty());
        assert_eq!(out.finished_req_ids, vec!["a".to_string()]);
        s.set_pause(Pause::Unpaused);
        let (rows, _) = step(&mut s);
        // a's partial (unhashed) block went back to the head of the free queue.
        assert_eq!(rows, vec![row("b", 10, 0, &[1])]);
    }

    #[test]
    fn rejected_requests_change_nothing() {
        let mut s = scheduler(11, 64, 256, Policy::Fcfs);
        add(&mut s, "a", 3..10, 0, 0.0);
        let mut dup = NewRequest {
            request_id: "a".into(),
            prompt_token_ids: vec![1],
            stop: StopRules {
                max_tokens: 1,
                min_tokens: 0,
                eos_token_id: None,
                stop_token_ids: vec![],
            },
            priority: 0,
            arrival_time: 0.0,
            cache_salt: None,
        };
        assert!(s.add_request(dup.clone()).is_err());
        dup.request_id = "b".into();
        dup.prompt_token_ids = (0..64).collect();
        assert!(s.add_request(dup.clone()).is_err());
        dup.prompt_token_ids = vec![];
        assert!(s.add_request(dup).is_err());
        assert_eq!(s.num_unfinished_requests(), 1);
        assert_eq!(
            s.finish_requests(&["a", "a", "zz"], RequestStatus::FinishedAborted)
                .len(),
            1
        );
        assert_eq!(s.num_unfinished_requests(), 0);
    }
}
