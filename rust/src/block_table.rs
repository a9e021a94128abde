//! A request's block table (docs/scheduling.md §7.1): block `k` holds its tokens
//! `[k·bs, (k+1)·bs)`; the first `num_cached` blocks are hash-cached.

use crate::block::BlockId;

/// The blocks one request holds, in token order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BlockTable {
    pub(crate) blocks: Vec<BlockId>,
    pub(crate) num_cached: usize,
    /// A copy of the last block id (0 when empty): a decode step's tokens
    /// fall in the last block, and reading it here spares a cache miss on
    /// the table's heap array for every request in every step.
    pub(crate) last: BlockId,
    /// Blocks the latest allocation appended (the step's new block ids of
    /// a running request). 32 bits, like the state's fields, keep a
    /// request's hot lines as they were.
    grown: u32,
    /// A recurrent group's states in cache mode "align"; unused otherwise.
    pub(crate) states: StateSlots,
}

/// Where a recurrent group's table keeps its live states in cache mode
/// "align" (docs/scheduling.md §7.15; vLLM's `MambaManager` bookkeeping):
/// the table holds a state block at each position a chunk ended on, nulls
/// between them, and the scratch states at its end.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StateSlots {
    /// 0 before the table's first allocation; then 1, or 2 more than the
    /// position of the state the latest growth started from (freed once
    /// the step after it has read it). Positions are below `MAX_MODEL_LEN`.
    stage: u32,
    /// Positions below this one were given back already.
    pub(crate) retired: u32,
}

impl StateSlots {
    /// The table has been through an allocation (its scratch states are
    /// taken): later growth is one state block per step.
    pub(crate) fn allocated(&self) -> bool {
        self.stage > 0
    }

    pub(crate) fn set_allocated(&mut self) {
        self.stage = self.stage.max(1);
    }

    /// The position of the state the latest growth started from.
    pub(crate) fn previous(&self) -> Option<usize> {
        (self.stage as usize).checked_sub(2)
    }

    /// Record it (the table is allocated once the growth ends).
    pub(crate) fn set_previous(&mut self, position: usize) {
        self.stage = position as u32 + 2;
    }
}

impl BlockTable {
    /// The block ids, in token order.
    pub fn block_ids(&self) -> &[BlockId] {
        &self.blocks
    }

    /// How many leading blocks are in the prefix-cache map.
    pub fn num_cached_blocks(&self) -> usize {
        self.num_cached
    }

    pub(crate) fn sync_last(&mut self) {
        self.last = self.blocks.last().copied().unwrap_or(0);
    }

    /// Number of blocks held.
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    /// Blocks the latest allocation appended.
    pub(crate) fn grown(&self) -> usize {
        self.grown as usize
    }

    pub(crate) fn set_grown(&mut self, blocks: usize) {
        self.grown = blocks as u32;
    }

    /// Whether the table holds no block.
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }
}
