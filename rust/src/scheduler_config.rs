//! Scheduler settings (spec §2), validated like vLLM's.

use crate::cdiv;
use crate::error::KvError;
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

/// Everything `Scheduler::new` needs.
#[derive(Clone, Debug, PartialEq)]
pub struct SchedulerConfig {
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: usize,
    pub max_model_len: usize,
    pub enable_chunked_prefill: bool,
    /// Per-request per-step token cap; 0 = off.
    pub long_prefill_token_threshold: usize,
    pub policy: Policy,
    /// The full-prompt admission gate (spec §7.6).
    pub scheduler_reserve_full_isl: bool,
    /// vLLM's async scheduling: the next step is scheduled before this
    /// step's output arrives, each sampling request holding an output
    /// placeholder for the token in flight (vLLM's `AsyncScheduler`; the spec
    /// plans it for later, docs/architecture.md describes it).
    pub async_scheduling: bool,
    pub cache: KvCacheConfig,
}

fn invalid(msg: String) -> Result<(), KvError> {
    Err(KvError::Invalid(msg))
}

impl SchedulerConfig {
    /// Check every rule of spec §2, naming the first field that breaks one.
    /// Whether the cache holds one `max_model_len` sequence is vLLM's
    /// start-up check, not the scheduler's: see [`SchedulerConfig::check_fits`].
    pub fn validate(&self) -> Result<(), KvError> {
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
        if c.max_num_batched_tokens < c.max_num_seqs {
            return invalid(format!(
                "max_num_batched_tokens ({}) must be >= max_num_seqs ({})",
                c.max_num_batched_tokens, c.max_num_seqs
            ));
        }
        if !c.enable_chunked_prefill && c.max_num_batched_tokens < c.max_model_len {
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

    /// vLLM's start-up refusal: the cache must hold one `max_model_len`
    /// sequence. vLLM's scheduler itself runs with less (a request that
    /// cannot fit waits), and so does this one, for the vLLM drop-in.
    pub fn check_fits(&self) -> Result<(), KvError> {
        let c = self;
        let needed = cdiv(c.max_model_len, c.cache.block_size);
        if needed > c.cache.num_blocks - 1 {
            return invalid(format!(
                "num_blocks ({}) holds {} usable blocks, fewer than the {needed} one sequence \
                 of max_model_len ({}) needs",
                c.cache.num_blocks,
                c.cache.num_blocks - 1,
                c.max_model_len
            ));
        }
        Ok(())
    }
}
