//! One KV-cache block's bookkeeping (docs/scheduling.md §7.1).

use crate::block_hash::BlockHash;

/// Index of a block in the pool; also its position in the KV-cache tensors.
pub type BlockId = u32;

/// Block 0 is reserved: taken out of the free queue when the pool is built,
/// never handed to a request, never hashed, never freed.
pub const NULL_BLOCK: BlockId = 0;

/// A block's state. Whether it sits in the free queue is the queue's
/// business ([`crate::free_queue::FreeBlockQueue`]); a block is there exactly
/// when `ref_cnt == 0` (and it is not the null block).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Block {
    /// Number of request block tables holding this block.
    pub ref_cnt: u32,
    /// The tokens its key covers when the key is the hash at fewer tokens
    /// than the block holds (a partial key, docs/scheduling.md §7.16: a
    /// full-attention prompt tail, a recurrent prefill checkpoint; vLLM's
    /// `block_hash_num_tokens`); 0 when the key covers the whole block.
    pub partial_tokens: u32,
    /// Set while the block holds a full block that is in the prefix-cache
    /// map; kept after the block is freed (lazy eviction) until it is reused.
    pub hash: Option<BlockHash>,
}

/// Ceiling division: how many blocks of `b` tokens hold `a` tokens.
#[inline]
pub fn cdiv(a: usize, b: usize) -> usize {
    a.div_ceil(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partial_keys_tokens_fit_in_the_padding_before_the_hash() {
        // The pool is an array of these: a field that grows it shows here.
        assert_eq!(std::mem::size_of::<Block>(), 48);
    }
}
