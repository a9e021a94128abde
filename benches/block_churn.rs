//! The prefix cache's per-block work in a prefill-heavy step, alone: a
//! pool of 131,073 blocks whose free blocks are all hash-cached (as after
//! warm-up in `benches/azure_replay.py`), and requests of 8,000 distinct
//! tokens (500 blocks) admitted one after another, each allocation taking
//! 500 blocks off the free queue (evicting a cached hash each) and caching
//! 500 new ones. Timed: `KvCacheManager::allocate_slots`, per block, warm
//! and after reading a buffer larger than the last-level cache (the state
//! a step finds after another scheduler's, or the model's host work).
//!
//!     cargo bench --bench block_churn [-- EVICT_MIB]

use ironbatch::attention_group::GroupSpec;
use ironbatch::{BlockTable, KvCacheConfig, KvCacheManager, Sequence};
use std::time::Instant;

const NUM_BLOCKS: usize = 131_073;
const BLOCK_SIZE: usize = 16;
const TOKENS: usize = 8_000;
const HELD: usize = 100; // requests holding blocks at once

fn main() {
    let evict_mib: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(64);
    let mut kv = KvCacheManager::new(&KvCacheConfig {
        num_blocks: NUM_BLOCKS,
        block_size: BLOCK_SIZE,
        max_model_len: TOKENS + BLOCK_SIZE,
        enable_prefix_caching: true,
        num_lookahead_tokens: 0,
        num_hash_lookahead_tokens: 0,
        drop_eagle_block: false,
        eagle_groups: None,
        groups: vec![GroupSpec::FULL],
        sparse_retention: true,
        retention_interval: 0,
        mixed_precision: false,
    })
    .expect("a valid cache");
    let mut buffer = vec![1u64; evict_mib * 1024 * 1024 / 8];
    let mut held: Vec<BlockTable> = Vec::new();
    let (mut warm, mut cold) = (Vec::new(), Vec::new());
    for round in 0..2_000u32 {
        // Distinct tokens per request: no prefix hits, every block new.
        let prompt: Vec<u32> = (0..TOKENS as u32)
            .map(|k| round.wrapping_mul(2_654_435_761) ^ k)
            .collect();
        let seq = Sequence::new(prompt, &[], kv.hasher(), BLOCK_SIZE);
        let evict = round % 2 == 1;
        if evict {
            let mut sum = 0u64;
            for v in buffer.iter_mut() {
                sum = sum.wrapping_add(*v);
                *v = sum;
            }
            std::hint::black_box(sum);
        }
        let mut table = BlockTable::default();
        let start = Instant::now();
        let grown = kv.allocate_slots(&mut table, &seq, TOKENS, 0, &[], false);
        let per_block = start.elapsed().as_nanos() as f64 / (TOKENS / BLOCK_SIZE) as f64;
        assert_eq!(grown.expect("valid arguments"), Some(TOKENS / BLOCK_SIZE));
        // Past warm-up every block taken was cached by an earlier request.
        if round >= 600 {
            if evict { &mut cold } else { &mut warm }.push(per_block);
        }
        held.push(table);
        if held.len() > HELD {
            let mut oldest = held.remove(0);
            kv.free(std::slice::from_mut(&mut oldest));
        }
    }
    for (name, times) in [("warm", &mut warm), ("cold", &mut cold)] {
        times.sort_by(|a, b| a.total_cmp(b));
        println!(
            "{name}: {:.1} ns per block (median), {:.1} (p90), over {} allocations of {} blocks",
            times[times.len() / 2],
            times[times.len() * 9 / 10],
            times.len(),
            TOKENS / BLOCK_SIZE
        );
    }
}
