//! ironbatch's core: the paged KV-cache block pool, block hashing, the
//! prefix cache and the KV-cache manager, making vLLM 0.33's V1 decisions
//! (see `shared/spec/scheduling.md` §7).
//!
//! The core is plain Rust: no Python, no clock, no model. The PyO3 bindings
//! live in [`python`] behind the `python` feature, so `cargo test` runs
//! without an interpreter.

pub mod block;
pub mod block_hash;
pub mod block_pool;
pub mod block_table;
pub mod error;
pub mod free_queue;
pub mod hash_chain;
pub mod kv_cache_manager;
pub mod limits;
pub mod prefix_cache_map;
pub mod prefix_cache_stats;
pub mod request;
pub mod request_queue;
pub mod scheduler;
pub mod scheduler_config;
pub mod sequence;
pub mod step;
pub mod stop_check;

#[cfg(feature = "python")]
pub mod python;

pub use block::{Block, BlockId, NULL_BLOCK};
pub use block_hash::{block_hash, BlockHash, BlockHasher, ChainKey, ExtraKey};
pub use block_pool::BlockPool;
pub use block_table::BlockTable;
pub use error::KvError;
pub use kv_cache_manager::{KvCacheConfig, KvCacheManager};
pub use prefix_cache_stats::PrefixCacheStats;
pub use request::{NewRequest, Request, RequestStatus, StopRules};
pub use scheduler::{Pause, Scheduler, SchedulerStats};
pub use scheduler_config::{Policy, SchedulerConfig};
pub use sequence::Sequence;
pub use step::{Finished, Kind, StepEntry, StepOutput, UpdateOutput, UpdateRecord};

/// Ceiling division.
#[inline]
pub fn cdiv(a: usize, b: usize) -> usize {
    a.div_ceil(b)
}
