//! `VllmStepRows`: what the vLLM drop-in reads of a step to build vLLM's
//! `SchedulerOutput`, made straight from the core's entries. A step's NumPy
//! columns cost about 0.5 µs each to make and more to turn back into lists;
//! the drop-in needs lists, so it never asks for the columns on a plain step.
//! The per-row lists are made when first read: a steady step's
//! `SchedulerOutput` (`VllmObjects.schedule`) reads none of them, and a list
//! of 256 ints costs a few µs.

use super::step::PyStep;
use crate::step::Kind;
use pyo3::exceptions::PyIndexError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyList, PyRange, PyTuple};

/// A step's rows for the drop-in: running rows first, then admissions
/// (first ones and resumed ones, in scheduling order).
#[pyclass(name = "VllmStepRows", module = "ironbatch._core", frozen)]
pub struct PyVllmStepRows {
    /// The scheduled requests' ids (the step's own list).
    #[pyo3(get)]
    req_ids: Py<PyList>,
    /// Rows `[0, num_running)` continue; the rest are admissions.
    #[pyo3(get)]
    pub(super) num_running: usize,
    /// Rows admitted for the first time.
    #[pyo3(get)]
    new: Py<PyList>,
    /// Rows admitted again after a preemption.
    #[pyo3(get)]
    resumed: Py<PyList>,
    /// vLLM's `num_scheduled_tokens`: request id -> tokens, in row order.
    #[pyo3(get)]
    pub(super) num_scheduled_tokens: Py<PyDict>,
    #[pyo3(get)]
    pub(super) total_num_scheduled_tokens: usize,
    /// KV-cache groups: each row's blocks come group by group.
    #[pyo3(get)]
    pub(super) num_groups: usize,
    #[pyo3(get)]
    step: Py<PyStep>,
    /// vLLM's `SchedulerOutput` for the step, when `VllmObjects.schedule`
    /// made the rows (None otherwise).
    #[pyo3(get)]
    pub(super) output: Option<Py<PyAny>>,
    /// Something happened that vLLM's `Request`s must be told: an
    /// admission, a preemption, a grammar released or failed.
    #[pyo3(get)]
    has_news: bool,
    slots: PyOnceLock<Py<PyList>>,
    num_scheduled: PyOnceLock<Py<PyList>>,
    computed: PyOnceLock<Py<PyList>>,
    num_output_tokens: PyOnceLock<Py<PyList>>,
}

impl PyVllmStepRows {
    /// The rows of `step`, for a core of `num_groups` KV-cache groups.
    pub(super) fn of(py: Python<'_>, step: Bound<'_, PyStep>, num_groups: usize) -> PyResult<Self> {
        let s = step.get();
        let entries = &s.step.entries;
        let ids = s.req_ids_list(py);
        let num_running = entries
            .iter()
            .take_while(|e| e.kind == Kind::Running)
            .count();
        let rows_of =
            |kind: Kind| (num_running..entries.len()).filter(move |&i| entries[i].kind == kind);
        // No group (a model without a KV cache): no block, one offset.
        let g = num_groups;
        let offsets = &s.step.new_block_offsets;
        if offsets.len() != entries.len() * g + 1 {
            return Err(PyIndexError::new_err(format!(
                "num_groups {num_groups} does not match the step's block offsets ({} for {} rows)",
                offsets.len(),
                entries.len()
            )));
        }
        let scheduled_tokens = PyDict::new(py);
        for (i, e) in entries.iter().enumerate() {
            scheduled_tokens.set_item(ids.get_item(i)?, e.num_tokens)?;
        }
        let has_news =
            num_running < entries.len() || !s.preempted_req_ids.is_empty() || s.has_grammar_news();
        Ok(PyVllmStepRows {
            req_ids: ids.clone().unbind(),
            num_running,
            new: PyList::new(py, rows_of(Kind::New))?.unbind(),
            resumed: PyList::new(py, rows_of(Kind::Resumed))?.unbind(),
            num_scheduled_tokens: scheduled_tokens.unbind(),
            total_num_scheduled_tokens: s.step.total_num_scheduled_tokens(),
            num_groups: g,
            step: step.unbind(),
            output: None,
            has_news,
            slots: PyOnceLock::new(),
            num_scheduled: PyOnceLock::new(),
            computed: PyOnceLock::new(),
            num_output_tokens: PyOnceLock::new(),
        })
    }

    /// The running rows whose block table grew this step.
    pub(super) fn grown(&self) -> impl Iterator<Item = usize> + '_ {
        let offsets = &self.step.get().step.new_block_offsets;
        let g = self.num_groups;
        (0..self.num_running).filter(move |&i| offsets[i * g] != offsets[(i + 1) * g])
    }

    /// Row `i`'s blocks as vLLM's tuple of one list per group.
    pub(super) fn blocks_of<'py>(
        &self,
        py: Python<'py>,
        i: usize,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let step = &self.step.get().step;
        let g = self.num_groups;
        let lists = (0..g)
            .map(|k| PyList::new(py, step.group_block_ids_of(i, k, g)))
            .collect::<PyResult<Vec<_>>>()?;
        PyTuple::new(py, lists)
    }

    /// The step's rows.
    pub(super) fn step(&self) -> &Py<PyStep> {
        &self.step
    }
}

/// The list in `cell`, made from `values` on first use.
pub(super) fn list_once<'py, T: IntoPyObject<'py>>(
    cell: &PyOnceLock<Py<PyList>>,
    py: Python<'py>,
    values: impl ExactSizeIterator<Item = T>,
) -> PyResult<Py<PyList>> {
    cell.get_or_try_init(py, || PyList::new(py, values).map(Bound::unbind))
        .map(|l| l.clone_ref(py))
}

#[pymethods]
impl PyVllmStepRows {
    /// The step's rows for the drop-in; `num_groups` is the KV-cache
    /// groups' count the core was built with.
    #[new]
    fn new(py: Python<'_>, step: Bound<'_, PyStep>, num_groups: usize) -> PyResult<Self> {
        Self::of(py, step, num_groups)
    }

    /// Each row's slot (the core's stable index of a live request).
    #[getter]
    fn slots(&self, py: Python<'_>) -> PyResult<Py<PyList>> {
        let entries = &self.step.get().step.entries;
        list_once(&self.slots, py, entries.iter().map(|e| e.slot))
    }

    /// Tokens scheduled per row.
    #[getter]
    fn num_scheduled(&self, py: Python<'_>) -> PyResult<Py<PyList>> {
        let entries = &self.step.get().step.entries;
        list_once(
            &self.num_scheduled,
            py,
            entries.iter().map(|e| e.num_tokens),
        )
    }

    /// `num_computed_tokens` before the step (the prefix hit for admissions).
    #[getter]
    fn computed(&self, py: Python<'_>) -> PyResult<Py<PyList>> {
        let entries = &self.step.get().step.entries;
        let values = entries.iter().map(|e| e.num_computed_tokens);
        list_once(&self.computed, py, values)
    }

    /// Output tokens before the step, placeholders included.
    #[getter]
    fn num_output_tokens(&self, py: Python<'_>) -> PyResult<Py<PyList>> {
        let entries = &self.step.get().step.entries;
        let values = entries.iter().map(|e| e.num_output_tokens);
        list_once(&self.num_output_tokens, py, values)
    }

    /// Running rows whose block table grew this step.
    #[getter]
    fn running_grown<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(py, self.grown())
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
        let rows = self.step.get().step.entries.len();
        if i >= rows {
            return Err(PyIndexError::new_err(format!(
                "row {i} of a step of {rows} rows"
            )));
        }
        self.blocks_of(py, i)
    }

    /// vLLM's `scheduled_spec_decode_tokens`: each row with drafts, its
    /// drafts (-1 for a placeholder).
    pub(super) fn spec_decode_tokens<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let step = &self.step.get().step;
        let ids = self.req_ids.bind(py);
        let out = PyDict::new(py);
        let mut drafts = Vec::new();
        for (i, e) in step.entries.iter().enumerate() {
            if !e.drafts.is_empty() {
                drafts.clear();
                e.drafts.write_to(&mut drafts);
                out.set_item(ids.get_item(i)?, PyList::new(py, &drafts)?)?;
            }
        }
        Ok(out)
    }
}
