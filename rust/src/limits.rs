//! The largest sizes the core accepts, in one place. Every size a caller
//! hands the core enters through a check against these, so no arithmetic on
//! it can wrap: slots are `block_id * block_size + offset` in `i64`, and a
//! step's token counts, positions and lengths travel as `i32` columns. The
//! bindings export them as `ironbatch._core.LIMITS`; the twin's
//! `reference/limits.py` mirrors them (a test holds the two equal), and the
//! Python API checks against those, so both backends accept and reject the
//! same values.

use crate::error::Error;

/// Blocks in a pool, the null block included: 2^24 blocks (2^28 tokens at
/// block size 16) is beyond any accelerator's memory, and keeps a mistyped
/// size from asking the allocator for tens of gigabytes (which aborts
/// instead of raising).
pub const MAX_NUM_BLOCKS: usize = 1 << 24;

/// Tokens per block. With [`MAX_NUM_BLOCKS`] a slot stays below 2^44.
pub const MAX_BLOCK_SIZE: usize = 1 << 20;

/// KV-cache groups of one model (Gemma 3 has six).
pub const MAX_KV_CACHE_GROUPS: usize = 64;

/// Tokens in one sequence: positions, lengths and computed-token counts are
/// `i32` columns.
pub const MAX_MODEL_LEN: usize = i32::MAX as usize;

/// Tokens in one step: `query_start_loc` is an `i32` column.
pub const MAX_NUM_BATCHED_TOKENS: usize = i32::MAX as usize;

/// Requests running at once: request slots are `i32` columns.
pub const MAX_NUM_SEQS: usize = i32::MAX as usize;

/// A request's `max_tokens` (and so `min_tokens`): what Python's `int`
/// crosses as (`i64`). Sums of it with a prompt length stay below 2^64.
pub const MAX_TOKENS: usize = i64::MAX as usize;

/// Every limit by the name of the field it bounds, for the bindings.
pub const ALL: [(&str, usize); 7] = [
    ("num_blocks", MAX_NUM_BLOCKS),
    ("block_size", MAX_BLOCK_SIZE),
    ("max_model_len", MAX_MODEL_LEN),
    ("max_num_batched_tokens", MAX_NUM_BATCHED_TOKENS),
    ("max_num_seqs", MAX_NUM_SEQS),
    ("max_tokens", MAX_TOKENS),
    ("kv_cache_groups", MAX_KV_CACHE_GROUPS),
];

/// `value` must lie in `[min, max]`; the error names the field and the value
/// (the same text as the twin's `check_range`).
pub fn check_range(field: &str, value: usize, min: usize, max: usize) -> Result<(), Error> {
    if (min..=max).contains(&value) {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "{field} must be in [{min}, {max}], got {value}"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_largest_slot_fits_an_i64() {
        let slot = (MAX_NUM_BLOCKS - 1) as u128 * MAX_BLOCK_SIZE as u128 + MAX_BLOCK_SIZE as u128;
        assert!(slot < i64::MAX as u128);
    }

    #[test]
    fn check_range_names_the_field_and_the_value() {
        assert!(check_range("block_size", 16, 1, MAX_BLOCK_SIZE).is_ok());
        let e = check_range("block_size", 0, 1, MAX_BLOCK_SIZE).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("block_size must be in [1, {MAX_BLOCK_SIZE}], got 0")
        );
        assert!(check_range("block_size", MAX_BLOCK_SIZE + 1, 1, MAX_BLOCK_SIZE).is_err());
    }
}
