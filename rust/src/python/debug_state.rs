//! `Scheduler.debug_state()`: everything the core and the twin must agree
//! on, for the differential tests, as plain Python values.

use crate::scheduler::Scheduler;
use crate::slab::Slot;
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// The queues, each live request's state by name, and the pool.
pub(super) fn debug_state<'py>(py: Python<'py>, c: &Scheduler) -> PyResult<Bound<'py, PyDict>> {
    let name = |slot: Slot| c.request(slot).map(|r| r.request_id.clone());
    let d = PyDict::new(py);
    d.set_item(
        "running",
        c.running().iter().map(|&s| name(s)).collect::<Vec<_>>(),
    )?;
    d.set_item("waiting", c.waiting().map(name).collect::<Vec<_>>())?;
    d.set_item("kv_holding", c.kv_holding().map(name).collect::<Vec<_>>())?;
    d.set_item("num_waiting_for_input", c.num_waiting_for_input())?;
    let requests = PyDict::new(py);
    let queued = c.running().iter().copied().chain(c.kv_holding());
    for slot in queued.chain(c.waiting()) {
        let r = c.request(slot).expect("a queued request is live");
        let row = PyDict::new(py);
        row.set_item("status", r.status.name())?;
        row.set_item("slot", slot)?;
        row.set_item("num_tokens", r.num_tokens())?;
        row.set_item("num_computed_tokens", r.seq.num_computed_tokens)?;
        // Group 0's table (none without a KV cache).
        let first = r.tables.first().map_or(&[][..], |t| t.block_ids());
        row.set_item("block_ids", first.to_vec())?;
        row.set_item("num_cached_blocks", r.num_cached_blocks())?;
        let tables: Vec<Vec<u32>> = r.tables.iter().map(|t| t.block_ids().to_vec()).collect();
        row.set_item("tables", tables)?;
        let cached: Vec<usize> = r.tables.iter().map(|t| t.num_cached_blocks()).collect();
        row.set_item("num_cached_per_group", cached)?;
        row.set_item("shared_prefix_boundary", r.seq.shared_prefix_boundary)?;
        row.set_item("num_preemptions", r.num_preemptions)?;
        row.set_item("num_output_placeholders", r.num_output_placeholders)?;
        row.set_item("in_flight_tokens", r.in_flight_tokens)?;
        row.set_item("stale_tokens", r.stale_tokens)?;
        row.set_item("drop_stale", r.drop_stale)?;
        row.set_item("deferred", r.deferred)?;
        row.set_item("grammar", r.grammar.map(|g| g.name()))?;
        row.set_item("prefill_chunk", r.prefill_chunk)?;
        row.set_item("next_decode_step", r.next_decode_step)?;
        row.set_item("kv_loaded", r.kv_loaded)?;
        row.set_item("inflight_prefill", r.inflight_prefill)?;
        let mut drafts = Vec::new();
        r.drafts.write_to(&mut drafts);
        row.set_item("drafts", drafts)?;
        requests.set_item(&r.request_id, row)?;
    }
    d.set_item("requests", requests)?;
    // Finished requests holding blocks for a KV connector: their tables.
    let held = PyDict::new(py);
    for slot in c.kv_held() {
        let r = c.request(slot).expect("a held request is live");
        let tables: Vec<Vec<u32>> = r.tables.iter().map(|t| t.block_ids().to_vec()).collect();
        held.set_item(&r.request_id, tables)?;
    }
    d.set_item("kv_held", held)?;
    // Blocks of freed requests fenced by a step in flight: (fence, blocks).
    let deferred: Vec<(u64, Vec<u32>)> = c
        .deferred_frees()
        .map(|f| (f.fence, f.blocks.clone()))
        .collect();
    d.set_item("deferred_frees", deferred)?;
    // Blocks pinned from outside any request: (block, pins).
    d.set_item("pinned_blocks", c.pinned_blocks())?;
    let pool = c.kv().pool();
    d.set_item("free_block_ids", pool.free_block_ids().collect::<Vec<_>>())?;
    d.set_item(
        "block_ref_cnts",
        (0..pool.num_blocks() as u32)
            .map(|b| pool.block(b).map_or(0, |b| b.ref_cnt))
            .collect::<Vec<_>>(),
    )?;
    let mut cached: Vec<Vec<u32>> = pool.cached_blocks().map(|(_, ids)| ids).collect();
    cached.sort();
    d.set_item("cached_blocks", cached)?;
    // Routed experts followed: the retained blocks' hashes, least recently
    // used first, and per loading request's slot the blocks its load reads.
    if let Some(aux) = c.aux_retention() {
        d.set_item(
            "aux_retained",
            aux.retained().map(|h| h.0).collect::<Vec<u128>>(),
        )?;
        let loading = PyDict::new(py);
        for (slot, keys) in aux.loading() {
            loading.set_item(slot, keys.iter().map(|h| h.0).collect::<Vec<u128>>())?;
        }
        d.set_item("aux_loading", loading)?;
    }
    Ok(d)
}
