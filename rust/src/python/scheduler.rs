//! `Scheduler`: the Rust scheduler for `ironbatch.Scheduler(backend="rust")`.
//!
//! A step crosses into Python once, as NumPy arrays; request ids cross as the
//! Python strings the caller passed in (kept per slot), so a step creates no
//! Python object per request.

use super::args::{count, u32_list, value_error};
use super::prefix_cache_stats::PyPrefixCacheStats;
use crate::kv_cache_manager::KvCacheConfig;
use crate::request::{NewRequest, RequestStatus, StopRules};
use crate::request_queue::Slot;
use crate::scheduler::{Pause, Scheduler};
use crate::scheduler_config::{Policy, SchedulerConfig};
use crate::step::StepOutput;
use numpy::{PyArray1, PyReadonlyArray1};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString};

/// vLLM 0.33's V1 scheduler in Rust (use it through `ironbatch.Scheduler`).
#[pyclass(name = "Scheduler", module = "ironbatch._core")]
pub struct PyScheduler {
    core: Scheduler,
    /// The caller's request-id strings, by slot.
    py_ids: Vec<Option<Py<PyString>>>,
}

/// One step's decisions: columns plus what `update_from_output` needs.
#[pyclass(name = "Step", module = "ironbatch._core", frozen)]
pub struct PyStep {
    step: StepOutput,
    #[pyo3(get)]
    req_ids: Py<PyList>,
    columns: Py<PyDict>,
    #[pyo3(get)]
    preempted_req_ids: Vec<String>,
    #[pyo3(get)]
    finished_req_ids: Vec<String>,
}

#[pymethods]
impl PyStep {
    /// The step's NumPy columns by name (see `ironbatch.SchedulerOutput`).
    fn columns<'py>(&self, py: Python<'py>) -> Bound<'py, PyDict> {
        self.columns.bind(py).clone()
    }

    fn __len__(&self) -> usize {
        self.step.entries.len()
    }
}

/// What an update returns: (each record's row in the step, tokens, token
/// offsets, cached tokens per record, finished (record, reason, stop reason)).
type UpdateColumns<'py> = (
    Bound<'py, PyAny>,
    Bound<'py, PyAny>,
    Bound<'py, PyAny>,
    Bound<'py, PyAny>,
    Vec<(usize, &'static str, Option<u32>)>,
);

/// A finished request's tokens (prompt first) and `num_computed_tokens`.
type FinalState = (Vec<u32>, usize);

fn arr<'py, T: numpy::Element>(py: Python<'py>, v: Vec<T>) -> Bound<'py, PyAny> {
    PyArray1::from_vec(py, v).into_any()
}

fn status_code(code: &str) -> PyResult<RequestStatus> {
    match code {
        "FINISHED_ABORTED" => Ok(RequestStatus::FinishedAborted),
        "FINISHED_STOPPED" => Ok(RequestStatus::FinishedStopped),
        "FINISHED_LENGTH_CAPPED" => Ok(RequestStatus::FinishedLengthCapped),
        "FINISHED_IGNORED" => Ok(RequestStatus::FinishedIgnored),
        "FINISHED_ERROR" => Ok(RequestStatus::FinishedError),
        other => Err(PyValueError::new_err(format!(
            "status must be a FINISHED_* status name, got {other:?}"
        ))),
    }
}

fn token(i: usize, t: i64) -> PyResult<u32> {
    u32::try_from(t).map_err(|_| {
        PyValueError::new_err(format!("sampled[{i}] = {t} is neither -1 nor a token id"))
    })
}

impl PyScheduler {
    fn forget(&mut self, slot: Slot) {
        self.py_ids[slot as usize] = None;
    }

    /// Apply checked tokens to the core and return the update's columns.
    fn apply<'py>(
        &mut self,
        py: Python<'py>,
        step: &StepOutput,
        tokens: &[u32],
        offsets: &[usize],
    ) -> PyResult<(UpdateColumns<'py>, Vec<FinalState>)> {
        let out = self
            .core
            .update_from_output(step, tokens, offsets)
            .map_err(value_error)?;
        let rows: Vec<i32> = out.records.iter().map(|rec| rec.entry as i32).collect();

        let cached: Vec<i64> = out
            .records
            .iter()
            .map(|rec| rec.cached_tokens as i64)
            .collect();
        let mut token_offsets = Vec::with_capacity(out.records.len() + 1);
        token_offsets.push(0i64);
        token_offsets.extend(out.records.iter().map(|rec| rec.tokens_end as i64));
        let mut finished = Vec::with_capacity(out.finished.len());
        let mut finished_tokens = Vec::with_capacity(out.finished.len());
        for f in out.finished {
            let reason = f.status.finish_reason().unwrap_or("error");
            finished.push((f.record, reason, f.stop_reason));
            finished_tokens.push((f.token_ids, f.num_computed_tokens));
            self.forget(out.records[f.record].slot);
        }
        let columns = (
            arr(py, rows),
            arr(py, out.tokens),
            arr(py, token_offsets),
            arr(py, cached),
            finished,
        );
        Ok((columns, finished_tokens))
    }
}

#[pymethods]
impl PyScheduler {
    #[new]
    #[pyo3(signature = (*, max_num_seqs, max_num_batched_tokens, max_model_len,
                        enable_chunked_prefill, long_prefill_token_threshold, policy,
                        scheduler_reserve_full_isl, num_blocks, block_size,
                        enable_prefix_caching, async_scheduling = false))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        max_num_seqs: &Bound<'_, PyAny>,
        max_num_batched_tokens: &Bound<'_, PyAny>,
        max_model_len: &Bound<'_, PyAny>,
        enable_chunked_prefill: bool,
        long_prefill_token_threshold: &Bound<'_, PyAny>,
        policy: &str,
        scheduler_reserve_full_isl: bool,
        num_blocks: &Bound<'_, PyAny>,
        block_size: &Bound<'_, PyAny>,
        enable_prefix_caching: bool,
        async_scheduling: bool,
    ) -> PyResult<Self> {
        let policy = match policy {
            "fcfs" => Policy::Fcfs,
            "priority" => Policy::Priority,
            other => {
                return Err(PyValueError::new_err(format!(
                    "policy must be 'fcfs' or 'priority', got {other:?}"
                )))
            }
        };
        let max_model_len = count("max_model_len", max_model_len)?;
        let config = SchedulerConfig {
            max_num_seqs: count("max_num_seqs", max_num_seqs)?,
            max_num_batched_tokens: count("max_num_batched_tokens", max_num_batched_tokens)?,
            max_model_len,
            enable_chunked_prefill,
            long_prefill_token_threshold: count(
                "long_prefill_token_threshold",
                long_prefill_token_threshold,
            )?,
            policy,
            scheduler_reserve_full_isl,
            async_scheduling,
            cache: KvCacheConfig {
                num_blocks: count("num_blocks", num_blocks)?,
                block_size: count("block_size", block_size)?,
                max_model_len,
                enable_prefix_caching,
            },
        };
        Ok(PyScheduler {
            core: Scheduler::new(config).map_err(value_error)?,
            py_ids: Vec::new(),
        })
    }

    /// Queue a request; returns its slot (its stable row while it lives).
    #[pyo3(signature = (request_id, prompt_token_ids, max_tokens, min_tokens, eos_token_id,
                        stop_token_ids, priority, arrival_time, cache_salt = None))]
    #[allow(clippy::too_many_arguments)]
    fn add_request(
        &mut self,
        request_id: &Bound<'_, PyString>,
        prompt_token_ids: &Bound<'_, PyAny>,
        max_tokens: &Bound<'_, PyAny>,
        min_tokens: &Bound<'_, PyAny>,
        eos_token_id: Option<u32>,
        stop_token_ids: &Bound<'_, PyAny>,
        priority: i64,
        arrival_time: f64,
        cache_salt: Option<String>,
    ) -> PyResult<Slot> {
        let new = NewRequest {
            request_id: request_id.to_str()?.to_owned(),
            prompt_token_ids: u32_list("prompt_token_ids", prompt_token_ids)?,
            stop: StopRules {
                max_tokens: count("max_tokens", max_tokens)?,
                min_tokens: count("min_tokens", min_tokens)?,
                eos_token_id,
                stop_token_ids: u32_list("stop_token_ids", stop_token_ids)?,
            },
            priority,
            arrival_time,
            cache_salt,
        };
        let slot = self.core.add_request(new).map_err(value_error)?;
        if self.py_ids.len() <= slot as usize {
            self.py_ids.resize_with(slot as usize + 1, || None);
        }
        self.py_ids[slot as usize] = Some(request_id.clone().unbind());
        Ok(slot)
    }

    /// One scheduling decision.
    fn schedule(&mut self, py: Python<'_>) -> PyResult<PyStep> {
        let mut step = self.core.schedule().map_err(value_error)?;
        let py_ids = &self.py_ids;
        let ids = PyList::new(
            py,
            step.entries.iter().map(|e| {
                py_ids[e.slot as usize]
                    .as_ref()
                    .expect("a scheduled request is live")
                    .bind(py)
                    .clone()
            }),
        )?;
        let columns = PyDict::new(py);
        columns.set_item("req_slots", arr(py, std::mem::take(&mut step.req_slots)))?;
        columns.set_item(
            "num_scheduled",
            arr(py, std::mem::take(&mut step.num_scheduled)),
        )?;
        columns.set_item(
            "num_computed_tokens",
            arr(py, std::mem::take(&mut step.num_computed_tokens)),
        )?;
        columns.set_item("kinds", arr(py, std::mem::take(&mut step.kinds)))?;
        columns.set_item("samples", arr(py, std::mem::take(&mut step.samples)))?;
        columns.set_item(
            "num_output_tokens",
            arr(py, std::mem::take(&mut step.num_output_tokens)),
        )?;
        columns.set_item(
            "new_block_ids",
            arr(py, std::mem::take(&mut step.new_block_ids)),
        )?;
        columns.set_item(
            "new_block_offsets",
            arr(py, std::mem::take(&mut step.new_block_offsets)),
        )?;
        columns.set_item("positions", arr(py, std::mem::take(&mut step.positions)))?;
        columns.set_item(
            "slot_mapping",
            arr(py, std::mem::take(&mut step.slot_mapping)),
        )?;
        columns.set_item(
            "query_start_loc",
            arr(py, std::mem::take(&mut step.query_start_loc)),
        )?;
        columns.set_item("seq_lens", arr(py, std::mem::take(&mut step.seq_lens)))?;
        Ok(PyStep {
            preempted_req_ids: std::mem::take(&mut step.preempted_req_ids),
            finished_req_ids: std::mem::take(&mut step.finished_req_ids),
            step,
            req_ids: ids.unbind(),
            columns: columns.unbind(),
        })
    }

    /// Apply a step's tokens. With `offsets`, entry `i` gets
    /// `token_ids[offsets[i]:offsets[i+1]]`; without, `token_ids` holds one
    /// token per entry in scheduling order, -1 for none. Returns (rows,
    /// tokens, token offsets, cached tokens, finished) for the requests that
    /// got tokens, in scheduling order: `rows` index the step's entries (so
    /// the ids need not cross again); `cached tokens` are those held in
    /// hash-cached blocks after the output; `finished` lists (record, finish
    /// reason, stop reason) for those that ended.
    #[pyo3(signature = (step, token_ids, offsets = None))]
    fn update_from_output<'py>(
        &mut self,
        py: Python<'py>,
        step: &Bound<'py, PyStep>,
        token_ids: PyReadonlyArray1<'py, i64>,
        offsets: Option<PyReadonlyArray1<'py, i64>>,
    ) -> PyResult<UpdateColumns<'py>> {
        let step = step.get();
        let raw = token_ids.as_array();
        let (tokens, offsets) = match offsets {
            Some(offsets) => {
                let tokens = raw
                    .iter()
                    .enumerate()
                    .map(|(i, &t)| token(i, t))
                    .collect::<PyResult<Vec<u32>>>()?;
                let offsets = offsets
                    .as_array()
                    .iter()
                    .map(|&o| {
                        usize::try_from(o)
                            .map_err(|_| PyValueError::new_err(format!("offsets: {o} < 0")))
                    })
                    .collect::<PyResult<Vec<usize>>>()?;
                (tokens, offsets)
            }
            None => {
                let n = step.step.entries.len();
                if raw.len() != n {
                    return Err(PyValueError::new_err(format!(
                        "sampled has {} entries; the step scheduled {n} requests",
                        raw.len()
                    )));
                }
                let mut tokens = Vec::with_capacity(n);
                let mut offsets = Vec::with_capacity(n + 1);
                offsets.push(0);
                for (i, &t) in raw.iter().enumerate() {
                    if t != -1 {
                        tokens.push(token(i, t)?);
                    }
                    offsets.push(tokens.len());
                }
                (tokens, offsets)
            }
        };
        Ok(self.apply(py, &step.step, &tokens, &offsets)?.0)
    }

    /// Apply a vLLM `ModelRunnerOutput`'s tokens: entry `i` gets
    /// `sampled_token_ids[req_id_to_index[req_ids[i]]]` (none when the
    /// list is empty). A live scheduled request missing from
    /// `req_id_to_index` is refused. Returns what `update_from_output` does,
    /// and each finished request's (tokens, num_computed_tokens), aligned
    /// with `finished`.
    fn update_from_runner_output<'py>(
        &mut self,
        py: Python<'py>,
        step: &Bound<'py, PyStep>,
        req_id_to_index: &Bound<'py, PyDict>,
        sampled_token_ids: &Bound<'py, PyList>,
    ) -> PyResult<(UpdateColumns<'py>, Vec<FinalState>)> {
        let step = step.get();
        let ids = step.req_ids.bind(py);
        let n = step.step.entries.len();
        let mut tokens: Vec<u32> = Vec::with_capacity(n);
        let mut offsets: Vec<usize> = Vec::with_capacity(n + 1);
        offsets.push(0);
        let any_sampled = !sampled_token_ids.is_empty();
        for (i, entry) in step.step.entries.iter().enumerate() {
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
                        for t in row.try_iter()? {
                            let t: i64 = t?.extract()?;
                            tokens.push(token(tokens.len(), t)?);
                        }
                    }
                    None if self.core.is_live(entry) => {
                        return Err(PyValueError::new_err(format!(
                            "req_id_to_index has no row for scheduled request {rid}"
                        )));
                    }
                    None => {}
                }
            }
            offsets.push(tokens.len());
        }
        self.apply(py, &step.step, &tokens, &offsets)
    }

    /// Abort requests, freeing them in the order given (unknown ids ignored).
    #[pyo3(signature = (request_ids, status = "FINISHED_ABORTED"))]
    fn finish_requests(&mut self, request_ids: &Bound<'_, PyAny>, status: &str) -> PyResult<()> {
        if request_ids.is_instance_of::<PyString>() {
            return Err(PyTypeError::new_err(
                "request_ids must be a list of str, got str",
            ));
        }
        let ids: Vec<String> = request_ids.extract()?;
        let status = status_code(status)?;
        for slot in self.core.finish_requests(&ids, status) {
            self.forget(slot);
        }
        Ok(())
    }

    /// Forget every cached block hash; see `ironbatch.Scheduler`.
    #[pyo3(signature = (reset_running_requests = false))]
    fn reset_prefix_cache(&mut self, reset_running_requests: bool) -> PyResult<bool> {
        self.core
            .reset_prefix_cache(reset_running_requests)
            .map_err(|e| pyo3::exceptions::PyRuntimeError::new_err(e.to_string()))
    }

    /// (num_running_reqs, num_waiting_reqs, num_skipped_waiting_reqs,
    /// kv_cache_usage, PrefixCacheStats, num_preempted_reqs); takes the
    /// counters.
    fn make_stats(&mut self) -> (usize, usize, usize, f64, PyPrefixCacheStats, u64) {
        let s = self.core.make_stats();
        (
            s.num_running_reqs,
            s.num_waiting_reqs,
            s.num_skipped_waiting_reqs,
            s.kv_cache_usage,
            s.prefix_cache_stats.into(),
            s.num_preempted_reqs,
        )
    }

    #[getter]
    fn num_free_blocks(&self) -> usize {
        self.core.kv().num_free_blocks()
    }

    /// vLLM's pause state: 0 unpaused, 1 no admissions, 2 nothing scheduled.
    #[getter]
    fn get_pause_state(&self) -> u8 {
        self.core.pause() as u8
    }

    #[setter]
    fn set_pause_state(&mut self, state: u8) -> PyResult<()> {
        let pause = match state {
            0 => Pause::Unpaused,
            1 => Pause::New,
            2 => Pause::All,
            other => {
                return Err(PyValueError::new_err(format!(
                    "pause_state must be 0, 1 or 2, got {other}"
                )))
            }
        };
        self.core.set_pause(pause);
        Ok(())
    }

    /// A live request's (tokens, num_computed_tokens), prompt first.
    fn request_state(&self, slot: Slot) -> PyResult<(Vec<u32>, usize)> {
        let r = self
            .core
            .request(slot)
            .ok_or_else(|| PyValueError::new_err(format!("slot {slot} holds no live request")))?;
        Ok((r.seq.tokens().to_vec(), r.seq.num_computed_tokens))
    }

    /// (running, waiting) request counts.
    fn get_request_counts(&self) -> (usize, usize) {
        self.core.request_counts()
    }

    /// The fraction of usable KV-cache blocks in use.
    #[getter]
    fn kv_cache_usage(&self) -> f64 {
        self.core.kv().usage()
    }

    fn get_num_unfinished_requests(&self) -> usize {
        self.core.num_unfinished_requests()
    }

    /// Everything the two backends must agree on, for differential tests.
    fn debug_state<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let c = &self.core;
        let name = |slot: Slot| c.request(slot).map(|r| r.request_id.clone());
        let d = PyDict::new(py);
        d.set_item(
            "running",
            c.running().iter().map(|&s| name(s)).collect::<Vec<_>>(),
        )?;
        d.set_item("waiting", c.waiting().map(name).collect::<Vec<_>>())?;
        let requests = PyDict::new(py);
        for slot in c.running().iter().copied().chain(c.waiting()) {
            let r = c.request(slot).expect("a queued request is live");
            requests.set_item(
                &r.request_id,
                (
                    r.status.name(),
                    slot,
                    r.num_tokens(),
                    r.seq.num_computed_tokens,
                    r.table.block_ids().to_vec(),
                    r.table.num_cached_blocks(),
                    r.num_preemptions,
                    (
                        r.num_output_placeholders,
                        r.in_flight_tokens,
                        r.stale_tokens,
                        r.drop_stale,
                        r.deferred,
                    ),
                ),
            )?;
        }
        d.set_item("requests", requests)?;
        let pool = c.kv().pool();
        d.set_item("free_block_ids", pool.free_block_ids().collect::<Vec<_>>())?;
        d.set_item(
            "block_ref_cnts",
            (0..pool.num_blocks() as u32)
                .map(|b| pool.block(b).map_or(0, |b| b.ref_cnt))
                .collect::<Vec<_>>(),
        )?;
        let mut cached: Vec<Vec<u32>> = pool.cached_blocks().map(|(_, ids)| ids.to_vec()).collect();
        cached.sort();
        d.set_item("cached_blocks", cached)?;
        Ok(d)
    }
}
