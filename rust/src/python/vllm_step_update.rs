//! `VllmStepUpdate`: what an update reported, shaped for the vLLM drop-in's
//! `EngineCoreOutput`s: per record its request id and its new tokens as
//! Python lists, so the outputs are one `map` over two lists.

use super::step::{finished_records, spec_decoding_stats, PyFinishedRequest, PySpecDecodingStats};
use crate::slab::Slot;
use crate::step::UpdateOutput;
use pyo3::prelude::*;
use pyo3::types::PyList;

/// One record per request that got tokens, in scheduling order.
#[pyclass(name = "VllmStepUpdate", module = "ironbatch._core", frozen, get_all)]
pub struct PyVllmStepUpdate {
    /// Each record's row in the step.
    rows: Py<PyList>,
    /// Each record's slot (the core's stable index of its request).
    slots: Vec<Slot>,
    /// Each record's request id (the step's own strings).
    req_ids: Py<PyList>,
    /// Each record's new tokens, one list per record.
    new_token_ids: Py<PyList>,
    /// Each record's tokens held in hash-cached blocks after the output.
    cached_tokens: Py<PyList>,
    /// The records whose request finished.
    finished: Vec<Py<PyFinishedRequest>>,
    /// Drafts verified in this output (None when none were).
    spec_decoding_stats: Option<Py<PySpecDecodingStats>>,
}

impl PyVllmStepUpdate {
    /// `step_req_ids` is the step's id list (row -> id); `sampled_rows` the
    /// runner's token list of each row, where it gave one: a record that
    /// kept all of it shares it.
    pub(super) fn of(
        py: Python<'_>,
        out: UpdateOutput,
        step_req_ids: &Bound<'_, PyList>,
        sampled_rows: &[Option<Bound<'_, PyList>>],
    ) -> PyResult<Self> {
        let records = &out.records;
        let mut req_ids = Vec::with_capacity(records.len());
        let mut new_token_ids = Vec::with_capacity(records.len());
        let mut start = 0;
        for rec in records {
            let row = rec.entry as usize;
            req_ids.push(step_req_ids.get_item(row)?);
            let kept = &out.tokens[start..rec.tokens_end];
            let list = match &sampled_rows[row] {
                Some(list) if list.len() == kept.len() => list.clone(),
                _ => PyList::new(py, kept)?,
            };
            new_token_ids.push(list);
            start = rec.tokens_end;
        }
        Ok(PyVllmStepUpdate {
            rows: PyList::new(py, records.iter().map(|rec| rec.entry))?.unbind(),
            slots: records.iter().map(|rec| rec.slot).collect(),
            req_ids: PyList::new(py, req_ids)?.unbind(),
            new_token_ids: PyList::new(py, new_token_ids)?.unbind(),
            cached_tokens: PyList::new(py, records.iter().map(|rec| rec.cached_tokens))?.unbind(),
            finished: finished_records(py, out.finished)?,
            spec_decoding_stats: spec_decoding_stats(py, out.spec_decoding_stats)?,
        })
    }
}

#[pymethods]
impl PyVllmStepUpdate {
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
        self.slots
            .iter()
            .enumerate()
            .filter(|&(_, &s)| wanted.get(s as usize).copied().unwrap_or(false))
            .map(|(k, _)| k)
            .collect()
    }
}
