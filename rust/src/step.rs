//! What one `schedule()` decided and what one `update_from_output()`
//! reported, as columns (docs/scheduling.md §4.7, §5.3).

use crate::block::BlockId;
use crate::request::{RequestStatus, StopReason};
use crate::scheduler::ScheduledEncoderInputs;
use crate::slab::Slot;
use crate::spec_decode::{Drafts, SpecDecodingStats};
use std::sync::Arc;

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
    /// Output tokens before this step, placeholders included (written as
    /// the step ends).
    pub num_output_tokens: usize,
    /// The drafts scheduled: the last `drafts.len()` of its `num_tokens`
    /// positions (vLLM's `scheduled_spec_decode_tokens`).
    pub drafts: Drafts,
}

/// One column of a step, as it crosses to Python (one NumPy dtype each).
#[derive(Clone, Debug, PartialEq)]
pub enum Column {
    I32(Vec<i32>),
    I64(Vec<i64>),
    U8(Vec<u8>),
    Bool(Vec<bool>),
}

macro_rules! dtype_of {
    (i32) => {
        "int32"
    };
    (i64) => {
        "int64"
    };
    (u8) => {
        "uint8"
    };
    (bool) => {
        "bool"
    };
}

macro_rules! column_of {
    (i32, $v:expr) => {
        Column::I32($v)
    };
    (i64, $v:expr) => {
        Column::I64($v)
    };
    (u8, $v:expr) => {
        Column::U8($v)
    };
    (bool, $v:expr) => {
        Column::Bool($v)
    };
}

/// Declares the step's columns once: the struct, their names in order,
/// how each is made from a step's entries, and their hand-off. Adding a
/// column is one line here; Python reads the names and dtypes from
/// `_core.STEP_COLUMNS`.
macro_rules! step_columns {
    ($($(#[doc = $doc:expr])* $name:ident: $ty:ident = $make:expr,)*) => {
        /// A step's decisions as columns, for the model runner: one row per
        /// scheduled request in scheduling order, except where a field says
        /// otherwise.
        #[derive(Clone, Debug, Default, PartialEq)]
        pub struct StepColumns {
            $($(#[doc = $doc])* pub $name: Vec<$ty>,)*
        }

        impl StepColumns {
            /// The columns' names and NumPy dtypes, in declaration order.
            pub const DTYPES: &'static [(&'static str, &'static str)] =
                &[$((stringify!($name), dtype_of!($ty))),*];

            /// Every column by name, moved out (no copy).
            pub fn into_named(self) -> Vec<(&'static str, Column)> {
                vec![$((stringify!($name), column_of!($ty, self.$name))),*]
            }
        }

        impl StepOutput {
            /// Every column, made from the entries.
            pub fn full_columns(&self) -> StepColumns {
                StepColumns {
                    $($name: ($make)(self),)*
                }
            }

            /// The column called `name`, made from the entries; None for
            /// no such column.
            pub fn column(&self, name: &str) -> Option<Column> {
                match name {
                    $(stringify!($name) => Some(column_of!($ty, ($make)(self))),)*
                    _ => None,
                }
            }
        }
    };
}

step_columns! {
    /// The request's slot: its stable row while it lives.
    req_slots: i32 = |s: &StepOutput| s.per_row(|e| e.slot as i32),
    /// Tokens scheduled for it this step.
    num_scheduled: i32 = |s: &StepOutput| s.per_row(|e| e.num_tokens as i32),
    /// Tokens computed before this step (the prefix hit for new and
    /// resumed requests).
    num_computed_tokens: i32 = |s: &StepOutput| s.per_row(|e| e.num_computed_tokens as i32),
    /// How it entered the step: a [`Kind`] as `u8`.
    kinds: u8 = |s: &StepOutput| s.per_row(|e| e.kind as u8),
    /// The step reaches its last known token, so it samples one.
    samples: bool = |s: &StepOutput| s.per_row(|e| e.samples),
    /// Output tokens before this step, placeholders included (what vLLM's
    /// model runner is told as `num_output_tokens`).
    num_output_tokens: i32 = |s: &StepOutput| s.per_row(|e| e.num_output_tokens as i32),
    /// Whole tables for new and resumed requests, new blocks for running
    /// ones, flattened per row and KV-cache group: with `G` groups, row `i`
    /// group `g` owns `new_block_ids[offsets[i·G+g]..offsets[i·G+g+1]]`.
    new_block_ids: i32 = |s: &StepOutput| s.new_block_ids.clone(),
    /// Offsets into `new_block_ids` (rows · G + 1).
    new_block_offsets: i32 = |s: &StepOutput| s.new_block_offsets.clone(),
    /// Per scheduled token: its position.
    positions: i64 = StepOutput::positions,
    /// Per scheduled token: its KV-cache slot
    /// (`block_id * block_size + position % block_size`); with `G` groups,
    /// `G` runs of the step's tokens, group by group.
    slot_mapping: i64 = StepOutput::slot_mapping,
    /// Prefix sums of the token counts (rows + 1).
    query_start_loc: i32 = StepOutput::query_start_loc,
    /// `num_computed_tokens + num_scheduled` per row.
    seq_lens: i32 = |s: &StepOutput| s.per_row(|e| (e.num_computed_tokens + e.num_tokens) as i32),
    /// Draft tokens scheduled per row: the last ones of its scheduled tokens.
    num_spec_tokens: i32 = |s: &StepOutput| s.per_row(|e| e.drafts.len() as i32),
    /// The scheduled drafts, flattened in row order (-1: a placeholder
    /// for a draft the runner proposes itself, under async scheduling).
    spec_token_ids: i64 = StepOutput::spec_token_ids,
}

/// One step's decisions, in scheduling order, and the model runner's inputs.
#[derive(Clone, Debug, Default)]
pub struct StepOutput {
    pub entries: Vec<StepEntry>,
    /// Whole tables for new and resumed requests, new blocks for running
    /// ones (the `new_block_ids` column), and where each row's and group's
    /// start (`new_block_offsets`): the one part of the columns the entries
    /// do not hold. Every other column is made from the entries when read
    /// ([`Self::column`]): a step writes one entry per row, not fourteen
    /// columns, and a caller that reads none (the vLLM drop-in, whose
    /// runner computes its own; a simulation) pays nothing for them.
    pub(crate) new_block_ids: Vec<i32>,
    pub(crate) new_block_offsets: Vec<i32>,
    /// Per row and KV-cache group (row `i` group `g` owns
    /// `span_blocks[span_offsets[i·G+g]..span_offsets[i·G+g+1]]`): the blocks
    /// its scheduled tokens fall in, as the table held them this step.
    pub(crate) span_blocks: Vec<BlockId>,
    pub(crate) span_offsets: Vec<u32>,
    /// Tokens per block of each KV-cache group.
    pub(crate) group_block_sizes: Arc<[usize]>,
    pub(crate) num_groups: usize,
    /// Groups without per-token slots (bit `g`): cross-attention's are the
    /// encoder's, a recurrent group's blocks hold states; the slot mapping
    /// leaves them out.
    pub(crate) slotless_groups: u64,
    /// Attention blocks handed out during the step, for the runner to zero
    /// (vLLM's `new_block_ids_to_zero`; empty without recurrent groups).
    pub new_block_ids_to_zero: Vec<BlockId>,
    /// Preempted since the previous step's output, in preemption order
    /// (the order vLLM adds them to its set).
    pub preempted_req_ids: Vec<String>,
    /// Finished since the previous step's output, in the order they
    /// finished (the order vLLM adds them to its set).
    pub finished_req_ids: Vec<String>,
    /// A structured-output request samples this step (vLLM's
    /// `has_structured_output_requests`: the model runner applies grammars).
    pub has_structured_output_requests: bool,
    /// Async: a structured-output request sampling this step still has its
    /// previous token in flight, so its grammar mask must wait for that
    /// output (vLLM's `pending_structured_output_tokens`).
    pub pending_structured_output_tokens: bool,
    /// A request scheduled this step may verify drafts proposed after it:
    /// false when each one either stops before its prompt's end or reaches
    /// `max_tokens` with the token it samples (vLLM's V2 runner then skips
    /// drafting: `skip_drafts`).
    pub drafts_needed: bool,
    /// Requests this step's waiting pass released, their grammar compiled,
    /// in the order reached (admitted or not).
    pub grammar_released: Vec<Slot>,
    /// Requests this step's waiting pass reached whose grammar failed to
    /// compile, in the order reached (still held; the caller ends them).
    pub grammar_failed: Vec<Slot>,
    /// The encoder inputs the runner computes this step, per request in
    /// scheduling order (vLLM's `scheduled_encoder_inputs`).
    pub scheduled_encoder_inputs: Vec<ScheduledEncoderInputs>,
    /// Encoder-cache entries evicted since the previous step (vLLM's
    /// `free_encoder_mm_hashes`): the runner drops them.
    pub free_encoder_mm_hashes: Vec<String>,
    /// Requests whose encoder input has an identifier the cache holds with
    /// another number of embeddings; nothing was scheduled for them and
    /// the caller ends them with an error.
    pub encoder_mismatch: Vec<Slot>,
    /// An admission this step takes external tokens a KV connector loads
    /// in the step itself (vLLM's `has_sync_kv_loads`, §4.19).
    pub has_sync_kv_loads: bool,
    /// Identifies the scheduler and step, so an output is applied once,
    /// to the scheduler that made it.
    pub(crate) scheduler_id: u64,
    pub(crate) step_id: u64,
}

impl StepOutput {
    /// An empty step with room for `rows` entries, over `num_groups`
    /// KV-cache groups of `group_block_sizes`-token blocks.
    pub(crate) fn with_capacity(rows: usize, group_block_sizes: &Arc<[usize]>) -> Self {
        let num_groups = group_block_sizes.len();
        let mut out = StepOutput {
            entries: Vec::new(),
            new_block_offsets: Vec::with_capacity(rows * num_groups + 1),
            span_blocks: Vec::with_capacity(rows * num_groups),
            span_offsets: Vec::with_capacity(rows * num_groups + 1),
            group_block_sizes: Arc::clone(group_block_sizes),
            num_groups,
            ..Default::default()
        };
        out.new_block_offsets.push(0);
        out.span_offsets.push(0);
        out
    }

    /// The row's new blocks in one KV-cache group.
    pub(crate) fn push_new_blocks(&mut self, ids: &[BlockId]) {
        self.new_block_ids.extend(ids.iter().map(|&b| b as i32));
    }

    /// Close the row's new blocks in one KV-cache group (every group's,
    /// the last included).
    pub(crate) fn end_group(&mut self) {
        self.new_block_offsets.push(self.new_block_ids.len() as i32);
    }

    /// One KV-cache group's blocks that the row's scheduled tokens fall in.
    pub(crate) fn push_span(&mut self, blocks: &[BlockId]) {
        self.span_blocks.extend_from_slice(blocks);
        self.span_offsets.push(self.span_blocks.len() as u32);
    }

    /// One value per row.
    fn per_row<T>(&self, value: impl Fn(&StepEntry) -> T) -> Vec<T> {
        self.entries.iter().map(value).collect()
    }

    /// Prefix sums of the rows' token counts, from 0.
    pub fn query_start_loc(&self) -> Vec<i32> {
        let mut out = Vec::with_capacity(self.entries.len() + 1);
        let mut sum = 0i32;
        out.push(sum);
        for e in &self.entries {
            sum += e.num_tokens as i32;
            out.push(sum);
        }
        out
    }

    /// The rows' scheduled drafts, flattened in row order (-1 for a
    /// placeholder).
    pub fn spec_token_ids(&self) -> Vec<i64> {
        let mut out = Vec::new();
        for e in &self.entries {
            e.drafts.write_to(&mut out);
        }
        out
    }

    /// Per scheduled token: its position.
    pub fn positions(&self) -> Vec<i64> {
        let mut out = Vec::with_capacity(self.total_num_scheduled_tokens());
        for e in &self.entries {
            let start = e.num_computed_tokens as i64;
            out.extend(start..start + e.num_tokens as i64);
        }
        out
    }

    /// Per scheduled token and decoder KV-cache group: its KV-cache slot,
    /// group 0's run of the step's tokens first (cross-attention and
    /// recurrent groups have none).
    pub fn slot_mapping(&self) -> Vec<i64> {
        let groups = self.num_groups;
        let mut out = Vec::with_capacity(self.total_num_scheduled_tokens() * groups);
        for g in (0..groups).filter(|&g| self.slotless_groups & 1 << g == 0) {
            let bs = self.group_block_sizes[g];
            for (i, e) in self.entries.iter().enumerate() {
                let k = i * groups + g;
                let span = &self.span_blocks
                    [self.span_offsets[k] as usize..self.span_offsets[k + 1] as usize];
                let first_block = e.num_computed_tokens / bs;
                for p in e.num_computed_tokens..e.num_computed_tokens + e.num_tokens {
                    let id = span[p / bs - first_block];
                    out.push(id as i64 * bs as i64 + (p % bs) as i64);
                }
            }
        }
        out
    }

    /// Tokens scheduled in all.
    pub fn total_num_scheduled_tokens(&self) -> usize {
        self.entries.iter().map(|e| e.num_tokens).sum()
    }

    /// Row `i`'s block ids in KV-cache group `g` (whole table or new
    /// blocks), for a step of `num_groups` groups.
    pub fn group_block_ids_of(&self, i: usize, g: usize, num_groups: usize) -> &[i32] {
        let k = i * num_groups + g;
        let offsets = &self.new_block_offsets;
        &self.new_block_ids[offsets[k] as usize..offsets[k + 1] as usize]
    }

    /// Row `i`'s block ids, for a step of one KV-cache group.
    pub fn block_ids_of(&self, i: usize) -> &[i32] {
        self.group_block_ids_of(i, 0, 1)
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
    pub stop_reason: Option<StopReason>,
    /// All its tokens, prompt first, and its `num_computed_tokens`: what
    /// it ended with.
    pub token_ids: Vec<u32>,
    pub num_computed_tokens: usize,
    /// A streaming session's turn ended, not the request: it lives on,
    /// waiting for (or with) its next chunk (docs/scheduling.md §4.12).
    pub session_continues: bool,
}

/// What `update_from_output` reported, in scheduling order: one record per
/// request that got tokens.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UpdateOutput {
    pub records: Vec<UpdateRecord>,
    pub tokens: Vec<u32>,
    pub finished: Vec<Finished>,
    /// Drafts verified in this output; `None` when no request that got
    /// tokens had drafts scheduled.
    pub spec_decoding_stats: Option<SpecDecodingStats>,
    /// Requests the update ended with an error, in the order ended: those
    /// a failed KV load ended (the "fail" policy, §4.19) and those the
    /// caller named. They have no record of their own from the ending.
    pub errored: Vec<ErroredRequest>,
}

/// A request an update ended with an error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ErroredRequest {
    /// Its slot when it ended (free again unless its blocks are held).
    pub slot: Slot,
    pub request_id: String,
    /// All its tokens, prompt first, and its `num_computed_tokens`, as it
    /// ended (the step's output applied): what vLLM's `Request` holds then.
    pub token_ids: Vec<u32>,
    pub num_computed_tokens: usize,
}
