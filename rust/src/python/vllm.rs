//! What only the vLLM drop-in (`ironbatch.vllm.Scheduler`) calls: applying
//! a vLLM `ModelRunnerOutput` without building arrays in Python first, and
//! reading a live request's tokens back into vLLM's `Request`.

use super::kv_connector::StepReport;
use super::scheduler::{token, PyScheduler};
use super::step::PyStep;
use super::vllm_step_update::PyVllmStepUpdate;
use crate::slab::Slot;
use crate::step::UpdateOutput;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

/// Apply a vLLM `ModelRunnerOutput`'s tokens: entry `i` of `step` gets
/// `sampled_token_ids[req_id_to_index[req_ids[i]]]` (none when the list is
/// empty). A live scheduled request missing from `req_id_to_index` is
/// refused; everything is checked before anything changes. `accept` judges
/// structured-output requests' tokens, as in `Scheduler.update_from_output`.
/// A record that kept every token it was sampled carries the runner's own
/// list as its `new_token_ids`, as vLLM's scheduler passes it on.
#[pyfunction]
#[pyo3(signature = (scheduler, *, step, req_id_to_index, sampled_token_ids, accept=None))]
pub fn vllm_update_from_runner_output<'py>(
    py: Python<'py>,
    scheduler: &Bound<'py, PyScheduler>,
    step: &Bound<'py, PyStep>,
    req_id_to_index: &Bound<'py, PyDict>,
    sampled_token_ids: &Bound<'py, PyList>,
    accept: Option<&Bound<'py, PyAny>>,
) -> PyResult<PyVllmStepUpdate> {
    let runner = RunnerOutput {
        req_id_to_index,
        sampled_token_ids,
        accept,
    };
    let (out, sampled_rows) = apply_runner_output(scheduler, step, runner, &StepReport::none())?;
    PyVllmStepUpdate::of(py, out, step.get().req_ids_list(py), &sampled_rows, None)
}

/// The parts of a vLLM `ModelRunnerOutput` an update reads, with the
/// structured-output check.
pub(super) struct RunnerOutput<'a, 'py> {
    pub(super) req_id_to_index: &'a Bound<'py, PyDict>,
    pub(super) sampled_token_ids: &'a Bound<'py, PyList>,
    pub(super) accept: Option<&'a Bound<'py, PyAny>>,
}

/// [`vllm_update_from_runner_output`]'s work: the core's update, and each
/// row's token list from the runner where it gave one.
pub(super) fn apply_runner_output<'py>(
    scheduler: &Bound<'py, PyScheduler>,
    step: &Bound<'py, PyStep>,
    runner: RunnerOutput<'_, 'py>,
    kv: &StepReport<'_, 'py>,
) -> PyResult<(UpdateOutput, Vec<Option<Bound<'py, PyList>>>)> {
    let RunnerOutput {
        req_id_to_index,
        sampled_token_ids,
        accept,
    } = runner;
    let py = scheduler.py();
    let mut scheduler = scheduler.borrow_mut();
    let step = step.get();
    let ids = step.req_ids_list(py);
    let n = step.step.entries.len();
    let mut tokens: Vec<u32> = Vec::with_capacity(n);
    let mut offsets: Vec<usize> = Vec::with_capacity(n + 1);
    let mut sampled_rows: Vec<Option<Bound<'py, PyList>>> = Vec::with_capacity(n);
    offsets.push(0);
    let any_sampled = !sampled_token_ids.is_empty();
    for (i, entry) in step.step.entries.iter().enumerate() {
        let mut sampled_row = None;
        if any_sampled {
            let rid = ids.get_item(i)?;
            match req_id_to_index.get_item(&rid)? {
                Some(index) => {
                    let index: usize = index.extract()?;
                    let row = sampled_token_ids.get_item(index).map_err(|_| {
                        PyValueError::new_err(format!(
                            "req_id_to_index[{rid}] = {index} is outside sampled_token_ids \
                             ({} rows)",
                            sampled_token_ids.len()
                        ))
                    })?;
                    match row.cast_into::<PyList>() {
                        // A list (vLLM's type): read by index, no iterator.
                        Ok(list) => {
                            for k in 0..list.len() {
                                let t: i64 = list.get_item(k)?.extract()?;
                                tokens.push(token(tokens.len(), t)?);
                            }
                            sampled_row = Some(list);
                        }
                        Err(e) => {
                            for t in e.into_inner().try_iter()? {
                                let t: i64 = t?.extract()?;
                                tokens.push(token(tokens.len(), t)?);
                            }
                        }
                    }
                }
                None if scheduler.core.is_live(entry) => {
                    return Err(PyValueError::new_err(format!(
                        "req_id_to_index has no row for scheduled request {rid}"
                    )));
                }
                None => {}
            }
        }
        sampled_rows.push(sampled_row);
        offsets.push(tokens.len());
    }
    let out = scheduler.apply(py, &step.step, &tokens, &offsets, accept, kv)?;
    Ok((out, sampled_rows))
}

/// A live request's tokens (prompt first) and `num_computed_tokens`, to
/// bring vLLM's `Request` up to date.
#[pyfunction]
pub fn vllm_request_state(
    scheduler: &Bound<'_, PyScheduler>,
    slot: Slot,
) -> PyResult<(Vec<u32>, usize)> {
    let scheduler = scheduler.borrow();
    let r = scheduler
        .core
        .request(slot)
        .ok_or_else(|| PyValueError::new_err(format!("slot {slot} holds no live request")))?;
    Ok((r.seq.tokens().to_vec(), r.seq.num_computed_tokens))
}

/// A live request's tokens from `start` on, its `num_computed_tokens` and
/// its status (as vLLM spells it): what a KV connector reading vLLM's
/// `Request` needs brought up to date, without copying what it has.
#[pyfunction]
pub fn vllm_request_tail(
    scheduler: &Bound<'_, PyScheduler>,
    slot: Slot,
    start: usize,
) -> PyResult<(Vec<u32>, usize, &'static str)> {
    let scheduler = scheduler.borrow();
    let r = scheduler
        .core
        .request(slot)
        .ok_or_else(|| PyValueError::new_err(format!("slot {slot} holds no live request")))?;
    let tokens = r.seq.tokens();
    let tail = tokens.get(start..).unwrap_or_default().to_vec();
    Ok((tail, r.seq.num_computed_tokens, r.status.name()))
}

/// A live request's shared-prefix boundary, as its last prefix-cache
/// lookup set it (vLLM's `Request.shared_prefix_boundary`, which an
/// offloading connector reads for the boundaries a later request can
/// resume from).
#[pyfunction]
pub fn vllm_shared_prefix_boundary(
    scheduler: &Bound<'_, PyScheduler>,
    slot: Slot,
) -> PyResult<usize> {
    let scheduler = scheduler.borrow();
    let r = scheduler
        .core
        .request(slot)
        .ok_or_else(|| PyValueError::new_err(format!("slot {slot} holds no live request")))?;
    Ok(r.seq.shared_prefix_boundary)
}

/// A live request's block ids, one list per KV-cache group (vLLM's
/// `KVCacheManager.get_block_ids`).
#[pyfunction]
pub fn vllm_block_ids(scheduler: &Bound<'_, PyScheduler>, slot: Slot) -> PyResult<Vec<Vec<u32>>> {
    let scheduler = scheduler.borrow();
    let r = scheduler
        .core
        .request(slot)
        .ok_or_else(|| PyValueError::new_err(format!("slot {slot} holds no live request")))?;
    Ok(r.tables.iter().map(|t| t.block_ids().to_vec()).collect())
}

/// A live request's `num_computed_tokens` less its tokens still in flight
/// (placeholders or scheduled positions, whichever are more): the progress
/// its outputs have confirmed, which vLLM's V2 model runner frees encoder
/// inputs by.
#[pyfunction]
pub fn vllm_confirmed_tokens(scheduler: &Bound<'_, PyScheduler>, slot: Slot) -> PyResult<i64> {
    let scheduler = scheduler.borrow();
    let r = scheduler
        .core
        .request(slot)
        .ok_or_else(|| PyValueError::new_err(format!("slot {slot} holds no live request")))?;
    let in_flight = r.num_output_placeholders.max(r.in_flight_tokens);
    Ok(r.seq.num_computed_tokens as i64 - in_flight as i64)
}

/// The encoder cache as vLLM's `EncoderCacheManager` holds it, for the
/// drop-in's differential test: free and freeable embeddings, each entry's
/// referencing request ids (sorted), and the eviction order; for an
/// encoder-decoder model, as its `EncoderDecoderCacheManager` holds it.
#[pyfunction]
pub fn vllm_encoder_cache_state<'py>(
    py: Python<'py>,
    scheduler: &Bound<'py, PyScheduler>,
) -> PyResult<Bound<'py, PyDict>> {
    let scheduler = scheduler.borrow();
    let core = &scheduler.core;
    let d = PyDict::new(py);
    let Some(cache) = core.encoder_cache() else {
        // An encoder-decoder's `EncoderDecoderCacheManager`.
        let cache = core
            .encoder_decoder_cache()
            .expect("a scheduler tracks its encoder one way or the other");
        let (allocated, to_free) = cache.pending();
        d.set_item("num_free_slots", cache.num_free())?;
        d.set_item("allocated", allocated.to_vec())?;
        d.set_item("to_free", to_free.to_vec())?;
        return Ok(d);
    };
    let (free, freeable) = cache.num_free();
    d.set_item("num_free_slots", free)?;
    d.set_item("num_freeable_slots", freeable)?;
    let cached = PyDict::new(py);
    for (identifier, refs) in cache.entries() {
        let mut ids: Vec<&str> = refs
            .iter()
            .filter_map(|&s| core.request(s).map(|r| r.request_id.as_str()))
            .collect();
        ids.sort_unstable();
        cached.set_item(identifier, ids)?;
    }
    d.set_item("cached", cached)?;
    d.set_item("freeable", cache.eviction_order().collect::<Vec<_>>())?;
    Ok(d)
}
