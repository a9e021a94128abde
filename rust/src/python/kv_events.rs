//! `KvEvent`: one KV-cache event as it crosses to Python (docs/scheduling.md
//! §7.12); the vLLM drop-in turns it into vLLM's event.

use crate::block::BlockId;
use crate::kv_events::KvEvent;
use crate::slab::Slot;
use pyo3::prelude::*;

/// One KV-cache event, oldest first as the scheduler logged them.
#[pyclass(name = "KvEvent", module = "ironbatch._core", frozen, get_all)]
pub struct PyKvEvent {
    /// "stored", "stored_key", "hit", "removed", "cleared", "allocated",
    /// "accessed", "evicted", "lookup", "released" or "loading".
    kind: &'static str,
    /// The request's slot ("stored", "stored_key", "hit", "lookup",
    /// "released", "loading"); None for the others.
    slot: Option<Slot>,
    /// The KV-cache group whose blocks were stored ("stored",
    /// "stored_key"); 0 for the others.
    group: usize,
    /// The first block stored ("stored"); 0 for the others.
    first_block: usize,
    /// The blocks stored (the null block 0 where a window group stored
    /// none), or the one removed, allocated or accessed.
    block_ids: Vec<BlockId>,
    /// Blocks stored ("stored"), hash blocks found cached ("hit") or the
    /// hash blocks the key covers ("stored_key"); 0 for the others.
    num_blocks: usize,
    /// The tokens the request had computed ("released"), or will have once
    /// loaded ("loading"); 0 for the others.
    num_computed_tokens: usize,
}

#[pymethods]
impl PyKvEvent {
    fn __repr__(&self) -> String {
        format!(
            "KvEvent(kind={:?}, slot={:?}, group={}, first_block={}, block_ids={:?}, \
             num_blocks={}, num_computed_tokens={})",
            self.kind,
            self.slot,
            self.group,
            self.first_block,
            self.block_ids,
            self.num_blocks,
            self.num_computed_tokens
        )
    }
}

impl From<KvEvent> for PyKvEvent {
    fn from(event: KvEvent) -> Self {
        let none = |kind| PyKvEvent {
            kind,
            slot: None,
            group: 0,
            first_block: 0,
            block_ids: Vec::new(),
            num_blocks: 0,
            num_computed_tokens: 0,
        };
        match event {
            KvEvent::Stored {
                owner,
                group,
                first_block,
                block_ids,
            } => PyKvEvent {
                kind: "stored",
                slot: Some(owner),
                group,
                first_block,
                num_blocks: block_ids.len(),
                block_ids,
                num_computed_tokens: 0,
            },
            KvEvent::StoredKey {
                owner,
                group,
                num_hash_blocks,
                block_id,
            } => PyKvEvent {
                kind: "stored_key",
                slot: Some(owner),
                group,
                first_block: 0,
                block_ids: vec![block_id],
                num_blocks: num_hash_blocks,
                num_computed_tokens: 0,
            },
            KvEvent::Hit { owner, num_blocks } => PyKvEvent {
                slot: Some(owner),
                num_blocks,
                ..none("hit")
            },
            KvEvent::Removed { block_id } => PyKvEvent {
                block_ids: vec![block_id],
                ..none("removed")
            },
            KvEvent::Cleared => none("cleared"),
            KvEvent::Allocated { block_id } => PyKvEvent {
                block_ids: vec![block_id],
                ..none("allocated")
            },
            KvEvent::Accessed { block_id } => PyKvEvent {
                block_ids: vec![block_id],
                ..none("accessed")
            },
            KvEvent::Evicted { block_id } => PyKvEvent {
                block_ids: vec![block_id],
                ..none("evicted")
            },
            KvEvent::Lookup { owner } => PyKvEvent {
                slot: Some(owner),
                ..none("lookup")
            },
            KvEvent::Released {
                owner,
                num_computed_tokens,
            } => PyKvEvent {
                slot: Some(owner),
                num_computed_tokens,
                ..none("released")
            },
            KvEvent::Loading {
                owner,
                num_computed_tokens,
            } => PyKvEvent {
                slot: Some(owner),
                num_computed_tokens,
                ..none("loading")
            },
        }
    }
}
