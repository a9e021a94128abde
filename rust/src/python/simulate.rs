//! `ironbatch simulate`'s bindings: `SimWorkload` (a workload's columns),
//! `StepTimeModel` (the clock) and `simulate()` (the whole run, in Rust with
//! the GIL released, returning NumPy columns).
//!
//! The scheduler's settings come from a `_core.Scheduler`, so they pass the
//! same checks as everywhere else; the run builds a fresh scheduler from
//! them and leaves the given one alone.

use super::scheduler::PyScheduler;
use crate::simulate::{
    simulate as run_simulation, BatchShape, CpuOverhead, LinearModel, RooflineModel, SimOptions,
    StepModel, StepTime, TraceWriter, Workload,
};
use numpy::{IntoPyArray, PyReadonlyArray1};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// A workload's columns (see `rust/src/simulate/workload.rs`).
#[pyclass(name = "SimWorkload", module = "ironbatch._core", frozen)]
pub struct PySimWorkload {
    workload: Workload,
}

fn sizes(field: &str, values: PyReadonlyArray1<'_, i64>) -> PyResult<Vec<usize>> {
    values
        .as_array()
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            usize::try_from(v)
                .map_err(|_| PyValueError::new_err(format!("{field}[{i}] must be >= 0, got {v}")))
        })
        .collect()
}

#[pymethods]
impl PySimWorkload {
    #[new]
    #[pyo3(signature = (*, arrival_s, output_tokens, segment_offsets, segment_keys,
                        segment_lengths, literal_offsets, literal_tokens, vocab_size))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        arrival_s: PyReadonlyArray1<'_, f64>,
        output_tokens: PyReadonlyArray1<'_, i64>,
        segment_offsets: PyReadonlyArray1<'_, i64>,
        segment_keys: PyReadonlyArray1<'_, u64>,
        segment_lengths: PyReadonlyArray1<'_, i64>,
        literal_offsets: PyReadonlyArray1<'_, i64>,
        literal_tokens: PyReadonlyArray1<'_, i64>,
        vocab_size: u32,
    ) -> PyResult<Self> {
        let literal_tokens = literal_tokens
            .as_array()
            .iter()
            .enumerate()
            .map(|(i, &t)| {
                u32::try_from(t).map_err(|_| {
                    PyValueError::new_err(format!(
                        "literal_tokens[{i}] = {t} is not a token id (0 to {})",
                        u32::MAX
                    ))
                })
            })
            .collect::<PyResult<Vec<u32>>>()?;
        let workload = Workload {
            arrival_s: arrival_s.as_array().to_vec(),
            output_tokens: sizes("output_tokens", output_tokens)?,
            segment_offsets: sizes("segment_offsets", segment_offsets)?,
            segment_keys: segment_keys.as_array().to_vec(),
            segment_lengths: sizes("segment_lengths", segment_lengths)?,
            literal_offsets: sizes("literal_offsets", literal_offsets)?,
            literal_tokens,
            vocab_size,
        };
        workload.validate()?;
        Ok(PySimWorkload { workload })
    }

    fn __len__(&self) -> usize {
        self.workload.len()
    }

    /// Request `index`'s prompt, as the simulation adds it.
    fn prompt_token_ids(&self, index: usize) -> PyResult<Vec<u32>> {
        if index >= self.workload.len() {
            return Err(PyValueError::new_err(format!(
                "index {index} is outside the workload's {} requests",
                self.workload.len()
            )));
        }
        Ok(self.workload.prompt(index))
    }

    /// Every request's prompt length.
    fn prompt_lengths<'py>(&self, py: Python<'py>) -> Bound<'py, numpy::PyArray1<i64>> {
        (0..self.workload.len())
            .map(|i| self.workload.prompt_len(i) as i64)
            .collect::<Vec<_>>()
            .into_pyarray(py)
    }
}

/// The simulation's clock: a step model and the engine's CPU overhead.
#[pyclass(name = "StepTimeModel", module = "ironbatch._core", frozen)]
pub struct PyStepTimeModel {
    time: StepTime,
}

fn checked(time: StepTime) -> PyResult<PyStepTimeModel> {
    time.validate()?;
    Ok(PyStepTimeModel { time })
}

#[pymethods]
impl PyStepTimeModel {
    /// Seconds per unit of each part of the batch, summed.
    #[staticmethod]
    #[pyo3(signature = (*, intercept_s=0.0, per_request_s=0.0, per_prefill_request_s=0.0,
                        per_prefill_token_s=0.0,
                        per_decode_token_s=0.0, per_sampled_s=0.0, per_context_token_s=0.0,
                        per_attention_pair_s=0.0, overhead_per_step_s=0.0,
                        overhead_per_request_s=0.0))]
    #[allow(clippy::too_many_arguments)]
    fn linear(
        intercept_s: f64,
        per_request_s: f64,
        per_prefill_request_s: f64,
        per_prefill_token_s: f64,
        per_decode_token_s: f64,
        per_sampled_s: f64,
        per_context_token_s: f64,
        per_attention_pair_s: f64,
        overhead_per_step_s: f64,
        overhead_per_request_s: f64,
    ) -> PyResult<Self> {
        checked(StepTime {
            model: StepModel::Linear(LinearModel {
                intercept_s,
                per_request_s,
                per_prefill_request_s,
                per_prefill_token_s,
                per_decode_token_s,
                per_sampled_s,
                per_context_token_s,
                per_attention_pair_s,
            }),
            overhead: CpuOverhead {
                per_step_s: overhead_per_step_s,
                per_request_s: overhead_per_request_s,
            },
        })
    }

    /// Bytes over bandwidth or FLOPs over peak, the slower, plus `fixed_s`.
    #[staticmethod]
    #[pyo3(signature = (*, weight_bytes, kv_bytes_per_token, flops_per_token,
                        flops_per_attention_pair, flops_per_sampled, bytes_per_s, flops_per_s,
                        fixed_s, overhead_per_step_s=0.0, overhead_per_request_s=0.0))]
    #[allow(clippy::too_many_arguments)]
    fn roofline(
        weight_bytes: f64,
        kv_bytes_per_token: f64,
        flops_per_token: f64,
        flops_per_attention_pair: f64,
        flops_per_sampled: f64,
        bytes_per_s: f64,
        flops_per_s: f64,
        fixed_s: f64,
        overhead_per_step_s: f64,
        overhead_per_request_s: f64,
    ) -> PyResult<Self> {
        checked(StepTime {
            model: StepModel::Roofline(RooflineModel {
                weight_bytes,
                kv_bytes_per_token,
                flops_per_token,
                flops_per_attention_pair,
                flops_per_sampled,
                bytes_per_s,
                flops_per_s,
                fixed_s,
            }),
            overhead: CpuOverhead {
                per_step_s: overhead_per_step_s,
                per_request_s: overhead_per_request_s,
            },
        })
    }

    /// The model's seconds for a batch of this shape (0 for an empty one).
    #[pyo3(signature = (*, num_requests, num_prefill_requests, num_prefill_tokens,
                        num_decode_tokens, num_sampled, context_tokens, attention_pairs))]
    #[allow(clippy::too_many_arguments)]
    fn model_s(
        &self,
        num_requests: usize,
        num_prefill_requests: usize,
        num_prefill_tokens: usize,
        num_decode_tokens: usize,
        num_sampled: usize,
        context_tokens: usize,
        attention_pairs: f64,
    ) -> f64 {
        self.time.model_s(&BatchShape {
            num_requests,
            num_prefill_requests,
            num_prefill_tokens,
            num_decode_tokens,
            num_sampled,
            context_tokens,
            attention_pairs,
        })
    }

    /// The engine's CPU seconds around a step of `num_requests` requests.
    fn overhead_s(&self, num_requests: usize) -> f64 {
        self.time.overhead_s(num_requests)
    }
}

/// Run `workload` through a fresh scheduler with `scheduler`'s settings on
/// `step_model`'s clock. Returns a dict: `requests`, `steps` and
/// `decisions` (dicts of NumPy columns), `num_steps`, `end_s`, `finished`.
#[pyfunction]
#[pyo3(signature = (*, scheduler, workload, step_model, sampled_token=5, record_steps=true,
                    record_decisions=false, max_steps=None, trace_path=None))]
#[allow(clippy::too_many_arguments)]
pub fn simulate<'py>(
    py: Python<'py>,
    scheduler: PyRef<'py, PyScheduler>,
    workload: &Bound<'py, PySimWorkload>,
    step_model: &Bound<'py, PyStepTimeModel>,
    sampled_token: u32,
    record_steps: bool,
    record_decisions: bool,
    max_steps: Option<u64>,
    trace_path: Option<String>,
) -> PyResult<Bound<'py, PyDict>> {
    let config = scheduler.core.config().clone();
    drop(scheduler);
    let w = &workload.get().workload;
    let time = &step_model.get().time;
    let options = SimOptions {
        sampled_token,
        record_steps,
        record_decisions,
        max_steps,
    };
    let out = py.detach(move || {
        let mut trace = trace_path.as_deref().map(TraceWriter::create).transpose()?;
        let out = run_simulation(config, w, time, &options, trace.as_mut())?;
        if let Some(t) = trace.as_mut() {
            t.finish()?;
        }
        Ok::<_, crate::error::Error>(out)
    })?;
    let d = PyDict::new(py);
    let r = out.requests;
    let requests = PyDict::new(py);
    requests.set_item("arrival_s", r.arrival_s.into_pyarray(py))?;
    requests.set_item("first_scheduled_s", r.first_scheduled_s.into_pyarray(py))?;
    requests.set_item("first_token_s", r.first_token_s.into_pyarray(py))?;
    requests.set_item("finish_s", r.finish_s.into_pyarray(py))?;
    requests.set_item("prompt_tokens", r.prompt_tokens.into_pyarray(py))?;
    requests.set_item("output_tokens", r.output_tokens.into_pyarray(py))?;
    requests.set_item("prefix_hit_tokens", r.prefix_hit_tokens.into_pyarray(py))?;
    requests.set_item("preemptions", r.preemptions.into_pyarray(py))?;
    d.set_item("requests", requests)?;
    let s = out.steps;
    let steps = PyDict::new(py);
    steps.set_item("start_s", s.start_s.into_pyarray(py))?;
    steps.set_item("duration_s", s.duration_s.into_pyarray(py))?;
    steps.set_item("num_scheduled_reqs", s.num_scheduled_reqs.into_pyarray(py))?;
    steps.set_item("num_prefill_tokens", s.num_prefill_tokens.into_pyarray(py))?;
    steps.set_item("num_decode_tokens", s.num_decode_tokens.into_pyarray(py))?;
    steps.set_item("num_running", s.num_running.into_pyarray(py))?;
    steps.set_item("num_waiting", s.num_waiting.into_pyarray(py))?;
    steps.set_item("kv_usage", s.kv_usage.into_pyarray(py))?;
    steps.set_item("num_preempted", s.num_preempted.into_pyarray(py))?;
    d.set_item("steps", steps)?;
    let decisions = PyDict::new(py);
    decisions.set_item("offsets", out.decisions.offsets.into_pyarray(py))?;
    decisions.set_item("request", out.decisions.request.into_pyarray(py))?;
    decisions.set_item("num_tokens", out.decisions.num_tokens.into_pyarray(py))?;
    d.set_item("decisions", decisions)?;
    d.set_item("num_steps", out.num_steps)?;
    d.set_item("end_s", out.end_s)?;
    d.set_item("finished", out.finished)?;
    Ok(d)
}
