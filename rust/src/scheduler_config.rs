//! Scheduler settings (docs/scheduling.md §2), validated like vLLM's.

use crate::error::Error;
use crate::kv_cache_manager::KvCacheConfig;
use crate::limits::{check_range, MAX_MODEL_LEN, MAX_NUM_BATCHED_TOKENS, MAX_NUM_SEQS};

/// Which waiting request goes first, and who is preempted.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Policy {
    /// First come, first served; the last running request is the victim.
    Fcfs,
    /// Smallest (priority, arrival_time, id) first; the largest
    /// (priority, arrival_time) running request is the victim.
    Priority,
}

/// What the model does with a step's output (vLLM's `--runner`).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub enum Runner {
    /// Samples one token per step after the prompt (plus accepted drafts).
    #[default]
    Generate,
    /// Pools the prompt's hidden states and finishes: no token is sampled,
    /// so no position is held back for one (§4.16).
    Pooling,
    /// Runs the multimodal encoder alone (vLLM's `--mm-encoder-only`, the
    /// producer of disaggregated encoding): nothing is sampled, and each
    /// request finishes once its whole prompt is consumed; a prompt over
    /// the step's budget is chunked even with chunked prefill off (§4.18).
    EncoderOnly,
}

impl Runner {
    /// Its name in the API (`SchedulerConfig(runner=...)`).
    pub fn name(self) -> &'static str {
        match self {
            Runner::Generate => "generate",
            Runner::Pooling => "pooling",
            Runner::EncoderOnly => "encoder_only",
        }
    }

    /// Tokens a request appends per step beyond its drafts (vLLM's
    /// `num_sampled_tokens_per_step`): the room a step leaves below
    /// `max_model_len` and the placeholders async scheduling adds.
    pub fn sampled_tokens_per_step(self) -> usize {
        match self {
            // vLLM counts an encoder-only deployment as generating.
            Runner::Generate | Runner::EncoderOnly => 1,
            Runner::Pooling => 0,
        }
    }
}

/// Everything `Scheduler::new` needs.
#[derive(Clone, Debug, PartialEq)]
pub struct SchedulerConfig {
    pub max_num_seqs: usize,
    /// The step's input budget: tokens the model runner takes in one step.
    pub max_num_batched_tokens: usize,
    /// The step's token budget: tokens the scheduler hands out (vLLM's
    /// `max_num_scheduled_tokens`; `max_num_batched_tokens` unless set, as
    /// only speculative decoding needs them to differ).
    pub max_num_scheduled_tokens: usize,
    /// Admissions stop once this many requests run (vLLM's
    /// `max_num_active_seqs`; `max_num_seqs` unless set): smaller decode
    /// batches without shrinking the runner.
    pub max_num_active_seqs: usize,
    pub max_model_len: usize,
    pub enable_chunked_prefill: bool,
    /// Per-request per-step token cap; 0 = off.
    pub long_prefill_token_threshold: usize,
    /// Floor the cap at a fair share of the input budget,
    /// `max_num_batched_tokens / unfinished requests`.
    pub long_prefill_token_threshold_adaptive: bool,
    /// Blocks an admission must leave free while other requests run
    /// (vLLM's `int(watermark * num_blocks)`).
    pub watermark_blocks: usize,
    pub policy: Policy,
    /// The full-prompt admission gate (docs/scheduling.md §7.6).
    pub scheduler_reserve_full_isl: bool,
    /// vLLM's async scheduling: the next step is scheduled before this
    /// step's output arrives, each sampling request holding an output
    /// placeholder for the token in flight (vLLM's `AsyncScheduler`;
    /// docs/scheduling.md §4.9, §5.5).
    pub async_scheduling: bool,
    /// Executed steps from one prefill-carrying step to the next, applied
    /// locally (vLLM's `prefill_schedule_interval` on an engine that is not
    /// data-parallel-coordinated); 1 is off (docs/scheduling.md §4.11).
    pub prefill_schedule_interval: usize,
    /// `schedule()` calls between two decode steps of one request; 0 or 1
    /// is off (vLLM's V2 runner under async scheduling and pipeline
    /// parallelism: the pipeline depth).
    pub decode_stagger: usize,
    /// Draft tokens a request may carry into a step (vLLM's
    /// `num_speculative_tokens`); 0 is no speculative decoding
    /// (docs/scheduling.md §4.13).
    pub num_speculative_tokens: usize,
    /// Input tokens a drafter adds per scheduled request (vLLM's
    /// `max_num_new_slots_for_drafting`: 1 for a draft model, more for
    /// parallel drafting); charged to `max_num_batched_tokens` beside the
    /// request's own tokens, never to the token budget (§4.13).
    pub num_draft_slots: usize,
    /// Dynamic speculation lengths (vLLM's
    /// `num_speculative_tokens_per_batch_size`, §4.13): entry `b` is how
    /// many drafts the runner proposes after a step of `b` requests (entry 0
    /// unused; `max_num_seqs + 1` entries). Under async scheduling each
    /// request scheduled waits for that many placeholder drafts; and no
    /// admission is padded to a draft step (the step's shape varies anyway).
    /// `None`: always `num_speculative_tokens`.
    pub drafts_by_batch_size: Option<Vec<usize>>,
    /// Distinct LoRA adapters a step's batch may hold (vLLM's `max_loras`,
    /// §4.14); `None`: no cap (vLLM's scheduler without a LoRA config
    /// checks none; adapters still key the hashes).
    pub max_loras: Option<usize>,
    /// Prompt tokens past a step's range that an EAGLE-style drafter reads
    /// (vLLM's `num_prefill_lookahead_tokens`: 1 for EAGLE, EAGLE-3 and one
    /// MTP module, `num_speculative_tokens` for multi-module MTP, else 0;
    /// §4.13): the encoder inputs those fall in run in the step too; above
    /// 1, no prefill chunk ends within this many tokens of the prompt's end,
    /// and the last `drafter_read_ahead − 1` computed tokens are not hash
    /// cached (the drafter may prefill them again).
    pub drafter_read_ahead: usize,
    /// The encoder's limits, for a model that takes images or audio
    /// (§4.15); `None`: a text model, which refuses multimodal inputs.
    pub encoder: Option<EncoderConfig>,
    pub runner: Runner,
    pub cache: KvCacheConfig,
}

/// The encoder's limits (vLLM's `MultiModalBudget`), in embeddings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EncoderConfig {
    /// Embeddings the encoder may compute in one step (vLLM's
    /// `encoder_compute_budget`: at least one largest item).
    pub compute_budget: usize,
    /// Embeddings the encoder cache holds (at least one largest item).
    pub cache_size: usize,
    /// Never split an item's placeholders across steps.
    pub disable_chunked_mm_input: bool,
}

fn invalid(msg: String) -> Result<(), Error> {
    Err(Error::InvalidArgument(msg))
}

impl SchedulerConfig {
    /// Check every rule of docs/scheduling.md §2, naming the first field that breaks one.
    /// Whether the cache holds one `max_model_len` sequence is the engine's
    /// start-up check, not the scheduler's (vLLM's scheduler runs with
    /// whatever cache it is given, and so does this one, for the drop-in).
    pub fn validate(&self) -> Result<(), Error> {
        self.cache.validate()?;
        let c = self;
        check_range("max_num_seqs", c.max_num_seqs, 1, MAX_NUM_SEQS)?;
        check_range("max_model_len", c.max_model_len, 2, MAX_MODEL_LEN)?;
        check_range(
            "max_num_batched_tokens",
            c.max_num_batched_tokens,
            1,
            MAX_NUM_BATCHED_TOKENS,
        )?;
        check_range(
            "max_num_scheduled_tokens",
            c.max_num_scheduled_tokens,
            1,
            MAX_NUM_BATCHED_TOKENS,
        )?;
        check_range(
            "max_num_active_seqs",
            c.max_num_active_seqs,
            1,
            c.max_num_seqs,
        )?;
        check_range(
            "watermark_blocks",
            c.watermark_blocks,
            0,
            c.cache.num_blocks.saturating_sub(1),
        )?;
        check_range(
            "prefill_schedule_interval",
            c.prefill_schedule_interval,
            1,
            MAX_NUM_SEQS,
        )?;
        check_range("decode_stagger", c.decode_stagger, 0, MAX_NUM_SEQS)?;
        check_range(
            "num_speculative_tokens",
            c.num_speculative_tokens,
            0,
            c.max_model_len,
        )?;
        check_range(
            "num_draft_slots",
            c.num_draft_slots,
            0,
            c.num_speculative_tokens,
        )?;
        if let Some(table) = &c.drafts_by_batch_size {
            if c.num_speculative_tokens == 0 || table.len() != c.max_num_seqs + 1 {
                return invalid(format!(
                    "drafts_by_batch_size needs speculative decoding and max_num_seqs + 1 = {} \
                     entries, got {}",
                    c.max_num_seqs + 1,
                    table.len()
                ));
            }
            if let Some(&k) = table.iter().find(|&&k| k > c.num_speculative_tokens) {
                return invalid(format!(
                    "drafts_by_batch_size: {k} drafts is more than num_speculative_tokens ({})",
                    c.num_speculative_tokens
                ));
            }
        }
        // An EAGLE-style drafter reads one token ahead; multi-module MTP one
        // per module.
        check_range(
            "drafter_read_ahead",
            c.drafter_read_ahead,
            0,
            c.num_speculative_tokens.max(1),
        )?;
        if let Some(max_loras) = c.max_loras {
            check_range("max_loras", max_loras, 1, MAX_NUM_SEQS)?;
        }
        if let Some(e) = &c.encoder {
            check_range(
                "encoder_compute_budget",
                e.compute_budget,
                1,
                MAX_NUM_BATCHED_TOKENS,
            )?;
            check_range("encoder_cache_size", e.cache_size, 1, MAX_MODEL_LEN)?;
        }
        if c.cache.has_cross_attention() && c.encoder.is_none() {
            // Cross-attention blocks are taken when the encoder input runs.
            return invalid(
                "a cross-attention KV-cache group (an encoder-decoder model) needs an encoder: \
                 configure its encoder budget and cache size"
                    .to_string(),
            );
        }
        let caches_states =
            c.cache.enable_prefix_caching && c.cache.groups.iter().any(|g| g.kind.is_recurrent());
        if caches_states && !c.enable_chunked_prefill {
            // A prompt's states are cached at the ends of its chunks (vLLM
            // asserts the same).
            return invalid(
                "enable_chunked_prefill must be true with prefix caching over a Mamba KV-cache \
                 group (vLLM's mamba_cache_mode 'align')"
                    .to_string(),
            );
        }
        if c.runner != Runner::Generate && c.num_speculative_tokens > 0 {
            // vLLM builds no drafter for a pooling model or an encoder alone.
            return invalid(format!(
                "num_speculative_tokens ({}) must be 0 for runner '{}': it samples no \
                 tokens to verify drafts against",
                c.num_speculative_tokens,
                c.runner.name()
            ));
        }
        if c.runner == Runner::EncoderOnly && c.encoder.is_none() {
            return invalid(
                "runner 'encoder_only' runs a multimodal encoder: configure its encoder budget \
                 and cache size"
                    .to_string(),
            );
        }
        if c.max_num_batched_tokens < c.max_num_seqs {
            return invalid(format!(
                "max_num_batched_tokens ({}) must be >= max_num_seqs ({})",
                c.max_num_batched_tokens, c.max_num_seqs
            ));
        }
        // An encoder-only runner chunks regardless: vLLM's engine turns
        // chunked prefill off for it (it has no KV cache) after checking.
        let whole_prompts = !c.enable_chunked_prefill && c.runner != Runner::EncoderOnly;
        if whole_prompts && c.max_num_batched_tokens < c.max_model_len {
            return invalid(format!(
                "max_num_batched_tokens ({}) must be >= max_model_len ({}) when chunked \
                 prefill is off",
                c.max_num_batched_tokens, c.max_model_len
            ));
        }
        if c.long_prefill_token_threshold > c.max_model_len {
            return invalid(format!(
                "long_prefill_token_threshold ({}) must be <= max_model_len ({})",
                c.long_prefill_token_threshold, c.max_model_len
            ));
        }
        Ok(())
    }
}
