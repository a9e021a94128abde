//! What one `schedule()` decided and what one `update_from_output()`
//! reported, as columns (spec §4.7, §5.3).

use crate::request::RequestStatus;
use crate::request_queue::Slot;

/// How a request entered this step.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// First admission.
    New = 0,
    /// Admitted again after a preemption.
    Resumed = 1,
    /// Continuing.
    Running = 2,
}

/// One request's share of a step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepEntry {
    pub slot: Slot,
    /// The slot's generation when scheduled: a request freed meanwhile (and
    /// its slot reused) is recognised and skipped by the update.
    pub generation: u32,
    pub num_tokens: usize,
    pub kind: Kind,
    /// Before this step; the prefix hit for new and resumed requests.
    pub num_computed_tokens: usize,
    /// The step reaches the request's last known token, so it samples.
    pub samples: bool,
    /// Where this step's blocks start in the table (0: the whole table).
    pub(crate) block_start: usize,
}

/// One step's decisions, in scheduling order, and the model runner's inputs.
#[derive(Clone, Debug, Default)]
pub struct StepOutput {
    pub entries: Vec<StepEntry>,
    /// The entries' fields as columns, for the model runner.
    pub req_slots: Vec<i32>,
    pub num_scheduled: Vec<i32>,
    pub num_computed_tokens: Vec<i32>,
    pub kinds: Vec<u8>,
    pub samples: Vec<bool>,
    /// Output tokens, placeholders included, before this step (what vLLM's
    /// model runner is told as `num_output_tokens`).
    pub num_output_tokens: Vec<i32>,
    /// Whole tables for new/resumed entries, new blocks for running ones,
    /// flattened; entry `i` owns `new_block_ids[offsets[i]..offsets[i+1]]`.
    pub new_block_ids: Vec<i32>,
    pub new_block_offsets: Vec<i32>,
    /// Per scheduled token: its position and its KV-cache slot
    /// (`block_id * block_size + position % block_size`).
    pub positions: Vec<i64>,
    pub slot_mapping: Vec<i64>,
    /// Prefix sums of the token counts (n + 1 entries).
    pub query_start_loc: Vec<i32>,
    /// `num_computed_tokens + num_tokens` per entry.
    pub seq_lens: Vec<i32>,
    /// Preempted since the previous step's output (sorted).
    pub preempted_req_ids: Vec<String>,
    /// Finished since the previous step's output (sorted).
    pub finished_req_ids: Vec<String>,
    /// Identifies the scheduler and step, so an output is applied once,
    /// to the scheduler that made it.
    pub(crate) scheduler_id: u64,
    pub(crate) step_id: u64,
}

impl StepOutput {
    /// Tokens scheduled in all.
    pub fn total_num_scheduled_tokens(&self) -> usize {
        self.entries.iter().map(|e| e.num_tokens).sum()
    }
}

/// One request's result from `update_from_output`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UpdateRecord {
    /// The request's row in the step's entries.
    pub entry: u32,
    /// The request's slot (already free again if it finished).
    pub slot: Slot,
    /// This record's tokens end at `UpdateOutput::tokens[..tokens_end]`
    /// (they start where the previous record's end).
    pub tokens_end: usize,
    /// Tokens of the request held in hash-cached blocks after this output
    /// (vLLM's `estimate_cached_tokens`, for its prefill stats).
    pub cached_tokens: usize,
}

/// A request that finished in `update_from_output` (it is freed already).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finished {
    /// Its row in [`UpdateOutput::records`].
    pub record: usize,
    pub request_id: String,
    pub status: RequestStatus,
    /// The stop token that ended it.
    pub stop_reason: Option<u32>,
    /// All its tokens, prompt first, and its `num_computed_tokens`: what
    /// it ended with.
    pub token_ids: Vec<u32>,
    pub num_computed_tokens: usize,
}

/// What `update_from_output` reported, in scheduling order: one record per
/// request that got tokens.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UpdateOutput {
    pub records: Vec<UpdateRecord>,
    pub tokens: Vec<u32>,
    pub finished: Vec<Finished>,
}
