//! A request as the scheduler tracks it (docs/scheduling.md §3): its tokens and KV state,
//! its stopping rules, and where it is in its life.

use crate::block_hash::ExtraKey;
use crate::block_table::BlockTable;
use crate::error::Error;
use crate::grammar::Grammar;
use crate::limits::{check_range, MAX_TOKENS};
use crate::lora::LoraAdapter;
use crate::multimodal::MultimodalInput;
use crate::sequence::Sequence;
use crate::session::SessionQueue;
use crate::spec_decode::Drafts;
use smallvec::{smallvec, SmallVec};

/// vLLM's statuses, in vLLM's order; every one after `Preempted` is finished.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum RequestStatus {
    Waiting,
    /// Its KV cache is being loaded by a KV connector; it holds the blocks
    /// and waits for the load to be reported (docs/scheduling.md §4.19).
    WaitingForRemoteKvs,
    /// A streaming session between turns: it holds its KV cache and waits
    /// for its next input chunk (docs/scheduling.md §4.12).
    WaitingForStreamingReq,
    Running,
    Preempted,
    FinishedStopped,
    FinishedLengthCapped,
    FinishedAborted,
    FinishedIgnored,
    FinishedError,
    FinishedRepetition,
}

impl RequestStatus {
    /// Whether the request has ended.
    pub fn is_finished(self) -> bool {
        self > RequestStatus::Preempted
    }

    /// The finish reason vLLM reports for a finished status.
    pub fn finish_reason(self) -> Option<&'static str> {
        match self {
            RequestStatus::FinishedStopped => Some("stop"),
            RequestStatus::FinishedLengthCapped | RequestStatus::FinishedIgnored => Some("length"),
            RequestStatus::FinishedAborted => Some("abort"),
            RequestStatus::FinishedError => Some("error"),
            RequestStatus::FinishedRepetition => Some("repetition"),
            _ => None,
        }
    }

    /// The status's name, as vLLM spells it.
    pub fn name(self) -> &'static str {
        match self {
            RequestStatus::Waiting => "WAITING",
            RequestStatus::WaitingForRemoteKvs => "WAITING_FOR_REMOTE_KVS",
            RequestStatus::WaitingForStreamingReq => "WAITING_FOR_STREAMING_REQ",
            RequestStatus::Running => "RUNNING",
            RequestStatus::Preempted => "PREEMPTED",
            RequestStatus::FinishedStopped => "FINISHED_STOPPED",
            RequestStatus::FinishedLengthCapped => "FINISHED_LENGTH_CAPPED",
            RequestStatus::FinishedAborted => "FINISHED_ABORTED",
            RequestStatus::FinishedIgnored => "FINISHED_IGNORED",
            RequestStatus::FinishedError => "FINISHED_ERROR",
            RequestStatus::FinishedRepetition => "FINISHED_REPETITION",
        }
    }
}

/// Why a request stopped, beyond its status: the stop token, or a
/// repeating pattern (vLLM reports `"repetition_detected"`).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum StopReason {
    Token(u32),
    Repetition,
}

/// vLLM's `repetition_detection`: stop once the output ends in a pattern of
/// `min_pattern_size..=max_pattern_size` tokens repeated `min_count` times.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Repetition {
    pub min_pattern_size: usize,
    pub max_pattern_size: usize,
    pub min_count: usize,
}

/// When a request stops (docs/scheduling.md §5.2).
#[derive(Clone, Debug, PartialEq)]
#[repr(C)] // part of Request's hot lines; the stop check reads these in order
pub struct StopRules {
    /// Most output tokens (≥ 1).
    pub max_tokens: usize,
    /// Kept for the sampler; the scheduler's checks ignore it (Q3).
    pub min_tokens: usize,
    /// `None` when there is none or `ignore_eos` is set.
    pub eos_token_id: Option<u32>,
    /// Tokens that stop the request (honoured even with `ignore_eos`).
    pub stop_token_ids: Vec<u32>,
    /// Stop on a repeating output pattern, once `min_tokens` are out.
    /// Boxed: few requests set it, and unboxed it would push the sequence's
    /// hash count, which every decode reads, out of the hot lines.
    pub repetition: Option<Box<Repetition>>,
}

/// What a client submits, as the core stores it.
#[derive(Clone, Debug)]
pub struct NewRequest {
    pub request_id: String,
    pub prompt_token_ids: Vec<u32>,
    pub stop: StopRules,
    /// Lower runs first.
    pub priority: i64,
    /// Seconds; ties in priority go to the earlier arrival.
    pub arrival_time: f64,
    pub cache_salt: Option<String>,
    /// Its LoRA adapter; `None` for the base model.
    pub lora: Option<LoraAdapter>,
    /// Its images (audio, video), sorted by position (§4.15).
    pub mm_inputs: Vec<MultimodalInput>,
    /// A prompt given as embeddings (vLLM's `prompt_embeds`): the digest of
    /// each block's embeddings, one per block the prompt overlaps (covering
    /// the hash lookahead's tokens too); they key its block hashes (§7.4).
    pub prompt_embeds_digests: Option<Vec<Vec<u8>>>,
    /// Never read prefix-cache hits (vLLM sets it for requests that want
    /// prompt logprobs, which a hit would leave uncomputed); its blocks are
    /// still cached for others.
    pub skip_reading_prefix_cache: bool,
    /// Its output follows a grammar (vLLM's structured outputs): it waits
    /// for the grammar to compile, and the caller checks its tokens.
    pub structured_output: bool,
    /// Report its prefix hits as KV-cache events at every lookup (vLLM's
    /// `kv_cache_report_mode="full"`).
    pub report_hits: bool,
    /// One chunk of a streaming-input session (vLLM's `resumable`): later
    /// chunks come as requests with the same id.
    pub resumable: bool,
}

impl NewRequest {
    /// What its block hashes are keyed by besides its tokens: its adapter
    /// and its `cache_salt`.
    pub fn hash_keys(&self) -> SmallVec<[ExtraKey<'_>; 2]> {
        let mut keys = SmallVec::new();
        if let Some(lora) = &self.lora {
            keys.push(ExtraKey::Lora {
                name: &lora.name,
                path: &lora.path,
            });
        }
        if let Some(salt) = &self.cache_salt {
            keys.push(ExtraKey::CacheSalt(salt));
        }
        keys
    }
}

/// The rules of one turn (a request, or a session's chunk): `max_tokens` in
/// `[1, MAX_TOKENS]`, `min_tokens <= max_tokens`, an arrival time that is a
/// number.
pub fn check_turn(new: &NewRequest) -> Result<(), Error> {
    check_range("max_tokens", new.stop.max_tokens, 1, MAX_TOKENS)?;
    if new.stop.min_tokens > new.stop.max_tokens {
        return Err(Error::invalid(format!(
            "min_tokens must be in [0, max_tokens={}], got {}",
            new.stop.max_tokens, new.stop.min_tokens
        )));
    }
    if new.arrival_time.is_nan() {
        return Err(Error::invalid("arrival_time must not be NaN"));
    }
    Ok(())
}

/// The scheduler's state for one live request.
///
/// Laid out hot first (`repr(C)` keeps the order; the default layout sorts
/// fields by alignment): everything a decode step reads or writes (flags,
/// in-flight counts, the first block table inline, drafts, stop rules, the
/// token header, counts and hash count) lies in the struct's first four
/// cache lines (256 bytes), and the rest (ids, priority, a session's queue)
/// after them.
/// At 1,024 running requests a step's passes cannot keep requests in L1
/// between them, so each line a request spreads over is one more miss per
/// pass. Aligned to a line, so those 256 bytes are four lines, not five
/// (in the lockstep replay at 193–256 running the core's step fell 6%).
#[derive(Clone, Debug)]
#[repr(C, align(64))]
pub struct Request {
    pub status: RequestStatus,
    /// Whether its last scheduled step left tokens to compute, as of that
    /// step (vLLM's `is_prefill_chunk` attribute, which prefill holds read).
    pub prefill_chunk: bool,
    /// Whether the stale share of its in-flight tokens is dropped instead
    /// of applied (a reset preempted it and may resample those positions);
    /// kept through a later preemption until that share has drained.
    pub drop_stale: bool,
    /// Skipped by a waiting pass and not admitted since (vLLM's
    /// `deferred_waiting`; only counted in the stats).
    pub deferred: bool,
    /// A KV connector reported its load (`WaitingForRemoteKvs` only): the
    /// next waiting pass that reaches it settles the load (§4.19).
    pub kv_loaded: bool,
    /// Part or all of its load failed and it computes what did not arrive
    /// (vLLM's `failed_recving_kv_req_ids`; `WaitingForRemoteKvs` only).
    pub kv_load_failed: bool,
    /// Admitted with prompt left to compute, or loading (vLLM's
    /// `_inflight_prefills`): an async load keeps room for what it still
    /// needs (§4.19).
    pub inflight_prefill: bool,
    /// A streaming session continues after a turn stops (cleared when its
    /// grammar rejects a token).
    pub resumable: bool,
    /// Admitted without prefix-cache hits, and not counted in the
    /// prefix-cache stats.
    pub skip_reading_prefix_cache: bool,
    /// Report its prefix hits as KV-cache events.
    pub report_hits: bool,
    /// A structured-output request's grammar; `None` for the others.
    pub grammar: Option<Grammar>,
    pub num_preemptions: u32,
    /// Tokens scheduled whose output has not arrived (docs/scheduling.md §5.4) ...
    pub in_flight_tokens: usize,
    /// ... after a preemption, how many of those are stale (their tokens
    /// still arrive).
    pub stale_tokens: usize,
    /// Async scheduling: tokens sampled in flight that positions were
    /// already scheduled for (vLLM's `num_output_placeholders`).
    pub num_output_placeholders: usize,
    /// The first `schedule()` call at which it may decode again (the decode
    /// stagger, §4.9).
    pub next_decode_step: u64,
    /// The blocks it holds, one table per KV-cache group (all of one
    /// length; a window group's past positions hold the null block). The
    /// first is stored inline: no pointer to chase for one group.
    pub tables: Tables,
    /// Draft tokens for its next step (vLLM's `spec_token_ids`, §4.13).
    pub drafts: Drafts,
    pub stop: StopRules,
    /// Tokens, `num_computed_tokens` and block hashes.
    pub seq: Sequence,
    // Cold: read at admission, preemption, finish.
    /// The stop token (or pattern) that ended it.
    pub stop_reason: Option<StopReason>,
    pub priority: i64,
    pub arrival_time: f64,
    /// The last step (of `sched_step_seq`) that scheduled it, while frees
    /// are fenced (§4.19; a KV connector's consumer role only).
    pub last_sched_seq: u64,
    pub request_id: String,
    /// A streaming session's chunks not applied yet; `None` for a request
    /// that was not added as one.
    pub session: Option<SessionQueue>,
    /// Its LoRA adapter's id (what `max_loras` counts); `None` for the base model.
    pub lora_id: Option<u32>,
    /// Its multimodal inputs, sorted by position (empty for text).
    pub mm_inputs: Box<[MultimodalInput]>,
}

/// A request's block tables, one per KV-cache group, the first inline.
pub type Tables = SmallVec<[BlockTable; 1]>;

impl Request {
    /// A request as `add_request` queues it: waiting, nothing computed,
    /// its tokens (and their hashes) in `seq`.
    pub fn waiting(new: NewRequest, seq: Sequence, num_groups: usize) -> Self {
        Request {
            request_id: new.request_id,
            stop: new.stop,
            priority: new.priority,
            arrival_time: new.arrival_time + 0.0, // -0.0 orders as 0.0, as in Python
            seq,
            tables: smallvec![BlockTable::default(); num_groups],
            status: RequestStatus::Waiting,
            stop_reason: None,
            num_preemptions: 0,
            in_flight_tokens: 0,
            stale_tokens: 0,
            drop_stale: false,
            num_output_placeholders: 0,
            deferred: false,
            kv_loaded: false,
            kv_load_failed: false,
            last_sched_seq: 0,
            inflight_prefill: false,
            skip_reading_prefix_cache: new.skip_reading_prefix_cache,
            grammar: new.structured_output.then_some(Grammar::Compiling),
            report_hits: new.report_hits,
            prefill_chunk: false,
            next_decode_step: 0,
            resumable: new.resumable,
            session: new.resumable.then(SessionQueue::new),
            drafts: Drafts::None,
            lora_id: new.lora.map(|lora| lora.id),
            mm_inputs: new.mm_inputs.into_boxed_slice(),
        }
    }

    /// A value read from each of the struct's hot lines (line 0's counters,
    /// the first table, the stop rules, the sequence's counts), for a
    /// pass that reads ahead to overlap their cache misses.
    pub fn touch_hot_lines(&self) -> usize {
        (self.next_decode_step as usize)
            .wrapping_add(self.num_blocks())
            .wrapping_add(self.stop.max_tokens)
            .wrapping_add(self.seq.num_computed_tokens)
    }

    /// Blocks in its first KV-cache group's table (the one a step's block
    /// ranges are read off); 0 for a model without a KV cache.
    #[inline]
    pub fn num_blocks(&self) -> usize {
        self.tables.first().map_or(0, BlockTable::len)
    }

    /// Hash-cached blocks in its first group's table (what a `BlockStored`
    /// event reports); 0 for a model without a KV cache.
    pub fn num_cached_blocks(&self) -> usize {
        self.tables.first().map_or(0, BlockTable::num_cached_blocks)
    }

    /// Prompt plus output tokens.
    pub fn num_tokens(&self) -> usize {
        self.seq.num_tokens()
    }

    /// Output tokens so far.
    pub fn num_output_tokens(&self) -> usize {
        self.seq.num_tokens() - self.seq.num_prompt_tokens()
    }

    /// Whether it holds KV blocks while waiting (a streaming session
    /// between turns): such requests wait apart and are admitted first.
    pub fn holds_kv(&self) -> bool {
        // A load that failed whole leaves 0 computed tokens, blocks still
        // held until the load is settled (§4.19).
        self.seq.num_computed_tokens > 0 || self.status == RequestStatus::WaitingForRemoteKvs
    }

    /// Whether a waiting pass skips it: a session waiting for input, or a
    /// grammar not ready (vLLM's blocked statuses).
    pub fn is_blocked(&self) -> bool {
        matches!(
            self.status,
            RequestStatus::WaitingForStreamingReq | RequestStatus::WaitingForRemoteKvs
        ) || self.grammar.is_some_and(|g| g.holds())
    }

    /// Whether the last step left prompt (or resumed) tokens to compute:
    /// such a step samples nothing, so gets no placeholder.
    pub fn is_prefill_chunk(&self) -> bool {
        self.seq.num_computed_tokens < self.num_tokens() + self.num_output_placeholders
    }
}

#[cfg(test)]
mod layout_tests {
    use super::*;
    use std::mem::offset_of;

    /// What a decode step touches leads the struct (see `Request`); a
    /// field added to the middle, or `repr(C)` dropped, shows here.
    #[test]
    fn a_decode_steps_fields_lead_the_request() {
        // The sequence's token header, counts and hash count lead it.
        let hot_end = offset_of!(Request, seq) + Sequence::HOT_END;
        assert_eq!(
            std::mem::align_of::<Request>(),
            64,
            "a request starts a line"
        );
        assert!(
            hot_end <= 4 * 64,
            "the hot fields end at byte {hot_end}, past four cache lines"
        );
        for cold in [
            offset_of!(Request, stop_reason),
            offset_of!(Request, priority),
            offset_of!(Request, arrival_time),
            offset_of!(Request, request_id),
            offset_of!(Request, session),
            offset_of!(Request, mm_inputs),
        ] {
            assert!(
                cold >= hot_end,
                "a cold field at byte {cold}, inside the hot lines"
            );
        }
    }
}
