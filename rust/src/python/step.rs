//! The named types a step hands to Python: `Step` (the schedule's
//! decisions, as NumPy columns built when first read, plus what the update
//! needs), `StepUpdate`
//! and `FinishedRequest` (what an update reported) and `SchedulerStats`.
//! Each is built here from the core's own type, in one place.

use super::prefix_cache_stats::PyPrefixCacheStats;
use crate::request::StopReason;
use crate::scheduler::{Scheduler, SchedulerStats};
use crate::slab::Slot;
use crate::spec_decode::SpecDecodingStats;
use crate::step::{Column, Finished, StepOutput, UpdateOutput, UpdateRecord};
use numpy::PyArray1;
use pyo3::exceptions::PyKeyError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyList, PyString};

/// One step's decisions: named columns plus what `update_from_output` needs.
#[pyclass(name = "Step", module = "ironbatch._core", frozen)]
pub struct PyStep {
    pub(super) step: StepOutput,
    /// The scheduled requests' ids, in scheduling order.
    #[pyo3(get)]
    req_ids: Py<PyList>,
    /// Built on first read: the vLLM drop-in reads none of them on most
    /// steps, and a NumPy array costs far more to make than to fill.
    columns: PyOnceLock<Py<PyDict>>,
    #[pyo3(get)]
    pub(super) preempted_req_ids: Vec<String>,
    #[pyo3(get)]
    pub(super) finished_req_ids: Vec<String>,
    grammar_released: Vec<String>,
    grammar_failed: Vec<String>,
    /// The encoder inputs the runner computes this step, by request id in
    /// scheduling order (vLLM's `scheduled_encoder_inputs`).
    #[pyo3(get)]
    pub(super) scheduled_encoder_inputs: Vec<(String, Vec<u32>)>,
    /// Encoder-cache entries evicted since the previous step (vLLM's
    /// `free_encoder_mm_hashes`).
    #[pyo3(get)]
    pub(super) free_encoder_mm_hashes: Vec<String>,
    /// Requests whose encoder input reuses a cached identifier with another
    /// number of embeddings: nothing was scheduled for them; end them with
    /// an error.
    #[pyo3(get)]
    encoder_mismatch: Vec<String>,
}

impl PyStep {
    pub(super) fn req_ids_list<'py>(&self, py: Python<'py>) -> &Bound<'py, PyList> {
        self.req_ids.bind(py)
    }

    /// The waiting pass released or failed a structured-output request.
    pub(super) fn has_grammar_news(&self) -> bool {
        !self.grammar_released.is_empty() || !self.grammar_failed.is_empty()
    }
}

#[pymethods]
impl PyStep {
    /// The step's NumPy columns by name (`STEP_COLUMNS`), made once.
    fn columns<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let dict = self.columns.get_or_try_init(py, || -> PyResult<_> {
            let columns = PyDict::new(py);
            for (name, c) in self.step.full_columns().into_named() {
                columns.set_item(name, column(py, c))?;
            }
            Ok(columns.unbind())
        })?;
        Ok(dict.bind(py).clone())
    }

    /// One column as a fresh NumPy array (``columns()`` makes them all).
    fn column<'py>(&self, py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyAny>> {
        match self.step.column(name) {
            Some(c) => Ok(column(py, c)),
            None => Err(PyKeyError::new_err(format!(
                "name {name:?} is not a step column (STEP_COLUMNS)"
            ))),
        }
    }

    fn __len__(&self) -> usize {
        self.step.entries.len()
    }

    /// Attention blocks handed out during the step, for the runner to zero
    /// (vLLM's `new_block_ids_to_zero`; empty without recurrent groups).
    #[getter]
    fn new_block_ids_to_zero(&self) -> Vec<u32> {
        self.step.new_block_ids_to_zero.clone()
    }

    /// A structured-output request samples this step.
    #[getter]
    fn has_structured_output_requests(&self) -> bool {
        self.step.has_structured_output_requests
    }

    /// A request scheduled this step may verify drafts proposed after it.
    #[getter]
    fn drafts_needed(&self) -> bool {
        self.step.drafts_needed
    }

    /// An admission takes external tokens a KV connector loads in the step.
    #[getter]
    fn has_sync_kv_loads(&self) -> bool {
        self.step.has_sync_kv_loads
    }

    /// Async: a structured-output request sampling this step still has its
    /// previous token in flight.
    #[getter]
    fn pending_structured_output_tokens(&self) -> bool {
        self.step.pending_structured_output_tokens
    }

    /// Requests whose grammar this step's waiting pass found compiled (now
    /// released), in the order reached.
    #[getter]
    fn grammar_released(&self) -> Vec<String> {
        self.grammar_released.clone()
    }

    /// Requests whose grammar this step's waiting pass found failed (still
    /// held), in the order reached.
    #[getter]
    fn grammar_failed(&self) -> Vec<String> {
        self.grammar_failed.clone()
    }
}

/// What one `update_from_output` reported, in scheduling order: one record
/// per request that got tokens. Its columns become NumPy arrays when first
/// read, as a step's do: a caller that only wants the finished requests
/// (the façade's own bookkeeping) makes none.
#[pyclass(name = "StepUpdate", module = "ironbatch._core", frozen)]
pub struct PyStepUpdate {
    records: Vec<UpdateRecord>,
    flat_tokens: Vec<u32>,
    rows: PyOnceLock<Py<PyAny>>,
    tokens: PyOnceLock<Py<PyAny>>,
    token_offsets: PyOnceLock<Py<PyAny>>,
    cached_tokens: PyOnceLock<Py<PyAny>>,
    /// The records whose request finished.
    #[pyo3(get)]
    finished: Vec<Py<PyFinishedRequest>>,
    /// Drafts verified in this output (None when none were).
    #[pyo3(get)]
    spec_decoding_stats: Option<Py<PySpecDecodingStats>>,
    /// Requests the update ended with an error, in the order ended: those
    /// a failed KV load ended (the "fail" policy) and the caller's
    /// `errors`; the ending gives them no record.
    #[pyo3(get)]
    errored: Vec<String>,
}

#[pymethods]
impl PyStepUpdate {
    /// Each record's row in the step.
    #[getter]
    fn rows(&self, py: Python<'_>) -> Py<PyAny> {
        let records = &self.records;
        self.rows
            .get_or_init(py, || {
                array(py, records.iter().map(|r| r.entry as i32).collect()).unbind()
            })
            .clone_ref(py)
    }

    /// All records' tokens, flattened.
    #[getter]
    fn tokens(&self, py: Python<'_>) -> Py<PyAny> {
        self.tokens
            .get_or_init(py, || array(py, self.flat_tokens.clone()).unbind())
            .clone_ref(py)
    }

    /// Record `i` owns `tokens[token_offsets[i]:token_offsets[i+1]]`.
    #[getter]
    fn token_offsets(&self, py: Python<'_>) -> Py<PyAny> {
        let records = &self.records;
        self.token_offsets
            .get_or_init(py, || {
                let mut offsets = Vec::with_capacity(records.len() + 1);
                offsets.push(0i64);
                offsets.extend(records.iter().map(|r| r.tokens_end as i64));
                array(py, offsets).unbind()
            })
            .clone_ref(py)
    }

    /// Each record's tokens held in hash-cached blocks after the output.
    #[getter]
    fn cached_tokens(&self, py: Python<'_>) -> Py<PyAny> {
        let records = &self.records;
        self.cached_tokens
            .get_or_init(py, || {
                array(py, records.iter().map(|r| r.cached_tokens as i64).collect()).unbind()
            })
            .clone_ref(py)
    }

    /// The number of records.
    fn __len__(&self) -> usize {
        self.records.len()
    }
}

/// vLLM's `SpecDecodingStats` for one update.
#[pyclass(
    name = "SpecDecodingStats",
    module = "ironbatch._core",
    frozen,
    get_all
)]
pub struct PySpecDecodingStats {
    num_spec_tokens: usize,
    num_drafts: u64,
    num_draft_tokens: u64,
    num_accepted_tokens: u64,
    num_accepted_tokens_per_pos: Vec<u64>,
    num_draft_tokens_per_pos: Vec<u64>,
}

/// A request that finished in an update (it is freed already).
#[pyclass(name = "FinishedRequest", module = "ironbatch._core", frozen, get_all)]
pub struct PyFinishedRequest {
    /// Its record in the update.
    record: usize,
    /// Its id: what the façade forgets it by, without reading the step's
    /// rows.
    request_id: String,
    /// vLLM's finish reason: "stop", "length", "abort" or "error".
    finish_reason: &'static str,
    /// The stop token that ended it, `"repetition_detected"` for a
    /// repeating pattern, or None.
    stop_reason: Option<Py<PyAny>>,
    /// All its tokens, prompt first, and its `num_computed_tokens`, as it
    /// ended (what the vLLM drop-in writes back to vLLM's `Request`).
    token_ids: Vec<u32>,
    num_computed_tokens: usize,
    /// Only a streaming session's turn ended: the request lives on.
    session_continues: bool,
}

#[pymethods]
impl PyFinishedRequest {
    /// `token_ids[start:]`, without making the whole list: the vLLM drop-in
    /// appends only what its `Request` lacks (a prompt can be thousands of
    /// tokens).
    fn token_ids_from(&self, start: usize) -> Vec<u32> {
        self.token_ids.get(start..).unwrap_or_default().to_vec()
    }

    /// `len(token_ids)`.
    #[getter]
    fn num_tokens(&self) -> usize {
        self.token_ids.len()
    }
}

/// What `make_stats` reports; taking it zeroes the counters.
#[pyclass(name = "SchedulerStats", module = "ironbatch._core", frozen, get_all)]
pub struct PySchedulerStats {
    num_running_reqs: usize,
    num_waiting_reqs: usize,
    num_skipped_waiting_reqs: usize,
    kv_cache_usage: f64,
    prefix_cache_stats: PyPrefixCacheStats,
    num_preempted_reqs: u64,
}

fn array<'py, T: numpy::Element>(py: Python<'py>, v: Vec<T>) -> Bound<'py, PyAny> {
    PyArray1::from_vec(py, v).into_any()
}

fn column<'py>(py: Python<'py>, c: Column) -> Bound<'py, PyAny> {
    match c {
        Column::I32(v) => array(py, v),
        Column::I64(v) => array(py, v),
        Column::U8(v) => array(py, v),
        Column::Bool(v) => array(py, v),
    }
}

/// A stop reason as vLLM reports it: the token, or "repetition_detected".
fn stop_reason(py: Python<'_>, reason: StopReason) -> Py<PyAny> {
    match reason {
        StopReason::Token(t) => t.into_pyobject(py).expect("an int").into_any().unbind(),
        StopReason::Repetition => PyString::new(py, "repetition_detected").into_any().unbind(),
    }
}

impl PyStep {
    /// The step as Python sees it; `py_ids` are the caller's id strings by
    /// slot, so the step creates no Python object per request.
    pub(super) fn of(
        py: Python<'_>,
        mut step: StepOutput,
        py_ids: &[Option<Py<PyString>>],
        core: &Scheduler,
    ) -> PyResult<Self> {
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
        let id_of = |slot: &Slot| core.request(*slot).map(|r| r.request_id.clone());
        Ok(PyStep {
            preempted_req_ids: std::mem::take(&mut step.preempted_req_ids),
            finished_req_ids: std::mem::take(&mut step.finished_req_ids),
            grammar_released: step.grammar_released.iter().filter_map(id_of).collect(),
            grammar_failed: step.grammar_failed.iter().filter_map(id_of).collect(),
            scheduled_encoder_inputs: step
                .scheduled_encoder_inputs
                .iter()
                .filter_map(|s| Some((id_of(&s.slot)?, s.input_ids.clone())))
                .collect(),
            free_encoder_mm_hashes: std::mem::take(&mut step.free_encoder_mm_hashes),
            encoder_mismatch: step.encoder_mismatch.iter().filter_map(id_of).collect(),
            step,
            req_ids: ids.unbind(),
            columns: PyOnceLock::new(),
        })
    }
}

/// An update's finished requests as Python records.
pub(super) fn finished_records(
    py: Python<'_>,
    finished: Vec<Finished>,
) -> PyResult<Vec<Py<PyFinishedRequest>>> {
    finished
        .into_iter()
        .map(|f| {
            let record = PyFinishedRequest {
                record: f.record,
                request_id: f.request_id,
                finish_reason: f.status.finish_reason().unwrap_or("error"),
                stop_reason: f.stop_reason.map(|s| stop_reason(py, s)),
                token_ids: f.token_ids,
                num_computed_tokens: f.num_computed_tokens,
                session_continues: f.session_continues,
            };
            Py::new(py, record)
        })
        .collect()
}

/// An update's draft counts as a Python record (None when none were verified).
pub(super) fn spec_decoding_stats(
    py: Python<'_>,
    stats: Option<SpecDecodingStats>,
) -> PyResult<Option<Py<PySpecDecodingStats>>> {
    stats
        .map(|s| {
            Py::new(
                py,
                PySpecDecodingStats {
                    num_spec_tokens: s.num_spec_tokens,
                    num_drafts: s.num_drafts,
                    num_draft_tokens: s.num_draft_tokens,
                    num_accepted_tokens: s.num_accepted_tokens,
                    num_accepted_tokens_per_pos: s.num_accepted_tokens_per_pos,
                    num_draft_tokens_per_pos: s.num_draft_tokens_per_pos,
                },
            )
        })
        .transpose()
}

impl PyStepUpdate {
    /// The core's update, its columns made on read, and finished records.
    pub(super) fn of(py: Python<'_>, out: UpdateOutput) -> PyResult<Self> {
        Ok(PyStepUpdate {
            spec_decoding_stats: spec_decoding_stats(py, out.spec_decoding_stats)?,
            errored: out.errored.into_iter().map(|f| f.request_id).collect(),
            finished: finished_records(py, out.finished)?,
            records: out.records,
            flat_tokens: out.tokens,
            rows: PyOnceLock::new(),
            tokens: PyOnceLock::new(),
            token_offsets: PyOnceLock::new(),
            cached_tokens: PyOnceLock::new(),
        })
    }
}

impl From<SchedulerStats> for PySchedulerStats {
    fn from(s: SchedulerStats) -> Self {
        PySchedulerStats {
            num_running_reqs: s.num_running_reqs,
            num_waiting_reqs: s.num_waiting_reqs,
            num_skipped_waiting_reqs: s.num_skipped_waiting_reqs,
            kv_cache_usage: s.kv_cache_usage,
            prefix_cache_stats: s.prefix_cache_stats.into(),
            num_preempted_reqs: s.num_preempted_reqs,
        }
    }
}
