//! What one `schedule()` decided and what one `update_from_output()`
//! reported, as columns (docs/scheduling.md §4.7, §5.3).

use crate::block::BlockId;
use crate::request::{RequestStatus, StopReason};
use crate::slab::Slot;
use crate::spec_decode::{Drafts, SpecDecodingStats};

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

/// Declares the step's columns once: the struct, their names in order, and
/// their hand-off. Adding a column is one line here (and its value in
/// `StepOutput`'s push methods); Python reads the names and dtypes from
/// `_core.STEP_COLUMNS`.
macro_rules! step_columns {
    ($($(#[doc = $doc:expr])* $name:ident: $ty:ident,)*) => {
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

            /// A copy of the column called `name`; None for no such column.
            pub fn named(&self, name: &str) -> Option<Column> {
                match name {
                    $(stringify!($name) => Some(column_of!($ty, self.$name.clone())),)*
                    _ => None,
                }
            }
        }
    };
}

step_columns! {
    /// The request's slot: its stable row while it lives.
    req_slots: i32,
    /// Tokens scheduled for it this step.
    num_scheduled: i32,
    /// Tokens computed before this step (the prefix hit for new and
    /// resumed requests).
    num_computed_tokens: i32,
    /// How it entered the step: a [`Kind`] as `u8`.
    kinds: u8,
    /// The step reaches its last known token, so it samples one.
    samples: bool,
    /// Output tokens before this step, placeholders included (what vLLM's
    /// model runner is told as `num_output_tokens`).
    num_output_tokens: i32,
    /// Whole tables for new and resumed requests, new blocks for running
    /// ones, flattened per row and KV-cache group: with `G` groups, row `i`
    /// group `g` owns `new_block_ids[offsets[i·G+g]..offsets[i·G+g+1]]`.
    new_block_ids: i32,
    /// Offsets into `new_block_ids` (rows · G + 1).
    new_block_offsets: i32,
    /// Per scheduled token: its position. Made on read
    /// ([`StepOutput::full_columns`]); empty in [`StepOutput::columns`].
    positions: i64,
    /// Per scheduled token: its KV-cache slot
    /// (`block_id * block_size + position % block_size`); with `G` groups,
    /// `G` runs of the step's tokens, group by group. Made on read, as
    /// `positions` is.
    slot_mapping: i64,
    /// Prefix sums of the token counts (rows + 1).
    query_start_loc: i32,
    /// `num_computed_tokens + num_scheduled` per row.
    seq_lens: i32,
    /// Draft tokens scheduled per row: the last ones of its scheduled tokens.
    num_spec_tokens: i32,
    /// The scheduled drafts, flattened in row order (-1: a placeholder
    /// for a draft the runner proposes itself, under async scheduling).
    spec_token_ids: i64,
}

/// One step's decisions, in scheduling order, and the model runner's inputs.
#[derive(Clone, Debug, Default)]
pub struct StepOutput {
    pub entries: Vec<StepEntry>,
    /// The entries as columns, except the per-token ones (`positions`,
    /// `slot_mapping`), which [`Self::full_columns`] makes from `spans`:
    /// a step of 8,192 prefill tokens writes 16 times fewer values, and
    /// callers that never read them (the vLLM drop-in, whose runner
    /// computes its own; a simulation) pay nothing for them.
    pub columns: StepColumns,
    /// Per row and KV-cache group (row `i` group `g` owns
    /// `span_blocks[span_offsets[i·G+g]..span_offsets[i·G+g+1]]`): the blocks
    /// its scheduled tokens fall in, as the table held them this step.
    pub(crate) span_blocks: Vec<BlockId>,
    pub(crate) span_offsets: Vec<u32>,
    pub(crate) block_size: usize,
    pub(crate) num_groups: usize,
    /// Preempted since the previous step's output (sorted).
    pub preempted_req_ids: Vec<String>,
    /// Finished since the previous step's output (sorted).
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
    /// Identifies the scheduler and step, so an output is applied once,
    /// to the scheduler that made it.
    pub(crate) scheduler_id: u64,
    pub(crate) step_id: u64,
}

impl StepOutput {
    /// An empty step with room for `rows` entries, over `num_groups`
    /// KV-cache groups of `block_size`-token blocks.
    pub(crate) fn with_capacity(rows: usize, num_groups: usize, block_size: usize) -> Self {
        let c = StepColumns {
            req_slots: Vec::with_capacity(rows),
            num_scheduled: Vec::with_capacity(rows),
            num_computed_tokens: Vec::with_capacity(rows),
            kinds: Vec::with_capacity(rows),
            samples: Vec::with_capacity(rows),
            num_output_tokens: Vec::with_capacity(rows),
            new_block_ids: Vec::new(),
            new_block_offsets: Vec::with_capacity(rows + 1), // grows with groups
            positions: Vec::new(),
            slot_mapping: Vec::new(),
            query_start_loc: Vec::with_capacity(rows + 1),
            seq_lens: Vec::with_capacity(rows),
            num_spec_tokens: Vec::with_capacity(rows),
            spec_token_ids: Vec::new(),
        };
        let mut out = StepOutput {
            columns: c,
            span_blocks: Vec::with_capacity(rows * num_groups),
            span_offsets: Vec::with_capacity(rows * num_groups + 1),
            block_size,
            num_groups,
            ..Default::default()
        };
        out.columns.query_start_loc.push(0);
        out.columns.new_block_offsets.push(0);
        out.span_offsets.push(0);
        out
    }

    /// Start a row: the entry's fields.
    pub(crate) fn push_entry(&mut self, e: &StepEntry, num_output_tokens: usize) {
        let c = &mut self.columns;
        c.req_slots.push(e.slot as i32);
        c.num_scheduled.push(e.num_tokens as i32);
        c.num_computed_tokens.push(e.num_computed_tokens as i32);
        c.kinds.push(e.kind as u8);
        c.samples.push(e.samples);
        c.num_output_tokens.push(num_output_tokens as i32);
        c.num_spec_tokens.push(e.drafts.len() as i32);
        e.drafts.write_to(&mut c.spec_token_ids);
    }

    /// The row's new blocks.
    pub(crate) fn push_new_blocks(&mut self, ids: &[BlockId]) {
        let c = &mut self.columns;
        c.new_block_ids.extend(ids.iter().map(|&b| b as i32));
    }

    /// One KV-cache group's blocks that the row's scheduled tokens fall in.
    pub(crate) fn push_span(&mut self, blocks: &[BlockId]) {
        self.span_blocks.extend_from_slice(blocks);
        self.span_offsets.push(self.span_blocks.len() as u32);
    }

    /// Close a KV-cache group's new blocks in the row (all but the last
    /// group's; `end_entry` closes the last).
    pub(crate) fn end_group(&mut self) {
        let c = &mut self.columns;
        c.new_block_offsets.push(c.new_block_ids.len() as i32);
    }

    /// Close the row; `seq_len` is where its tokens end.
    pub(crate) fn end_entry(&mut self, seq_len: usize, num_tokens: usize) {
        let c = &mut self.columns;
        c.new_block_offsets.push(c.new_block_ids.len() as i32);
        let start = *c.query_start_loc.last().expect("starts with 0");
        c.query_start_loc.push(start + num_tokens as i32);
        c.seq_lens.push(seq_len as i32);
    }

    /// The column called `name`, made from the rows' spans for the
    /// per-token ones; None for no such column.
    pub fn column(&self, name: &str) -> Option<Column> {
        match name {
            "positions" => Some(Column::I64(self.positions())),
            "slot_mapping" => Some(Column::I64(self.slot_mapping())),
            _ => self.columns.named(name),
        }
    }

    /// Every column, the per-token ones made from the rows' spans.
    pub fn full_columns(&self) -> StepColumns {
        let mut c = self.columns.clone();
        c.positions = self.positions();
        c.slot_mapping = self.slot_mapping();
        c
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

    /// Per scheduled token and KV-cache group: its KV-cache slot, group 0's
    /// run of the step's tokens first.
    pub fn slot_mapping(&self) -> Vec<i64> {
        let bs = self.block_size;
        let groups = self.num_groups;
        let mut out = Vec::with_capacity(self.total_num_scheduled_tokens() * groups);
        for g in 0..groups {
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
        let c = &self.columns;
        let k = i * num_groups + g;
        &c.new_block_ids[c.new_block_offsets[k] as usize..c.new_block_offsets[k + 1] as usize]
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
}
