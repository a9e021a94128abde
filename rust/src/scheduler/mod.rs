//! The scheduler: vLLM 0.33's V1 continuous batching (docs/scheduling.md
//! §4–6).
//!
//! There is no prefill phase and no decode phase. Every request is behind by
//! `num_tokens − num_computed_tokens` tokens, and each step hands out a token
//! budget to close those gaps: first to running requests, in order
//! (`running_pass`), then to waiting ones (`waiting_pass`). A running request
//! that cannot get a block preempts a victim (`preemption`): its blocks are
//! freed and its tokens recomputed later. `step_columns` turns a step's
//! decisions into the model runner's columns; `update` applies the tokens
//! that come back.
//!
//! Requests live in a [`Slab`]; a slot's generation changes when it is
//! freed, so a step's output applied late never touches a request that
//! reused the slot.

mod aux_outputs;
mod block_pins;
mod drafts;
mod ec_transfer;
mod encoder_inputs;
mod kv_load_failure;
mod kv_transfer;
mod pooler_output;
mod preemption;
mod prefill_lookahead;
mod read_ahead;
mod request_errors;
mod running_pass;
mod session;
mod state_aligned_split;
mod step_columns;
mod update;
mod waiting_pass;

#[cfg(test)]
mod ec_connector_tests;
#[cfg(test)]
mod encoder_decoder_tests;
#[cfg(test)]
mod encoder_tests;
#[cfg(test)]
mod kv_connector_tests;
#[cfg(test)]
mod lora_tests;
#[cfg(test)]
mod no_kv_cache_tests;
#[cfg(test)]
mod pooling_tests;
#[cfg(test)]
mod prompt_embeds_tests;
#[cfg(test)]
mod spec_decode_tests;
#[cfg(test)]
mod tests;

use crate::aux_output_retention::AuxOutputRetention;
use crate::block::BlockId;
use crate::ec_connector::EcConnector;
use crate::encoder_cache::EncoderCache;
use crate::encoder_decoder_cache::EncoderDecoderCache;
use crate::error::Error;
use crate::kv_cache_manager::KvCacheManager;
use crate::kv_connector::{KvConnector, KvConnectorSetup};
use crate::kv_events::KvEvent;
use crate::multimodal::MultimodalInput;
use crate::multimodal::{check_inputs, InputPlacement};
use crate::prefill_cadence::PrefillCadence;
use crate::prefix_cache_stats::PrefixCacheStats;
use crate::request::{check_turn, NewRequest, Request, RequestStatus};
use crate::request_queue::WaitingQueue;
use crate::scheduler_config::{Policy, Runner, SchedulerConfig};
use crate::sequence::Sequence;
use crate::slab::{Slab, Slot};
use crate::step::{StepEntry, StepOutput};
pub use block_pins::{PinRequest, PinRequests};
pub use encoder_inputs::ScheduledEncoderInputs;
pub use request_errors::{EndOrder, ErrorGroups, RequestErrors};
use rustc_hash::FxHashMap;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};

static NEXT_SCHEDULER_ID: AtomicU64 = AtomicU64::new(1);

/// What `make_stats` reports (docs/scheduling.md §7.10).
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

/// A step being decided: what is left of the budget and what is scheduled
/// so far, handed from the running pass to the waiting pass.
struct StepDraft {
    /// Tokens the scheduler may still hand out (`max_num_scheduled_tokens`).
    token_budget: usize,
    /// Tokens the model runner may still take (`max_num_batched_tokens`);
    /// both budgets shrink alike until speculative decoding tells them apart.
    input_budget: usize,
    /// `long_prefill_token_threshold` as it applies this step; 0 is off.
    threshold: usize,
    entries: Vec<StepEntry>,
    /// Someone was preempted this step: no admissions (Q5).
    preempted_any: bool,
    /// Structured-output requests the waiting pass released or found
    /// failed (§4.10).
    grammar_released: Vec<Slot>,
    grammar_failed: Vec<Slot>,
    /// This step holds prefill work back (§4.11): running prefill chunks
    /// are skipped and admissions with prompt left stop the waiting pass.
    hold_prefills: bool,
    /// It carried prefill work: a running prefill chunk, or an admission
    /// with prompt left to compute.
    carried_prefill: bool,
    /// The running pass scheduled a prefill chunk (which keeps admissions
    /// from being padded with drafts, §4.13) ...
    running_prefill: bool,
    /// ... or scheduled anyone at all.
    running_scheduled: bool,
    /// Some request scheduled this step (even if preempted later in it)
    /// may verify the drafts proposed after it (§4.13).
    drafts_needed: bool,
    /// Embeddings the encoder may still compute this step (§4.15).
    encoder_budget: usize,
    /// The encoder inputs scheduled so far, by request.
    encoder_inputs: Vec<ScheduledEncoderInputs>,
    /// Requests whose encoder inputs disagree with the cache (the caller
    /// ends them).
    encoder_mismatch: Vec<Slot>,
    /// An admission took external tokens loaded in this step (§4.19).
    sync_kv_loads: bool,
}

/// vLLM 0.33's V1 scheduler.
#[derive(Debug)]
pub struct Scheduler {
    config: SchedulerConfig,
    kv: KvCacheManager,
    requests: Slab<Request>,
    ids: FxHashMap<String, Slot>,
    waiting: WaitingQueue,
    /// Waiting requests that hold KV blocks (streaming sessions between
    /// turns): admitted before any in `waiting` (§4.12).
    kv_holding: WaitingQueue,
    /// Sessions waiting for their next chunk: they keep a runner slot, so
    /// they count against `max_num_active_seqs`.
    num_waiting_for_input: usize,
    running: Vec<Slot>,
    /// Since the last step: reported (sorted) by the next one.
    finished_ids: Vec<String>,
    preempted_ids: Vec<String>,
    /// Preemptions since the stats were last taken.
    num_preempted: u64,
    /// Waiting requests skipped by a waiting pass (their output in flight).
    num_deferred: usize,
    pause: Pause,
    /// Tells this scheduler's steps from another's.
    id: u64,
    next_step: u64,
    /// Steps scheduled whose output has not been applied.
    pending_steps: VecDeque<u64>,
    /// Scratch for prefix hits, one list per KV-cache group, reused across
    /// admissions.
    hits: Vec<Vec<BlockId>>,
    /// `schedule()` calls so far, this one included (the decode stagger's
    /// clock).
    current_step: u64,
    /// When prefills wait (§4.11).
    cadence: PrefillCadence,
    /// Which encoder outputs the model runner holds.
    encoder: EncoderStore,
    /// The scheduler's side of an encoder-cache connector, if any (§4.20).
    ec_connector: Option<Box<dyn EcConnector>>,
    /// The scheduler's side of a KV connector, if any (§4.19).
    connector: Option<Box<dyn KvConnector>>,
    /// How the scheduler works with its KV connector (§4.19).
    kv_setup: KvConnectorSetup,
    /// Fenced frees (§4.19): steps scheduled with tokens, and those whose
    /// output came back, counted while `kv_setup.defer_block_free`.
    sched_step_seq: u64,
    processed_step_seq: u64,
    /// Blocks waiting for a step in flight to come back, oldest first.
    deferred_frees: VecDeque<DeferredFree>,
    /// Which blocks' auxiliary outputs the workers hold, when followed
    /// (§7.12).
    aux_retention: Option<AuxOutputRetention>,
    /// References taken on blocks from outside any request, per block
    /// (`block_pins`).
    pins: FxHashMap<BlockId, u32>,
    /// Pins asked for by whoever holds a handle (a connector, from inside
    /// its calls), applied at the next point the scheduler takes them.
    pin_requests: block_pins::PinRequests,
    /// Pins asked for that were refused, for the caller to report.
    pin_errors: Vec<Error>,
}

/// Blocks a freed request left while a step in flight may still write
/// them: they go back to the pool once step `fence` has come back.
#[derive(Debug)]
pub struct DeferredFree {
    pub fence: u64,
    /// In allocation order.
    pub blocks: Vec<BlockId>,
}

/// The encoder's outputs as the scheduler tracks them: a cache shared by
/// identifier (§4.15), or an encoder-decoder's slot count (§4.17).
#[derive(Debug)]
pub(crate) enum EncoderStore {
    Shared(EncoderCache),
    EncoderDecoder(EncoderDecoderCache),
}

impl EncoderStore {
    fn new(config: &SchedulerConfig) -> Self {
        let size = config.encoder.as_ref().map_or(0, |e| e.cache_size);
        if config.cache.has_cross_attention() {
            EncoderStore::EncoderDecoder(EncoderDecoderCache::new(size))
        } else {
            EncoderStore::Shared(EncoderCache::new(size))
        }
    }

    /// Drop every reference of the request in `slot` (`inputs`: its inputs).
    pub(crate) fn release_all(&mut self, slot: Slot, inputs: &[MultimodalInput]) {
        match self {
            EncoderStore::Shared(c) => c.release_all(slot, inputs),
            EncoderStore::EncoderDecoder(c) => c.release_all(inputs),
        }
    }

    /// The identifiers the model runner may drop now.
    fn take_freed(&mut self) -> Vec<String> {
        match self {
            EncoderStore::Shared(c) => c.take_freed(),
            EncoderStore::EncoderDecoder(c) => c.take_freed(),
        }
    }
}

impl Scheduler {
    /// A scheduler over a fresh KV cache.
    pub fn new(config: SchedulerConfig) -> Result<Self, Error> {
        config.validate()?;
        let kv = KvCacheManager::new(&config.cache)?
            .with_reprefillable_tokens(config.drafter_read_ahead.saturating_sub(1));
        let num_groups = config.cache.groups.len();
        let queue = || match config.policy {
            Policy::Fcfs => WaitingQueue::Fcfs(VecDeque::new()),
            Policy::Priority => WaitingQueue::Priority(Vec::new()),
        };
        let (waiting, kv_holding) = (queue(), queue());
        let cadence = PrefillCadence::new(config.prefill_schedule_interval);
        let encoder = EncoderStore::new(&config);
        Ok(Scheduler {
            config,
            kv,
            requests: Slab::default(),
            ids: FxHashMap::default(),
            waiting,
            kv_holding,
            num_waiting_for_input: 0,
            running: Vec::new(),
            finished_ids: Vec::new(),
            preempted_ids: Vec::new(),
            num_preempted: 0,
            num_deferred: 0,
            pause: Pause::Unpaused,
            id: NEXT_SCHEDULER_ID.fetch_add(1, Ordering::Relaxed),
            next_step: 0,
            pending_steps: VecDeque::new(),
            hits: vec![Vec::new(); num_groups],
            current_step: 0,
            cadence,
            encoder,
            ec_connector: None,
            connector: None,
            kv_setup: KvConnectorSetup::default(),
            sched_step_seq: 0,
            processed_step_seq: 0,
            deferred_frees: VecDeque::new(),
            aux_retention: None,
            pins: FxHashMap::default(),
            pin_requests: block_pins::PinRequests::default(),
            pin_errors: Vec::new(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    /// The shared encoder cache's bookkeeping, for inspection (`None` for
    /// an encoder-decoder model).
    pub fn encoder_cache(&self) -> Option<&EncoderCache> {
        match &self.encoder {
            EncoderStore::Shared(c) => Some(c),
            EncoderStore::EncoderDecoder(_) => None,
        }
    }

    /// An encoder-decoder model's encoder slots, for inspection.
    pub fn encoder_decoder_cache(&self) -> Option<&EncoderDecoderCache> {
        match &self.encoder {
            EncoderStore::EncoderDecoder(c) => Some(c),
            EncoderStore::Shared(_) => None,
        }
    }

    /// Where requests' multimodal inputs sit, for a prompt of
    /// `num_prompt_tokens`: an encoder-decoder's are the encoder's.
    pub(super) fn input_placement(&self, num_prompt_tokens: usize) -> InputPlacement {
        match self.encoder {
            EncoderStore::EncoderDecoder(_) => InputPlacement::Encoder,
            EncoderStore::Shared(_) => InputPlacement::Prompt { num_prompt_tokens },
        }
    }

    /// The KV-cache manager, for inspection.
    pub fn kv(&self) -> &KvCacheManager {
        &self.kv
    }

    /// Log KV-cache events from now on (docs/scheduling.md §7.12).
    pub fn enable_kv_events(&mut self) {
        self.kv.enable_events();
    }

    /// Log blocks' lives (handed out, hit) from now on, for residency
    /// metrics (§7.12).
    pub fn enable_block_lifecycle_events(&mut self) {
        self.kv.enable_lifecycle_events();
    }

    /// Log each request's prefix lookups and block releases from now on,
    /// among the KV-cache events: what vLLM's auxiliary-output connector
    /// hears of (§7.12).
    pub fn enable_request_events(&mut self) {
        self.kv.enable_request_events();
    }

    /// The cached states offered to the KV connector since last taken,
    /// oldest first (§4.19.2): what vLLM drains at the end of each step.
    pub fn take_boundary_states(&mut self) -> Vec<crate::kv_cache_manager::BoundaryState> {
        self.kv.take_boundary_states()
    }

    /// The KV-cache events since last taken, oldest first.
    pub fn take_kv_events(&mut self) -> Vec<KvEvent> {
        self.kv.take_events()
    }

    /// The live request in `slot`.
    pub fn request(&self, slot: Slot) -> Option<&Request> {
        self.requests.get(slot)
    }

    /// Whether the request a step entry scheduled is still live (not
    /// finished, its slot not reused).
    pub fn is_live(&self, entry: &StepEntry) -> bool {
        // A finished request whose blocks a KV connector holds stays in
        // its slot, and its rows are skipped as vLLM skips them (§4.19).
        self.requests.holds(entry.slot, entry.generation)
            && !self.requests[entry.slot].status.is_finished()
    }

    /// The slot of the live request `request_id`.
    pub fn slot_of(&self, request_id: &str) -> Option<Slot> {
        self.ids.get(request_id).copied()
    }

    /// Running requests, in order.
    pub fn running(&self) -> &[Slot] {
        &self.running
    }

    /// Waiting requests that hold no KV blocks, in admission order.
    pub fn waiting(&self) -> impl Iterator<Item = Slot> + '_ {
        self.waiting.iter(&self.requests)
    }

    /// Waiting requests that hold KV blocks (sessions between turns), in
    /// admission order; admitted before those in [`Self::waiting`].
    pub fn kv_holding(&self) -> impl Iterator<Item = Slot> + '_ {
        self.kv_holding.iter(&self.requests)
    }

    /// Waiting requests that hold KV blocks.
    pub fn num_kv_holding(&self) -> usize {
        self.kv_holding.len()
    }

    /// Streaming sessions waiting for their next input chunk.
    pub fn num_waiting_for_input(&self) -> usize {
        self.num_waiting_for_input
    }

    /// Pause or resume scheduling (vLLM's `set_pause_state`).
    pub fn set_pause(&mut self, pause: Pause) {
        self.pause = pause;
    }

    /// The pause state.
    pub fn pause(&self) -> Pause {
        self.pause
    }

    /// (running, waiting) request counts; sessions between turns count as
    /// waiting.
    pub fn request_counts(&self) -> (usize, usize) {
        (
            self.running.len(),
            self.waiting.len() + self.kv_holding.len(),
        )
    }

    /// Unfinished requests, sessions between turns included.
    pub fn num_unfinished_requests(&self) -> usize {
        self.running.len() + self.waiting.len() + self.kv_holding.len()
    }

    /// Queue a request; returns its slot. A request whose id is a live
    /// streaming session is that session's next chunk (§4.12). Refused with
    /// nothing changed: a live duplicate id, an empty prompt, a prompt of
    /// `max_model_len` or more tokens, `max_tokens` outside `[1,
    /// MAX_TOKENS]`, `min_tokens > max_tokens`, a NaN arrival time.
    pub fn add_request(&mut self, mut new: NewRequest) -> Result<Slot, Error> {
        if let Some(&slot) = self.ids.get(&new.request_id) {
            if self.requests[slot].status.is_finished() {
                // Finished, its blocks held for a KV connector's send.
                return Err(Error::DuplicateRequest(new.request_id));
            }
            return self.add_session_chunk(slot, new).map(|()| slot);
        }
        self.check_new_request(&new)?;
        let mut seq = Sequence::new(
            std::mem::take(&mut new.prompt_token_ids),
            &new.hash_keys(),
            self.kv.hasher(),
            self.kv.hash_block_size(),
        );
        if !new.mm_inputs.is_empty() {
            seq.key_by_mm(&new.mm_inputs, self.kv.hasher(), self.kv.hash_block_size());
        }
        if let Some(digests) = &new.prompt_embeds_digests {
            seq.key_by_embeds(digests, self.kv.hasher(), self.kv.hash_block_size());
        }
        let request = Request::waiting(new, seq, self.kv.groups().len());
        let id = request.request_id.clone();
        let slot = self.requests.insert(request);
        self.ids.insert(id, slot);
        self.enqueue_waiting(slot);
        Ok(slot)
    }

    /// Queue a request that waits (vLLM's `_enqueue_waiting_request`): one
    /// that holds KV blocks apart, one that is blocked (a grammar, a session
    /// waiting for input) counted as skipped from the start.
    fn enqueue_waiting(&mut self, slot: Slot) {
        let r = &self.requests[slot];
        let (blocked, holds_kv) = (r.is_blocked(), r.holds_kv());
        if blocked {
            self.defer(slot);
        }
        if holds_kv {
            self.kv_holding.add(slot, &self.requests);
        } else {
            self.waiting.add(slot, &self.requests);
        }
    }

    /// The caller's news of a structured-output request's grammar: compiled
    /// (`true`) or failed (`false`). It counts when a waiting pass next
    /// reaches the request (§4.10). Refused for an id without a live
    /// request, for a request without a grammar, and once it is released.
    pub fn report_grammar(&mut self, request_id: &str, compiled: bool) -> Result<(), Error> {
        let slot = *self.ids.get(request_id).ok_or_else(|| {
            Error::invalid(format!("request_id {request_id:?} is not a live request"))
        })?;
        let r = &mut self.requests[slot];
        let id = &r.request_id;
        let grammar = r.grammar.as_mut().ok_or_else(|| {
            Error::invalid(format!(
                "request {id:?} has no grammar (structured_output=False)"
            ))
        })?;
        grammar
            .report(compiled)
            .map_err(|why| Error::invalid(format!("request {id:?}: {why}")))
    }

    fn check_new_request(&self, new: &NewRequest) -> Result<(), Error> {
        let id = &new.request_id;
        if self.ids.contains_key(id) {
            return Err(Error::DuplicateRequest(id.clone()));
        }
        let (len, max_len) = (new.prompt_token_ids.len(), self.config.max_model_len);
        if len == 0 {
            return Err(Error::invalid(format!(
                "prompt_token_ids of request {id:?} must not be empty"
            )));
        }
        // A sampled token needs a position after the prompt; a pooled
        // prompt may fill max_model_len (vLLM's input check, §4.16).
        let room = self.config.runner.sampled_tokens_per_step();
        if len + room > max_len {
            let bound = if room == 0 { "at most" } else { "shorter than" };
            return Err(Error::invalid(format!(
                "prompt_token_ids of request {id:?} has {len} tokens; it must be {bound} \
                 max_model_len ({max_len})"
            )));
        }
        if new.resumable && self.config.runner != Runner::Generate {
            return Err(Error::invalid(format!(
                "resumable of request {id:?}: runner '{}' takes no streaming sessions (it \
                 finishes each request after its prompt)",
                self.config.runner.name()
            )));
        }
        if !new.mm_inputs.is_empty() {
            if self.config.encoder.is_none() {
                return Err(Error::invalid(format!(
                    "mm_features of request {id:?}: this scheduler has no encoder (a text \
                     model); configure its encoder budget and cache size"
                )));
            }
            check_inputs(id, &new.mm_inputs, self.input_placement(len))?;
        }
        if let Some(digests) = &new.prompt_embeds_digests {
            let blocks = len.div_ceil(self.kv.hash_block_size());
            if digests.len() != blocks {
                return Err(Error::invalid(format!(
                    "prompt_embeds_digests of request {id:?} has {} digests; its {len}-token \
                     prompt spans {blocks} blocks",
                    digests.len()
                )));
            }
            if new.resumable {
                return Err(Error::invalid(format!(
                    "prompt_embeds_digests of request {id:?}: a streaming session with prompt \
                     embeddings is not supported"
                )));
            }
        }
        if new.lora.as_ref().is_some_and(|lora| lora.id == 0) {
            return Err(Error::invalid(format!(
                "lora_request.lora_int_id of request {id:?} must be >= 1, got 0"
            )));
        }
        check_turn(new)
    }

    /// End requests from outside (docs/scheduling.md §6): unknown and
    /// repeated ids are ignored; the rest are freed in the order given
    /// (vLLM frees in hash-set order; the drop-in passes that order).
    /// Returns their slots.
    pub fn finish_requests<S: AsRef<str>>(
        &mut self,
        request_ids: &[S],
        status: RequestStatus,
    ) -> Vec<Slot> {
        self.apply_pin_requests();
        let mut found: Vec<Slot> = Vec::new();
        for id in request_ids {
            if let Some(&slot) = self.ids.get(id.as_ref()) {
                // A finished request held for a send is finished already.
                let finished = self.requests[slot].status.is_finished();
                if !finished && !found.contains(&slot) {
                    found.push(slot);
                }
            }
        }
        // Out of their queues at once, as vLLM removes them (one heapify).
        let (running, waiting): (Vec<Slot>, Vec<Slot>) = found
            .iter()
            .partition(|&&s| self.requests[s].status == RequestStatus::Running);
        for &slot in &waiting {
            if self.requests[slot].status == RequestStatus::WaitingForStreamingReq {
                self.num_waiting_for_input -= 1;
            }
        }
        if !running.is_empty() {
            self.running.retain(|s| !running.contains(s));
        }
        self.unqueue_waiting(&waiting);
        for &slot in &found {
            let r = &mut self.requests[slot];
            // A load still on its way may write the blocks: they stay
            // until the worker reports it (§4.19).
            let loading = r.status == RequestStatus::WaitingForRemoteKvs && !r.kv_loaded;
            r.status = status;
            self.free_request(slot, loading);
        }
        found
    }

    /// Take waiting requests out of both waiting queues (vLLM's
    /// `remove_requests` on each, which also heapifies them).
    fn unqueue_waiting(&mut self, slots: &[Slot]) {
        if !slots.is_empty() {
            let gone = |s: Slot| slots.contains(&s);
            self.waiting.remove_all(gone, &self.requests);
            self.kv_holding.remove_all(gone, &self.requests);
        }
    }

    /// Free a finished request's blocks and slot; the next step reports it.
    /// Its blocks stay (and so does its slot, finished) while `loading`, or
    /// when the KV connector holds them for a send (§4.19).
    fn free_request(&mut self, slot: Slot, loading: bool) {
        self.log_released(slot);
        if self.connector.is_none() && self.ec_connector.is_none() {
            self.release_all_encoded(slot);
            let mut r = self.requests.remove(slot);
            self.num_deferred -= r.deferred as usize;
            self.kv.free(&mut r.tables);
            self.ids.remove(&r.request_id);
            self.finished_ids.push(r.request_id);
            return;
        }
        // vLLM asks the KV connector, then the encoder-cache connector
        // (before the request's encoder inputs go), and ORs their holds.
        let kv_held = self.connector_finished(slot);
        let held = self.ec_finished(slot) || kv_held || loading;
        self.release_all_encoded(slot);
        let r = &mut self.requests[slot];
        self.num_deferred -= std::mem::take(&mut r.deferred) as usize;
        r.inflight_prefill = false;
        r.kv_loaded = false;
        r.kv_load_failed = false;
        self.finished_ids.push(r.request_id.clone());
        if !held {
            self.release_request(slot);
        }
    }

    /// Log that the request in `slot` gives its blocks back (finished or
    /// preempted), before they go (§7.12).
    pub(super) fn log_released(&mut self, slot: Slot) {
        self.aux_request_finished(slot);
        let num_computed_tokens = self.requests[slot].seq.num_computed_tokens;
        self.kv.log_event(KvEvent::Released {
            owner: slot,
            num_computed_tokens,
        });
    }

    /// Return a finished request's blocks (fenced, §4.19) and slot.
    fn release_request(&mut self, slot: Slot) {
        self.free_blocks_of(slot);
        let r = self.requests.remove(slot);
        self.ids.remove(&r.request_id);
    }

    /// Return the blocks of the request in `slot` to the pool, or, while a
    /// step in flight may still write them (fenced frees, §4.19), set them
    /// aside until that step comes back.
    pub(super) fn free_blocks_of(&mut self, slot: Slot) {
        // (Its states not yet offered would name blocks another may get.)
        self.kv.withdraw_boundary_states(slot);
        let r = &mut self.requests[slot];
        if !self.kv_setup.defer_block_free || r.last_sched_seq <= self.processed_step_seq {
            self.kv.free(&mut r.tables);
            return;
        }
        let blocks = self.kv.take_blocks(&mut r.tables);
        if !blocks.is_empty() {
            self.deferred_frees.push_back(DeferredFree {
                fence: self.sched_step_seq,
                blocks,
            });
        }
    }

    /// Whether the request in `slot` may be preempted now: its blocks are
    /// not fenced by a step in flight (vLLM's `_request_blocks_can_be_freed`).
    pub(super) fn blocks_can_be_freed(&self, slot: Slot) -> bool {
        !self.kv_setup.defer_block_free
            || self.requests[slot].last_sched_seq <= self.processed_step_seq
    }

    /// A step with tokens came back: fenced blocks whose step is done go
    /// back to the pool, each set last block first (stopping at the first
    /// still fenced, as vLLM does).
    pub(super) fn drain_deferred_frees(&mut self) {
        while let Some(d) = self.deferred_frees.front() {
            if d.fence > self.processed_step_seq {
                break;
            }
            let d = self.deferred_frees.pop_front().expect("peeked");
            self.kv.release_blocks_last_first(&d.blocks);
        }
    }

    /// One scheduling decision (docs/scheduling.md §4).
    pub fn schedule(&mut self) -> StepOutput {
        self.schedule_throttled(false)
    }

    /// [`Self::schedule`], holding prefill work back when a data-parallel
    /// engine asks (`throttle_prefills`, vLLM's DP prefill balancing) or the
    /// local cadence says so (§4.11).
    pub fn schedule_throttled(&mut self, throttle_prefills: bool) -> StepOutput {
        self.apply_pin_requests();
        self.current_step += 1;
        self.kv.new_step_starts();
        let (requests, running) = (&self.requests, &self.running);
        let any_decoding = || running.iter().any(|&s| !requests[s].prefill_chunk);
        let hold_prefills = self.cadence.holds(throttle_prefills, any_decoding);
        let c = &self.config;
        let mut draft = StepDraft {
            token_budget: match self.pause {
                Pause::All => 0,
                _ => c.max_num_scheduled_tokens,
            },
            input_budget: c.max_num_batched_tokens,
            threshold: self.long_prefill_threshold(),
            entries: Vec::with_capacity(self.running.len() + 4),
            preempted_any: false,
            grammar_released: Vec::new(),
            grammar_failed: Vec::new(),
            hold_prefills,
            carried_prefill: false,
            running_prefill: false,
            running_scheduled: false,
            drafts_needed: false,
            encoder_budget: c.encoder.as_ref().map_or(0, |e| e.compute_budget),
            encoder_inputs: Vec::new(),
            encoder_mismatch: Vec::new(),
            sync_kv_loads: false,
        };
        self.schedule_running(&mut draft);
        draft.running_scheduled = !draft.entries.is_empty();
        // Any preemption cancels this step's admissions (Q5). Paused for
        // new requests, only those holding KV blocks are admitted.
        if !draft.preempted_any && self.pause != Pause::All {
            self.schedule_waiting(&mut draft, self.pause == Pause::Unpaused);
            if !hold_prefills {
                // vLLM notes this after every waiting pass that did not hold.
                let (_, num_waiting) = self.request_counts();
                self.cadence.note_release(num_waiting, self.num_deferred);
            }
        }
        let scheduled_any = !draft.entries.is_empty();
        self.aux_scheduled(draft.entries.iter().map(|e| e.slot));
        self.cadence.note_step(scheduled_any, draft.carried_prefill);
        let mut out = self.finish_step(draft.entries);
        out.scheduled_encoder_inputs = draft.encoder_inputs;
        out.encoder_mismatch = draft.encoder_mismatch;
        out.free_encoder_mm_hashes = self.encoder.take_freed();
        out.drafts_needed = draft.drafts_needed;
        out.grammar_released = draft.grammar_released;
        out.grammar_failed = draft.grammar_failed;
        out.has_sync_kv_loads = draft.sync_kv_loads;
        out
    }

    /// This step's `long_prefill_token_threshold`: off (0) with a single
    /// request, which has nobody to starve (Q1); with the adaptive option,
    /// never below a fair share of the input budget.
    fn long_prefill_threshold(&self) -> usize {
        let c = &self.config;
        let eligible = self.num_unfinished_requests();
        if eligible <= 1 || c.long_prefill_token_threshold == 0 {
            return 0;
        }
        if c.long_prefill_token_threshold_adaptive {
            return c
                .long_prefill_token_threshold
                .max(c.max_num_batched_tokens / eligible);
        }
        c.long_prefill_token_threshold
    }

    /// Forget every cached block hash (docs/scheduling.md §7.10); refused
    /// (false) while a block is held. With `reset_running_requests`, every
    /// running request is preempted first (from the back) and its output in
    /// flight dropped, so the reset succeeds unless streaming sessions
    /// between turns hold blocks (vLLM then raises, its running requests
    /// preempted all the same).
    pub fn reset_prefix_cache(&mut self, reset_running_requests: bool) -> bool {
        self.apply_pin_requests();
        if reset_running_requests {
            while let Some(slot) = self.running.pop() {
                self.preempt(slot, true);
            }
        }
        let reset = self.kv.reset_prefix_cache();
        if reset {
            self.aux_reset();
        }
        reset
    }

    /// Forget every encoder output (vLLM's `reset_encoder_cache`, after a
    /// weight update): the cache starts empty, running requests hold no
    /// references, and no eviction is reported for the entries dropped.
    pub fn reset_encoder_cache(&mut self) {
        self.encoder = EncoderStore::new(&self.config);
    }

    /// Counts and usage; takes (and zeroes) the prefix-cache and preemption
    /// counters.
    pub fn make_stats(&mut self) -> SchedulerStats {
        SchedulerStats {
            num_running_reqs: self.running.len(),
            num_waiting_reqs: self.waiting.len() + self.kv_holding.len() - self.num_deferred,
            num_skipped_waiting_reqs: self.num_deferred,
            kv_cache_usage: self.kv.usage(),
            prefix_cache_stats: self.kv.make_prefix_cache_stats(),
            num_preempted_reqs: std::mem::take(&mut self.num_preempted),
        }
    }
}
