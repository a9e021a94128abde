//! `VllmStepUpdate`: what an update reported, shaped for the vLLM drop-in's
//! `EngineCoreOutput`s: per record its request id and its new tokens as
//! Python lists and, made by `VllmObjects.update`, the `EngineCoreOutput`
//! itself. The other per-record lists are made when first read: most
//! steps' outputs carry tokens only, and the drop-in reads none of them.

use super::step::{finished_records, spec_decoding_stats, PyFinishedRequest, PySpecDecodingStats};
use super::vllm_step_rows::list_once;
use crate::slab::Slot;
use crate::step::{UpdateOutput, UpdateRecord};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyList;

/// A request an update ended with an error (it is freed already).
#[pyclass(name = "ErroredRequest", module = "ironbatch._core", frozen, get_all)]
pub struct PyErroredRequest {
    request_id: String,
    /// All its tokens, prompt first, and its `num_computed_tokens`, as it
    /// ended (what the vLLM drop-in writes back to vLLM's `Request`).
    token_ids: Vec<u32>,
    num_computed_tokens: usize,
}

/// One record per request that got tokens, in scheduling order.
#[pyclass(name = "VllmStepUpdate", module = "ironbatch._core", frozen)]
pub struct PyVllmStepUpdate {
    records: Vec<UpdateRecord>,
    /// Each record's request id (the step's own strings).
    #[pyo3(get)]
    req_ids: Py<PyList>,
    /// Each record's new tokens, one list per record.
    #[pyo3(get)]
    new_token_ids: Py<PyList>,
    /// Each record's vLLM `EngineCoreOutput` (request id and tokens; the
    /// drop-in completes the few that carry more); None unless
    /// `VllmObjects.update` made the update.
    #[pyo3(get)]
    outputs: Option<Py<PyList>>,
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
    errored: Vec<Py<PyErroredRequest>>,
    rows: PyOnceLock<Py<PyList>>,
    slots: PyOnceLock<Py<PyList>>,
    cached_tokens: PyOnceLock<Py<PyList>>,
}

impl PyVllmStepUpdate {
    /// `step_req_ids` is the step's id list (row -> id); `sampled_rows` the
    /// runner's token list of each row, where it gave one: a record that
    /// kept all of it shares it. With `engine_core_output` (vLLM's class),
    /// each record's output is made too.
    pub(super) fn of(
        py: Python<'_>,
        out: UpdateOutput,
        step_req_ids: &Bound<'_, PyList>,
        sampled_rows: &[Option<Bound<'_, PyList>>],
        engine_core_output: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let records = &out.records;
        let req_ids = PyList::empty(py);
        let new_token_ids = PyList::empty(py);
        let outputs = engine_core_output.map(|_| PyList::empty(py));
        let mut start = 0;
        for rec in records {
            let row = rec.entry as usize;
            let rid = step_req_ids.get_item(row)?;
            let kept = &out.tokens[start..rec.tokens_end];
            let list = match &sampled_rows[row] {
                Some(list) if list.len() == kept.len() => list.clone(),
                _ => PyList::new(py, kept)?,
            };
            if let (Some(cls), Some(outputs)) = (engine_core_output, &outputs) {
                outputs.append(cls.call1((&rid, &list))?)?;
            }
            req_ids.append(rid)?;
            new_token_ids.append(list)?;
            start = rec.tokens_end;
        }
        Ok(PyVllmStepUpdate {
            req_ids: req_ids.unbind(),
            new_token_ids: new_token_ids.unbind(),
            outputs: outputs.map(Bound::unbind),
            finished: finished_records(py, out.finished)?,
            spec_decoding_stats: spec_decoding_stats(py, out.spec_decoding_stats)?,
            errored: out
                .errored
                .into_iter()
                .map(|e| {
                    let e = PyErroredRequest {
                        request_id: e.request_id,
                        token_ids: e.token_ids,
                        num_computed_tokens: e.num_computed_tokens,
                    };
                    Py::new(py, e)
                })
                .collect::<PyResult<_>>()?,
            records: out.records,
            rows: PyOnceLock::new(),
            slots: PyOnceLock::new(),
            cached_tokens: PyOnceLock::new(),
        })
    }
}

#[pymethods]
impl PyVllmStepUpdate {
    /// Each record's row in the step.
    #[getter]
    fn rows(&self, py: Python<'_>) -> PyResult<Py<PyList>> {
        list_once(&self.rows, py, self.records.iter().map(|r| r.entry))
    }

    /// Each record's slot (the core's stable index of its request).
    #[getter]
    fn slots(&self, py: Python<'_>) -> PyResult<Py<PyList>> {
        list_once(&self.slots, py, self.records.iter().map(|r| r.slot))
    }

    /// Each record's tokens held in hash-cached blocks after the output.
    #[getter]
    fn cached_tokens(&self, py: Python<'_>) -> PyResult<Py<PyList>> {
        let values = self.records.iter().map(|r| r.cached_tokens);
        list_once(&self.cached_tokens, py, values)
    }

    /// The records whose slot is among `slots`, in record order: the few
    /// outputs that carry more than tokens, found without a Python pass
    /// over every record.
    fn records_of(&self, slots: Vec<Slot>) -> Vec<usize> {
        let Some(&top) = slots.iter().max() else {
            return Vec::new();
        };
        let mut wanted = vec![false; top as usize + 1];
        for &s in &slots {
            wanted[s as usize] = true;
        }
        self.records
            .iter()
            .enumerate()
            .filter(|&(_, r)| wanted.get(r.slot as usize).copied().unwrap_or(false))
            .map(|(k, _)| k)
            .collect()
    }
}
