//! `VllmStepRows`: what the vLLM drop-in reads of a step to build vLLM's
//! `SchedulerOutput`, made straight from the core's entries as Python lists
//! and one dict. A step's NumPy columns cost about 0.5 µs each to make and
//! more to turn back into lists; the drop-in needs lists, so it never asks
//! for the columns on a plain step.

use super::step::PyStep;
use crate::step::Kind;
use pyo3::exceptions::PyIndexError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyRange, PyTuple};

/// A step's rows for the drop-in: running rows first, then admissions
/// (first ones and resumed ones, in scheduling order).
#[pyclass(name = "VllmStepRows", module = "ironbatch._core", frozen, get_all)]
pub struct PyVllmStepRows {
    /// The scheduled requests' ids (the step's own list).
    req_ids: Py<PyList>,
    /// Each row's slot (the core's stable index of a live request).
    slots: Py<PyList>,
    num_scheduled: Py<PyList>,
    /// `num_computed_tokens` before the step (the prefix hit for admissions).
    computed: Py<PyList>,
    /// Output tokens before the step, placeholders included.
    num_output_tokens: Py<PyList>,
    /// Rows `[0, num_running)` continue; the rest are admissions.
    num_running: usize,
    /// Rows admitted for the first time.
    new: Py<PyList>,
    /// Rows admitted again after a preemption.
    resumed: Py<PyList>,
    /// Running rows whose block table grew this step.
    running_grown: Py<PyList>,
    /// vLLM's `num_scheduled_tokens`: request id -> tokens, in row order.
    num_scheduled_tokens: Py<PyDict>,
    total_num_scheduled_tokens: usize,
    /// KV-cache groups: each row's blocks come group by group.
    num_groups: usize,
    step: Py<PyStep>,
}

#[pymethods]
impl PyVllmStepRows {
    /// The step's rows for the drop-in; `num_groups` is the KV-cache
    /// groups' count the core was built with.
    #[new]
    fn new(py: Python<'_>, step: Bound<'_, PyStep>, num_groups: usize) -> PyResult<Self> {
        let s = step.get();
        let entries = &s.step.entries;
        let ids = s.req_ids_list(py);
        let num_running = entries
            .iter()
            .take_while(|e| e.kind == Kind::Running)
            .count();
        let rows_of =
            |kind: Kind| (num_running..entries.len()).filter(move |&i| entries[i].kind == kind);
        let offsets = &s.step.columns.new_block_offsets;
        let g = num_groups.max(1);
        if offsets.len() != entries.len() * g + 1 {
            return Err(PyIndexError::new_err(format!(
                "num_groups {num_groups} does not match the step's block offsets ({} for {} rows)",
                offsets.len(),
                entries.len()
            )));
        }
        let grown = (0..num_running).filter(|&i| offsets[i * g] != offsets[(i + 1) * g]);
        let scheduled_tokens = PyDict::new(py);
        for (i, e) in entries.iter().enumerate() {
            scheduled_tokens.set_item(ids.get_item(i)?, e.num_tokens)?;
        }
        Ok(PyVllmStepRows {
            req_ids: ids.clone().unbind(),
            slots: PyList::new(py, entries.iter().map(|e| e.slot))?.unbind(),
            num_scheduled: PyList::new(py, entries.iter().map(|e| e.num_tokens))?.unbind(),
            computed: PyList::new(py, entries.iter().map(|e| e.num_computed_tokens))?.unbind(),
            num_output_tokens: PyList::new(py, &s.step.columns.num_output_tokens)?.unbind(),
            num_running,
            new: PyList::new(py, rows_of(Kind::New))?.unbind(),
            resumed: PyList::new(py, rows_of(Kind::Resumed))?.unbind(),
            running_grown: PyList::new(py, grown)?.unbind(),
            num_scheduled_tokens: scheduled_tokens.unbind(),
            total_num_scheduled_tokens: s.step.total_num_scheduled_tokens(),
            num_groups: g,
            step: step.unbind(),
        })
    }

    /// The admitted rows, `range(num_running, rows)`.
    #[getter]
    fn admitted<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyRange>> {
        let rows = self.step.get().step.entries.len();
        PyRange::new(py, self.num_running as isize, rows as isize)
    }

    /// Row `i`'s blocks, one list per KV-cache group (vLLM's shape): the
    /// whole table for an admission, the new blocks for a running request.
    fn block_ids<'py>(&self, py: Python<'py>, i: usize) -> PyResult<Bound<'py, PyTuple>> {
        let step = &self.step.get().step;
        if i >= step.entries.len() {
            return Err(PyIndexError::new_err(format!(
                "row {i} of a step of {} rows",
                step.entries.len()
            )));
        }
        let g = self.num_groups;
        let lists = (0..g)
            .map(|k| PyList::new(py, step.group_block_ids_of(i, k, g)))
            .collect::<PyResult<Vec<_>>>()?;
        PyTuple::new(py, lists)
    }

    /// vLLM's `scheduled_spec_decode_tokens`: each row with drafts, its
    /// drafts (-1 for a placeholder).
    fn spec_decode_tokens<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let step = &self.step.get().step;
        let ids = self.req_ids.bind(py);
        let all = &step.columns.spec_token_ids;
        let out = PyDict::new(py);
        let mut start = 0;
        for (i, &n) in step.columns.num_spec_tokens.iter().enumerate() {
            let end = start + n as usize;
            if n > 0 {
                out.set_item(ids.get_item(i)?, PyList::new(py, &all[start..end])?)?;
            }
            start = end;
        }
        Ok(out)
    }
}
