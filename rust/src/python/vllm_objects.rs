//! `VllmObjects`: the objects vLLM's engine takes from its scheduler every
//! step — `SchedulerOutput` with its `CachedRequestData`, one
//! `EngineCoreOutput` per request that got tokens, `SchedulerStats` with its
//! `PrefixCacheStats` — made in Rust from the core's step for the vLLM
//! drop-in, which adds only what needs vLLM's `Request` objects
//! (admissions, events).
//!
//! vLLM's dataclasses are made without their generated `__init__`, which
//! costs 0.6–1 µs each and a step makes four: a template dict of every field
//! in declaration order (defaults in place) is copied, fields with a
//! `default_factory` get a fresh value, the given fields are set, and the
//! dict becomes a new instance's `__dict__`. For a dataclass without
//! `__post_init__` or `__slots__`, not frozen (checked when made), that is
//! what `__init__` leaves, field for field and in the same order.

use super::kv_connector::StepReport;
use super::scheduler::PyScheduler;
use super::step::PyStep;
use super::vllm::{apply_runner_output, RunnerOutput};
use super::vllm_step_rows::PyVllmStepRows;
use super::vllm_step_update::PyVllmStepUpdate;
use crate::scheduler::Scheduler;
use crate::step::Kind;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyDict, PyList, PySet, PyString, PyType};

/// A dataclass made from a template of its fields.
struct Dataclass {
    cls: Py<PyType>,
    /// Every field, in declaration order: its default, or None.
    template: Py<PyDict>,
    /// Fields with a `default_factory` that the maker does not set.
    fresh: Vec<(Py<PyString>, Py<PyAny>)>,
    /// The fields the maker sets, in the order `make` takes their values.
    sets: Vec<Py<PyString>>,
}

impl Dataclass {
    /// `cls` for a maker that sets `sets`: every field without a default
    /// must be among them, and each must be a field.
    fn of(cls: &Bound<'_, PyType>, sets: &[&str]) -> PyResult<Self> {
        let py = cls.py();
        let dataclasses = py.import("dataclasses")?;
        let name = cls.qualname()?;
        let refuse = |why: String| Err(PyTypeError::new_err(format!("{name}: {why}")));
        if !dataclasses
            .call_method1("is_dataclass", (cls,))?
            .is_truthy()?
        {
            return refuse("not a dataclass".into());
        }
        for hook in ["__post_init__", "__slots__"] {
            if cls.hasattr(hook)? {
                return refuse(format!("has {hook}, which a dict-made instance would miss"));
            }
        }
        let frozen = cls.getattr("__dataclass_params__")?.getattr("frozen")?;
        if frozen.is_truthy()? {
            return refuse("is frozen: its instances take no __dict__".into());
        }
        let missing = dataclasses.getattr("MISSING")?;
        let template = PyDict::new(py);
        let mut fresh = Vec::new();
        let mut fields = Vec::new();
        for f in dataclasses.call_method1("fields", (cls,))?.try_iter()? {
            let f = f?;
            let field: String = f.getattr("name")?.extract()?;
            let key = PyString::intern(py, &field);
            let default = f.getattr("default")?;
            let factory = f.getattr("default_factory")?;
            let set_here = sets.contains(&field.as_str());
            if !default.is(&missing) {
                template.set_item(&key, default)?;
            } else {
                template.set_item(&key, py.None())?;
                if !factory.is(&missing) {
                    if !set_here {
                        fresh.push((key.unbind(), factory.unbind()));
                    }
                } else if !set_here {
                    return refuse(format!("field {field:?} has no default and is not set"));
                }
            }
            fields.push(field);
        }
        if let Some(unknown) = sets.iter().find(|s| !fields.iter().any(|f| f == *s)) {
            return refuse(format!("no field {unknown:?}"));
        }
        Ok(Dataclass {
            cls: cls.clone().unbind(),
            template: template.unbind(),
            fresh,
            sets: sets
                .iter()
                .map(|s| PyString::intern(py, s).unbind())
                .collect(),
        })
    }

    /// An instance with `values` for the fields in `sets`, in that order.
    fn make<'py>(
        &self,
        py: Python<'py>,
        values: &[Bound<'py, PyAny>],
    ) -> PyResult<Bound<'py, PyAny>> {
        debug_assert_eq!(values.len(), self.sets.len());
        let d = self.template.bind(py).copy()?;
        for (key, factory) in &self.fresh {
            d.set_item(key.bind(py), factory.bind(py).call0()?)?;
        }
        for (key, value) in self.sets.iter().zip(values) {
            d.set_item(key.bind(py), value)?;
        }
        let object_new = OBJECT_NEW.get_or_try_init(py, || {
            py.get_type::<PyAny>().getattr("__new__").map(Bound::unbind)
        })?;
        let obj = object_new.bind(py).call1((self.cls.bind(py),))?;
        obj.setattr(pyo3::intern!(py, "__dict__"), d)?;
        Ok(obj)
    }
}

/// `object.__new__`, looked up once.
static OBJECT_NEW: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// The fields each maker sets, in the order it passes their values.
const SCHEDULER_OUTPUT: &[&str] = &[
    "scheduled_new_reqs",
    "scheduled_cached_reqs",
    "num_scheduled_tokens",
    "total_num_scheduled_tokens",
    "scheduled_spec_decode_tokens",
    "scheduled_encoder_inputs",
    "preempted_req_ids",
    "finished_req_ids",
    "free_encoder_mm_hashes",
    "num_spec_tokens_to_schedule",
    "has_structured_output_requests",
    "pending_structured_output_tokens",
    "skip_drafts",
    "new_block_ids_to_zero",
];
const CACHED_REQUEST_DATA: &[&str] = &[
    "req_ids",
    "resumed_req_ids",
    "new_token_ids",
    "all_token_ids",
    "new_block_ids",
    "num_computed_tokens",
    "num_output_tokens",
];
const SCHEDULER_STATS: &[&str] = &[
    "num_running_reqs",
    "num_waiting_reqs",
    "num_skipped_waiting_reqs",
    "num_kv_fetch_reqs_by_stage",
    "kv_cache_usage",
    "kv_cache_eviction_events",
    "prefix_cache_stats",
    "spec_decoding_stats",
    "kv_connector_stats",
    "cudagraph_stats",
    "perf_stats",
];
const PREFIX_CACHE_STATS: &[&str] = &[
    "reset",
    "requests",
    "queries",
    "hits",
    "preempted_requests",
    "preempted_queries",
    "preempted_hits",
];

/// What a model runner is sent, as the engine's configuration shapes it.
#[derive(Clone, Copy, Debug)]
struct RunnerShape {
    num_groups: usize,
    /// Model runner V2: resumed requests are sent whole, as new ones (the
    /// drop-in adds them); V1 gets them among the cached ones.
    model_runner_v2: bool,
    /// Synchronous pipeline parallelism: the first stage gets each cached
    /// request's scheduled tokens (`CachedRequestData.new_token_ids`).
    send_token_ids: bool,
    num_speculative_tokens: usize,
    /// The drafter can skip a step whose drafts nobody verifies.
    can_skip_drafts: bool,
}

/// vLLM's per-step objects for one drop-in: its classes, and the shape of
/// what its model runner is sent.
#[pyclass(name = "VllmObjects", module = "ironbatch._core", frozen)]
pub struct PyVllmObjects {
    scheduler_output: Dataclass,
    cached_request_data: Dataclass,
    scheduler_stats: Dataclass,
    prefix_cache_stats: Dataclass,
    /// `EngineCoreOutput` (a msgspec struct: called with the request id and
    /// its new tokens).
    engine_core_output: Py<PyAny>,
    /// `SchedulerStats.num_kv_fetch_reqs_by_stage`'s zeros, copied per step.
    kv_fetch_zeros: Py<PyDict>,
    shape: RunnerShape,
}

impl PyVllmObjects {
    /// `CachedRequestData` for the running rows (and, for model runner V1,
    /// the resumed ones with their whole tables). V1's `all_token_ids` is
    /// left empty for the drop-in to fill: it needs vLLM's `Request`s.
    fn cached_request_data<'py>(
        &self,
        py: Python<'py>,
        rows: &PyVllmStepRows,
        core: &Scheduler,
    ) -> PyResult<Bound<'py, PyAny>> {
        let step = rows.step().get();
        let entries = &step.step.entries;
        let ids = step.req_ids_list(py);
        let n = rows.num_running;
        let resumed: Vec<usize> = if self.shape.model_runner_v2 {
            Vec::new()
        } else {
            (n..entries.len())
                .filter(|&i| entries[i].kind == Kind::Resumed)
                .collect()
        };
        let cached_rows = || (0..n).chain(resumed.iter().copied());
        let req_ids = if resumed.is_empty() {
            ids.get_slice(0, n)
        } else {
            PyList::new(
                py,
                cached_rows()
                    .map(|i| ids.get_item(i))
                    .collect::<PyResult<Vec<_>>>()?,
            )?
        };
        let resumed_req_ids = PySet::new(
            py,
            resumed
                .iter()
                .map(|&i| ids.get_item(i))
                .collect::<PyResult<Vec<_>>>()?,
        )?;
        let new_token_ids = PyList::empty(py);
        if self.shape.send_token_ids {
            for i in cached_rows() {
                let e = &entries[i];
                let tokens = core.request(e.slot).map_or(&[][..], |r| r.seq.tokens());
                new_token_ids.append(token_slice(tokens, e.num_computed_tokens, e.num_tokens))?;
            }
        }
        let new_block_ids = PyList::new(py, (0..n).map(|_| py.None()))?;
        for i in rows.grown() {
            new_block_ids.set_item(i, rows.blocks_of(py, i)?)?;
        }
        for &i in &resumed {
            // vLLM reports a cached request's blocks as None when every
            // group's list is empty: a resumed request holds blocks, unless
            // there is no KV cache (no group) to hold them in.
            if self.shape.num_groups == 0 {
                new_block_ids.append(py.None())?;
            } else {
                new_block_ids.append(rows.blocks_of(py, i)?)?;
            }
        }
        let computed = PyList::new(py, cached_rows().map(|i| entries[i].num_computed_tokens))?;
        let num_output_tokens =
            PyList::new(py, cached_rows().map(|i| entries[i].num_output_tokens))?;
        self.cached_request_data.make(
            py,
            &[
                req_ids.into_any(),
                resumed_req_ids.into_any(),
                new_token_ids.into_any(),
                PyDict::new(py).into_any(),
                new_block_ids.into_any(),
                computed.into_any(),
                num_output_tokens.into_any(),
            ],
        )
    }
}

/// `tokens[start..start + n]`, stopping at the known tokens (async
/// placeholders have none yet; vLLM's slice stops there too).
fn token_slice(tokens: &[u32], start: usize, n: usize) -> &[u32] {
    let end = start.saturating_add(n).min(tokens.len());
    &tokens[start.min(end)..end]
}

#[pymethods]
impl PyVllmObjects {
    #[new]
    #[pyo3(signature = (*, scheduler_output, cached_request_data, scheduler_stats,
                        prefix_cache_stats, engine_core_output, kv_fetch_stages,
                        num_kv_cache_groups, model_runner_v2, send_token_ids,
                        num_speculative_tokens, can_skip_drafts))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        scheduler_output: &Bound<'_, PyType>,
        cached_request_data: &Bound<'_, PyType>,
        scheduler_stats: &Bound<'_, PyType>,
        prefix_cache_stats: &Bound<'_, PyType>,
        engine_core_output: &Bound<'_, PyAny>,
        kv_fetch_stages: &Bound<'_, PyAny>,
        num_kv_cache_groups: usize,
        model_runner_v2: bool,
        send_token_ids: bool,
        num_speculative_tokens: usize,
        can_skip_drafts: bool,
    ) -> PyResult<Self> {
        let py = scheduler_output.py();
        let zeros = PyDict::new(py);
        for stage in kv_fetch_stages.try_iter()? {
            zeros.set_item(stage?, 0)?;
        }
        Ok(PyVllmObjects {
            scheduler_output: Dataclass::of(scheduler_output, SCHEDULER_OUTPUT)?,
            cached_request_data: Dataclass::of(cached_request_data, CACHED_REQUEST_DATA)?,
            scheduler_stats: Dataclass::of(scheduler_stats, SCHEDULER_STATS)?,
            prefix_cache_stats: Dataclass::of(prefix_cache_stats, PREFIX_CACHE_STATS)?,
            engine_core_output: engine_core_output.clone().unbind(),
            kv_fetch_zeros: zeros.unbind(),
            shape: RunnerShape {
                num_groups: num_kv_cache_groups,
                model_runner_v2,
                send_token_ids,
                num_speculative_tokens,
                can_skip_drafts,
            },
        })
    }

    /// The core's next step (`throttle_prefills`: a data-parallel engine's
    /// prefill balancing holds prefills back), as rows whose `output` is
    /// vLLM's `SchedulerOutput`: everything but the admissions'
    /// `NewRequestData` (and model runner V1's `all_token_ids`), which need
    /// vLLM's `Request`s.
    #[pyo3(signature = (scheduler, throttle_prefills=false))]
    fn schedule(
        &self,
        py: Python<'_>,
        scheduler: &Bound<'_, PyScheduler>,
        throttle_prefills: bool,
    ) -> PyResult<PyVllmStepRows> {
        let mut s = scheduler.borrow_mut();
        let step = Bound::new(py, s.schedule_step(py, throttle_prefills)?)?;
        let mut rows = PyVllmStepRows::of(py, step, self.shape.num_groups)?;
        let cached = self.cached_request_data(py, &rows, &s.core)?;
        let step = rows.step().get();
        let spec = if self.shape.num_speculative_tokens > 0 {
            rows.spec_decode_tokens(py)?
        } else {
            PyDict::new(py)
        };
        let ids_set = |ids: &[String]| PySet::new(py, ids);
        // vLLM's `scheduled_encoder_inputs`: request id -> input indices.
        let encoder_inputs = PyDict::new(py);
        for (id, inputs) in &step.scheduled_encoder_inputs {
            encoder_inputs.set_item(id, inputs)?;
        }
        let flags = &step.step;
        let skip_drafts = self.shape.can_skip_drafts && !flags.drafts_needed;
        let output = self.scheduler_output.make(
            py,
            &[
                PyList::empty(py).into_any(),
                cached,
                rows.num_scheduled_tokens.bind(py).clone().into_any(),
                rows.total_num_scheduled_tokens
                    .into_pyobject(py)?
                    .into_any(),
                spec.into_any(),
                encoder_inputs.into_any(),
                ids_set(&step.preempted_req_ids)?.into_any(),
                ids_set(&step.finished_req_ids)?.into_any(),
                PyList::new(py, &step.free_encoder_mm_hashes)?.into_any(),
                self.shape
                    .num_speculative_tokens
                    .into_pyobject(py)?
                    .into_any(),
                pybool(py, flags.has_structured_output_requests),
                pybool(py, flags.pending_structured_output_tokens),
                pybool(py, skip_drafts),
                // vLLM's `ids or None`.
                match step.step.new_block_ids_to_zero.as_slice() {
                    [] => py.None().into_bound(py),
                    ids => PyList::new(py, ids)?.into_any(),
                },
            ],
        )?;
        rows.output = Some(output.unbind());
        Ok(rows)
    }

    /// Apply a vLLM `ModelRunnerOutput`'s tokens to `step`, as
    /// `vllm_update_from_runner_output` does, with each record's
    /// `EngineCoreOutput` made (request id and new tokens).
    /// `kv_connector_output`: the worker's report of the step's KV
    /// transfers (§4.19); `errors`: request ids to end with an error after
    /// the output, with those the "fail" policy ends; `end_order(whole,
    /// loading, running, requested)` orders them all (see `StepReport`).
    #[pyo3(signature = (scheduler, *, step, req_id_to_index, sampled_token_ids, accept=None,
                        kv_connector_output=None, errors=None, end_order=None))]
    #[allow(clippy::too_many_arguments)] // keyword-only, vLLM's names
    fn update<'py>(
        &self,
        py: Python<'py>,
        scheduler: &Bound<'py, PyScheduler>,
        step: &Bound<'py, PyStep>,
        req_id_to_index: &Bound<'py, PyDict>,
        sampled_token_ids: &Bound<'py, PyList>,
        accept: Option<&Bound<'py, PyAny>>,
        kv_connector_output: Option<&Bound<'py, PyAny>>,
        errors: Option<&Bound<'py, PyAny>>,
        end_order: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<PyVllmStepUpdate> {
        let runner = RunnerOutput {
            req_id_to_index,
            sampled_token_ids,
            accept,
        };
        let kv = StepReport::of(kv_connector_output, errors, end_order)?;
        let (out, sampled_rows) = apply_runner_output(scheduler, step, runner, &kv)?;
        let ids = step.get().req_ids_list(py);
        let cls = self.engine_core_output.bind(py);
        PyVllmStepUpdate::of(py, out, ids, &sampled_rows, Some(cls))
    }

    /// Apply a pooling runner's `ModelRunnerOutput` to `step`: a row whose
    /// `pooler_output` entry is not None got its pooled result, which
    /// finishes the request. Each record's `EngineCoreOutput` is made with
    /// no tokens; the drop-in attaches the pooled tensor.
    /// `kv_connector_output`, `errors` and `end_order` as `update` takes
    /// them.
    #[pyo3(signature = (scheduler, *, step, req_id_to_index, pooler_output,
                        kv_connector_output=None, errors=None, end_order=None))]
    #[allow(clippy::too_many_arguments)] // keyword-only, vLLM's names
    fn update_pooled<'py>(
        &self,
        py: Python<'py>,
        scheduler: &Bound<'py, PyScheduler>,
        step: &Bound<'py, PyStep>,
        req_id_to_index: &Bound<'py, PyDict>,
        pooler_output: &Bound<'py, PyList>,
        kv_connector_output: Option<&Bound<'py, PyAny>>,
        errors: Option<&Bound<'py, PyAny>>,
        end_order: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<PyVllmStepUpdate> {
        let kv = StepReport::of(kv_connector_output, errors, end_order)?;
        let ids = step.get().req_ids_list(py);
        let n = step.get().step.entries.len();
        let mut pooled = Vec::with_capacity(n);
        for i in 0..n {
            let rid = ids.get_item(i)?;
            let got = match req_id_to_index.get_item(&rid)? {
                Some(index) => {
                    let index: usize = index.extract()?;
                    let row = pooler_output.get_item(index).map_err(|_| {
                        PyValueError::new_err(format!(
                            "req_id_to_index[{rid}] = {index} is outside pooler_output ({} rows)",
                            pooler_output.len()
                        ))
                    })?;
                    !row.is_none()
                }
                None => false,
            };
            pooled.push(got);
        }
        let out = scheduler
            .borrow_mut()
            .apply_pooled(&step.get().step, &pooled, &kv)?;
        let cls = self.engine_core_output.bind(py);
        PyVllmStepUpdate::of(py, out, ids, &vec![None; n], Some(cls))
    }

    /// vLLM's `SchedulerStats` from the core's counters (which taking them
    /// zeroes) and the parts the drop-in gathers.
    #[pyo3(signature = (scheduler, *, kv_cache_eviction_events, spec_decoding_stats,
                        kv_connector_stats, cudagraph_stats, perf_stats))]
    #[allow(clippy::too_many_arguments)] // keyword-only, by name
    fn scheduler_stats<'py>(
        &self,
        py: Python<'py>,
        scheduler: &Bound<'py, PyScheduler>,
        kv_cache_eviction_events: Bound<'py, PyAny>,
        spec_decoding_stats: Bound<'py, PyAny>,
        kv_connector_stats: Bound<'py, PyAny>,
        cudagraph_stats: Bound<'py, PyAny>,
        perf_stats: Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let s = scheduler.borrow_mut().core.make_stats();
        let p = &s.prefix_cache_stats;
        let int = |v: u64| v.into_pyobject(py).map(Bound::into_any);
        let prefix = self.prefix_cache_stats.make(
            py,
            &[
                pybool(py, p.reset),
                int(p.requests)?,
                int(p.queries)?,
                int(p.hits)?,
                int(p.preempted_requests)?,
                int(p.preempted_queries)?,
                int(p.preempted_hits)?,
            ],
        )?;
        let count = |v: usize| v.into_pyobject(py).map(Bound::into_any);
        self.scheduler_stats.make(
            py,
            &[
                count(s.num_running_reqs)?,
                count(s.num_waiting_reqs)?,
                count(s.num_skipped_waiting_reqs)?,
                self.kv_fetch_zeros.bind(py).copy()?.into_any(),
                s.kv_cache_usage.into_pyobject(py)?.into_any(),
                kv_cache_eviction_events,
                prefix,
                spec_decoding_stats,
                kv_connector_stats,
                cudagraph_stats,
                perf_stats,
            ],
        )
    }
}

fn pybool(py: Python<'_>, v: bool) -> Bound<'_, PyAny> {
    PyBool::new(py, v).to_owned().into_any()
}
