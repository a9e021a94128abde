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
    /// a running request).
    pub(crate) grown: usize,
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

    /// Whether the table holds no block.
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }
}
