//! ironbatch's core: vLLM 0.33's V1 continuous-batching scheduler
//! ([`scheduler`]: chunked prefill, one token budget, recompute preemption,
//! FCFS and priority, async scheduling) over the paged KV cache (the block
//! pool with its O(1) free queue, block hashing, the prefix-cache map and
//! the KV-cache manager), making vLLM's decisions exactly. The semantics are
//! written down in docs/scheduling.md; docs/architecture.md maps the parts.
//!
//! The core is plain Rust: no Python, no clock, no model. The PyO3 bindings
//! live in the `python` module, behind the `python` feature (so the docs
//! built without it do not link there), and `cargo test` runs without an
//! interpreter.

pub mod attention_group;
pub mod aux_output_retention;
pub mod block;
pub mod block_hash;
pub mod block_pool;
pub mod block_table;
pub mod ec_connector;
pub mod encoder_cache;
pub mod encoder_decoder_cache;
pub mod error;
pub mod free_queue;
pub mod grammar;
pub mod hash_chain;
pub mod kv_cache_manager;
pub mod kv_connector;
pub mod kv_events;
pub mod limits;
pub mod lora;
pub mod multimodal;
pub mod prefill_cadence;
pub mod prefix_cache_map;
pub mod prefix_cache_stats;
pub mod prefix_hit;
pub mod request;
pub mod request_queue;
pub mod scheduler;
pub mod scheduler_config;
pub mod sequence;
pub mod session;
pub mod simulate;
pub mod slab;
pub mod spec_decode;
pub mod step;
pub mod stop_check;

#[cfg(feature = "python")]
pub mod python;

pub use block::{cdiv, Block, BlockId, NULL_BLOCK};
pub use block_hash::{block_hash, BlockHash, BlockHasher, ChainKey, ExtraKey};
pub use block_pool::BlockPool;
pub use block_table::BlockTable;
pub use error::Error;
pub use kv_cache_manager::{KvCacheConfig, KvCacheManager};
pub use prefix_cache_stats::PrefixCacheStats;
pub use request::{NewRequest, Request, RequestStatus, StopRules};
pub use scheduler::{Pause, Scheduler, SchedulerStats};
pub use scheduler_config::{Policy, Runner, SchedulerConfig};
pub use sequence::Sequence;
pub use slab::{Slab, Slot};
pub use step::{
    Column, Finished, Kind, StepColumns, StepEntry, StepOutput, UpdateOutput, UpdateRecord,
};
