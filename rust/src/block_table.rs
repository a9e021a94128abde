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
    /// A block keyed by the hash at fewer tokens than it ends at, beside
    /// groups of different block sizes (docs/scheduling.md §7.16: a
    /// full-attention prompt tail, a recurrent prefill checkpoint): its
    /// position and those tokens (vLLM's `block_hash_num_tokens`).
    partial_key: Option<(u32, u32)>,
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
    /// The tokens the block at `position` is keyed for, if it is: where it
    /// ends, unless it holds a partial key (`set_partial_key`).
    pub(crate) fn keyed_tokens(&self, position: usize, block_size: usize) -> usize {
        match self.partial_key {
            Some((p, tokens)) if p as usize == position => tokens as usize,
            _ => (position + 1) * block_size,
        }
    }

    /// The block with a partial key and the tokens it covers, if any.
    pub(crate) fn partial_key(&self) -> Option<(usize, usize)> {
        self.partial_key.map(|(p, t)| (p as usize, t as usize))
    }

    /// Record that the block at `position` is keyed for `tokens` tokens.
    pub(crate) fn set_partial_key(&mut self, position: usize, tokens: usize) {
        self.partial_key = Some((position as u32, tokens as u32));
    }

    pub(crate) fn clear_partial_key(&mut self) {
        self.partial_key = None;
    }

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
