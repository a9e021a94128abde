//! `Scheduler`: the Rust scheduler behind `ironbatch.core_scheduler` (and
//! through it `ironbatch.Scheduler(backend="rust")` and the vLLM drop-in).
//!
//! A step crosses into Python once, as NumPy arrays named by
//! `StepColumns::NAMES`; request ids cross as the Python strings the caller
//! passed in (kept per slot), so a step creates no Python object per
//! request. Every call takes keyword arguments and returns named types.

use super::args::{count, draft_list, u32_list};
use super::debug_state::debug_state;
use super::ec_connector::PyEcConnector;
use super::kv_connector::{order_errors, PyKvConnector, StepReport};
use super::kv_events::PyKvEvent;
use super::request_extras::{lora_adapter, mm_inputs};
use super::step::{PySchedulerStats, PyStep, PyStepUpdate};
use crate::attention_group::{AttentionKind, GroupSpec};
use crate::kv_cache_manager::KvCacheConfig;
use crate::kv_connector::{KvConnectorSetup, LoadFailurePolicy};
use crate::request::{NewRequest, Repetition, Request, RequestStatus, StopRules};
use crate::scheduler::{Pause, RequestErrors, Scheduler};
use crate::scheduler_config::{EncoderConfig, Policy, Runner, SchedulerConfig};
use crate::slab::Slot;
use crate::step::{StepOutput, UpdateOutput};
use numpy::PyReadonlyArray1;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};

/// vLLM 0.33's V1 scheduler in Rust.
#[pyclass(name = "Scheduler", module = "ironbatch._core")]
pub struct PyScheduler {
    pub(super) core: Scheduler,
    /// The caller's request-id strings, by slot.
    py_ids: Vec<Option<Py<PyString>>>,
}

fn status_named(name: &str) -> PyResult<RequestStatus> {
    match name {
        "FINISHED_ABORTED" => Ok(RequestStatus::FinishedAborted),
        "FINISHED_STOPPED" => Ok(RequestStatus::FinishedStopped),
        "FINISHED_LENGTH_CAPPED" => Ok(RequestStatus::FinishedLengthCapped),
        "FINISHED_IGNORED" => Ok(RequestStatus::FinishedIgnored),
        "FINISHED_ERROR" => Ok(RequestStatus::FinishedError),
        "FINISHED_REPETITION" => Ok(RequestStatus::FinishedRepetition),
        other => Err(PyValueError::new_err(format!(
            "status must be a FINISHED_* status name, got {other:?}"
        ))),
    }
}

/// A KV-cache group as the binding takes it: `(kind, size,
/// admission_cap_blocks, speculative_blocks, checkpoint_alignment,
/// block_size)`.
type BindingGroup = (
    String,
    usize,
    Option<usize>,
    usize,
    Option<usize>,
    Option<usize>,
);

/// A KV-cache group from the binding's [`BindingGroup`]: kind "full" or "cross_attention" (size ignored),
/// "sliding_window" (size: the window), "chunked_local" (size: the chunk)
/// or "mamba" (size: tokens per state block; speculative_blocks its drafts'
/// scratch states; checkpoint_alignment its prefill checkpoints'); block_size
/// an attention group's own tokens per block.
fn group_spec(
    (kind, size, admission_cap_blocks, speculative_blocks, checkpoint_alignment, block_size): &BindingGroup,
) -> PyResult<GroupSpec> {
    let (size, admission_cap_blocks) = (*size, *admission_cap_blocks);
    let kind = match kind.as_str() {
        "full" => AttentionKind::Full,
        "cross_attention" => AttentionKind::CrossAttention,
        "sliding_window" => AttentionKind::SlidingWindow { window: size },
        "chunked_local" => AttentionKind::ChunkedLocal { chunk: size },
        "mamba" => AttentionKind::Mamba {
            block_size: size,
            speculative_blocks: *speculative_blocks,
            checkpoint_alignment: *checkpoint_alignment,
        },
        other => {
            return Err(PyValueError::new_err(format!(
                "kv_cache_groups kind must be 'full', 'sliding_window', 'chunked_local', \
                 'cross_attention' or 'mamba', got {other:?}"
            )))
        }
    };
    Ok(GroupSpec {
        kind,
        admission_cap_blocks,
        block_size: *block_size,
    })
}

fn runner_named(name: &str) -> PyResult<Runner> {
    match name {
        "generate" => Ok(Runner::Generate),
        "pooling" => Ok(Runner::Pooling),
        "encoder_only" => Ok(Runner::EncoderOnly),
        other => Err(PyValueError::new_err(format!(
            "runner must be 'generate', 'pooling' or 'encoder_only', got {other:?}"
        ))),
    }
}

fn policy_named(name: &str) -> PyResult<Policy> {
    match name {
        "fcfs" => Ok(Policy::Fcfs),
        "priority" => Ok(Policy::Priority),
        other => Err(PyValueError::new_err(format!(
            "policy must be 'fcfs' or 'priority', got {other:?}"
        ))),
    }
}

/// vLLM's `repetition_detection` settings, read by name from any object
/// that has them (vLLM's `RepetitionDetectionParams`, the API's twin).
fn repetition_rules(obj: &Bound<'_, PyAny>) -> PyResult<Repetition> {
    let field = |name: &str| -> PyResult<usize> {
        count(&format!("repetition_detection.{name}"), &obj.getattr(name)?)
    };
    Ok(Repetition {
        min_pattern_size: field("min_pattern_size")?,
        max_pattern_size: field("max_pattern_size")?,
        min_count: field("min_count")?,
    })
}

/// A sampled token id; -1 (none) is handled by the caller.
#[inline]
pub(super) fn token(i: usize, t: i64) -> PyResult<u32> {
    u32::try_from(t).map_err(|_| {
        PyValueError::new_err(format!("sampled[{i}] = {t} is neither -1 nor a token id"))
    })
}

impl PyScheduler {
    /// The core's next step, as Python sees it.
    pub(super) fn schedule_step(
        &mut self,
        py: Python<'_>,
        throttle_prefills: bool,
    ) -> PyResult<PyStep> {
        let step = self.core.schedule_throttled(throttle_prefills);
        PyStep::of(py, step, &self.py_ids, &self.core)
    }

    /// Apply checked tokens (entry `i` gets `tokens[offsets[i]..offsets[i+1]]`)
    /// and return the update as a Python object. `accept(request_id, kept,
    /// num_tokens)` judges each structured-output request's kept tokens
    /// (`num_tokens`: its length with them); one that raises counts as a
    /// rejection (the error goes to `sys.unraisablehook`), so a failing
    /// check ends one request, never the update.
    pub(super) fn apply(
        &mut self,
        py: Python<'_>,
        step: &StepOutput,
        tokens: &[u32],
        offsets: &[usize],
        accept: Option<&Bound<'_, PyAny>>,
        kv: &StepReport<'_, '_>,
    ) -> PyResult<UpdateOutput> {
        let py_ids = &self.py_ids;
        let mut check = |slot: Slot, r: &Request, kept: &[u32]| -> bool {
            let Some(accept) = accept else {
                return true;
            };
            let id = py_ids[slot as usize]
                .as_ref()
                .expect("a scheduled request is live");
            let verdict = accept
                .call1((id.bind(py), kept.to_vec(), r.num_tokens()))
                .and_then(|v| v.is_truthy());
            verdict.unwrap_or_else(|e| {
                e.write_unraisable(py, Some(accept));
                false
            })
        };
        let mut order = error_order(py_ids, kv);
        let errors = RequestErrors {
            request_ids: &kv.errors,
            order: Some(&mut order),
        };
        let out = self
            .core
            .update_with_kv_report(step, tokens, offsets, &mut check, &kv.report, errors)?;
        drop(order);
        self.forget_finished(&out);
        Ok(out)
    }

    /// A pooling runner's results (`pooled[i]` for entry `i`) applied,
    /// with the worker's KV-transfer report as [`Self::apply`] takes it.
    pub(super) fn apply_pooled(
        &mut self,
        step: &StepOutput,
        pooled: &[bool],
        kv: &StepReport<'_, '_>,
    ) -> PyResult<UpdateOutput> {
        let mut order = error_order(&self.py_ids, kv);
        let errors = RequestErrors {
            request_ids: &kv.errors,
            order: Some(&mut order),
        };
        let out = self
            .core
            .update_pooled_with_kv_report(step, pooled, &kv.report, errors)?;
        drop(order);
        self.forget_finished(&out);
        Ok(out)
    }

    fn forget_finished(&mut self, out: &UpdateOutput) {
        for f in &out.finished {
            if !f.session_continues {
                self.py_ids[out.records[f.record].slot as usize] = None;
            }
        }
        for f in &out.errored {
            self.py_ids[f.slot as usize] = None;
        }
    }
}

/// The order the update ends requests with an error in, as the caller's
/// `end_order` (by request id) gives it; none without one.
fn error_order<'a>(
    py_ids: &'a [Option<Py<PyString>>],
    kv: &'a StepReport<'_, '_>,
) -> impl FnMut(&crate::scheduler::ErrorGroups) -> Vec<Slot> + 'a {
    move |groups| match kv.end_order {
        Some(end_order) => order_errors(end_order, groups, |slot: Slot| -> Py<PyAny> {
            py_ids[slot as usize]
                .as_ref()
                .expect("a request ending with an error is live")
                .clone_ref(end_order.py())
                .into_any()
        }),
        None => Vec::new(),
    }
}

#[pymethods]
impl PyScheduler {
    #[new]
    #[pyo3(signature = (*, max_num_seqs, max_num_batched_tokens, max_num_scheduled_tokens,
                        max_num_active_seqs, max_model_len, enable_chunked_prefill,
                        long_prefill_token_threshold, long_prefill_token_threshold_adaptive,
                        watermark_blocks, policy, scheduler_reserve_full_isl, num_blocks,
                        block_size, enable_prefix_caching, async_scheduling,
                        prefill_schedule_interval, decode_stagger,
                        num_speculative_tokens=None, num_lookahead_tokens=None,
                        num_hash_lookahead_tokens=None, drop_eagle_block=false,
                        eagle_groups=None,
                        num_draft_slots=None,
                        drafts_by_batch_size=None,
                        kv_cache_groups=None, sparse_retention=true, retention_interval=None,
                        mixed_precision=false,
                        max_loras=None,
                        encoder_compute_budget=None, encoder_cache_size=None,
                        disable_chunked_mm_input=false, drafter_read_ahead=None,
                        runner="generate"))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        max_num_seqs: &Bound<'_, PyAny>,
        max_num_batched_tokens: &Bound<'_, PyAny>,
        max_num_scheduled_tokens: &Bound<'_, PyAny>,
        max_num_active_seqs: &Bound<'_, PyAny>,
        max_model_len: &Bound<'_, PyAny>,
        enable_chunked_prefill: bool,
        long_prefill_token_threshold: &Bound<'_, PyAny>,
        long_prefill_token_threshold_adaptive: bool,
        watermark_blocks: &Bound<'_, PyAny>,
        policy: &str,
        scheduler_reserve_full_isl: bool,
        num_blocks: &Bound<'_, PyAny>,
        block_size: &Bound<'_, PyAny>,
        enable_prefix_caching: bool,
        async_scheduling: bool,
        prefill_schedule_interval: &Bound<'_, PyAny>,
        decode_stagger: &Bound<'_, PyAny>,
        num_speculative_tokens: Option<&Bound<'_, PyAny>>,
        num_lookahead_tokens: Option<&Bound<'_, PyAny>>,
        num_hash_lookahead_tokens: Option<&Bound<'_, PyAny>>,
        drop_eagle_block: bool,
        eagle_groups: Option<Vec<usize>>,
        num_draft_slots: Option<&Bound<'_, PyAny>>,
        drafts_by_batch_size: Option<Vec<usize>>,
        kv_cache_groups: Option<Vec<BindingGroup>>,
        sparse_retention: bool,
        retention_interval: Option<&Bound<'_, PyAny>>,
        mixed_precision: bool,
        max_loras: Option<&Bound<'_, PyAny>>,
        encoder_compute_budget: Option<&Bound<'_, PyAny>>,
        encoder_cache_size: Option<&Bound<'_, PyAny>>,
        disable_chunked_mm_input: bool,
        drafter_read_ahead: Option<&Bound<'_, PyAny>>,
        runner: &str,
    ) -> PyResult<Self> {
        let groups = match kv_cache_groups {
            None => vec![GroupSpec::FULL],
            Some(specs) => specs.iter().map(group_spec).collect::<PyResult<Vec<_>>>()?,
        };
        // The speculative-decoding settings default to off.
        let optional = |name: &str, value: Option<&Bound<'_, PyAny>>| match value {
            Some(v) => count(name, v),
            None => Ok(0),
        };
        let max_model_len = count("max_model_len", max_model_len)?;
        // A multimodal model's encoder: both limits, or neither (a text model).
        let encoder = match (encoder_compute_budget, encoder_cache_size) {
            (None, None) => None,
            (Some(budget), Some(size)) => Some(EncoderConfig {
                compute_budget: count("encoder_compute_budget", budget)?,
                cache_size: count("encoder_cache_size", size)?,
                disable_chunked_mm_input,
            }),
            _ => {
                return Err(PyValueError::new_err(
                    "encoder_compute_budget and encoder_cache_size go together: give both \
                     (a multimodal model) or neither (a text model)",
                ))
            }
        };
        let config = SchedulerConfig {
            max_num_seqs: count("max_num_seqs", max_num_seqs)?,
            max_num_batched_tokens: count("max_num_batched_tokens", max_num_batched_tokens)?,
            max_num_scheduled_tokens: count("max_num_scheduled_tokens", max_num_scheduled_tokens)?,
            max_num_active_seqs: count("max_num_active_seqs", max_num_active_seqs)?,
            max_model_len,
            enable_chunked_prefill,
            long_prefill_token_threshold: count(
                "long_prefill_token_threshold",
                long_prefill_token_threshold,
            )?,
            long_prefill_token_threshold_adaptive,
            watermark_blocks: count("watermark_blocks", watermark_blocks)?,
            policy: policy_named(policy)?,
            scheduler_reserve_full_isl,
            async_scheduling,
            prefill_schedule_interval: count(
                "prefill_schedule_interval",
                prefill_schedule_interval,
            )?,
            decode_stagger: count("decode_stagger", decode_stagger)?,
            num_speculative_tokens: optional("num_speculative_tokens", num_speculative_tokens)?,
            num_draft_slots: optional("num_draft_slots", num_draft_slots)?,
            drafts_by_batch_size,
            max_loras: max_loras.map(|v| count("max_loras", v)).transpose()?,
            drafter_read_ahead: optional("drafter_read_ahead", drafter_read_ahead)?,
            encoder,
            runner: runner_named(runner)?,
            cache: KvCacheConfig {
                num_blocks: count("num_blocks", num_blocks)?,
                block_size: count("block_size", block_size)?,
                max_model_len,
                enable_prefix_caching,
                num_lookahead_tokens: optional("num_lookahead_tokens", num_lookahead_tokens)?,
                num_hash_lookahead_tokens: optional(
                    "num_hash_lookahead_tokens",
                    num_hash_lookahead_tokens,
                )?,
                drop_eagle_block,
                eagle_groups,
                groups,
                sparse_retention,
                retention_interval: optional("retention_interval", retention_interval)?,
                mixed_precision,
            },
        };
        Ok(PyScheduler {
            core: Scheduler::new(config)?,
            py_ids: Vec::new(),
        })
    }

    /// Queue a request; returns its slot (its stable row while it lives).
    /// `eos_token_id` is None when there is none or EOS is ignored.
    #[pyo3(signature = (*, request_id, prompt_token_ids, max_tokens, min_tokens, eos_token_id,
                        stop_token_ids, repetition_detection, priority, arrival_time,
                        cache_salt, skip_reading_prefix_cache=false,
                        structured_output=false, report_hits=false, resumable=false,
                        lora_request=None, mm_features=None, prompt_embeds_digests=None))]
    #[allow(clippy::too_many_arguments)]
    fn add_request(
        &mut self,
        request_id: &Bound<'_, PyString>,
        prompt_token_ids: &Bound<'_, PyAny>,
        max_tokens: &Bound<'_, PyAny>,
        min_tokens: &Bound<'_, PyAny>,
        eos_token_id: Option<u32>,
        stop_token_ids: &Bound<'_, PyAny>,
        repetition_detection: Option<&Bound<'_, PyAny>>,
        priority: i64,
        arrival_time: f64,
        cache_salt: Option<String>,
        skip_reading_prefix_cache: bool,
        structured_output: bool,
        report_hits: bool,
        resumable: bool,
        lora_request: Option<&Bound<'_, PyAny>>,
        mm_features: Option<&Bound<'_, PyAny>>,
        prompt_embeds_digests: Option<Vec<Vec<u8>>>,
    ) -> PyResult<Slot> {
        let new = NewRequest {
            request_id: request_id.to_str()?.to_owned(),
            prompt_token_ids: u32_list("prompt_token_ids", prompt_token_ids)?,
            stop: StopRules {
                max_tokens: count("max_tokens", max_tokens)?,
                min_tokens: count("min_tokens", min_tokens)?,
                eos_token_id,
                stop_token_ids: u32_list("stop_token_ids", stop_token_ids)?,
                repetition: repetition_detection
                    .map(repetition_rules)
                    .transpose()?
                    .map(Box::new),
            },
            priority,
            arrival_time,
            cache_salt,
            lora: lora_request.map(lora_adapter).transpose()?,
            mm_inputs: mm_features.map(mm_inputs).transpose()?.unwrap_or_default(),
            prompt_embeds_digests,
            skip_reading_prefix_cache,
            structured_output,
            report_hits,
            resumable,
        };
        let slot = self.core.add_request(new)?;
        if self.py_ids.len() <= slot as usize {
            self.py_ids.resize_with(slot as usize + 1, || None);
        }
        // A session's end of input may have ended it at once.
        self.py_ids[slot as usize] = self.core.request(slot).map(|_| request_id.clone().unbind());
        Ok(slot)
    }

    /// One scheduling decision; `throttle_prefills` holds prefill work back
    /// (a data-parallel engine's prefill balancing).
    #[pyo3(signature = (throttle_prefills=false))]
    fn schedule(&mut self, py: Python<'_>, throttle_prefills: bool) -> PyResult<PyStep> {
        self.schedule_step(py, throttle_prefills)
    }

    /// Log KV-cache events from now on (docs/scheduling.md §7.12).
    fn enable_kv_events(&mut self) {
        self.core.enable_kv_events();
    }

    /// Log blocks' lives (handed out, hit) from now on, for residency
    /// metrics.
    fn enable_block_lifecycle_events(&mut self) {
        self.core.enable_block_lifecycle_events();
    }

    /// Log each request's prefix lookups and block releases from now on,
    /// among the KV-cache events (§7.12).
    fn enable_request_events(&mut self) {
        self.core.enable_request_events();
    }

    /// Follow auxiliary outputs (routed experts) from now on: prefix hits
    /// reach only over blocks whose routing the workers hold (§7.12).
    fn enable_aux_outputs(&mut self) {
        self.core.enable_aux_outputs();
    }

    /// The cached states offered to the KV connector since last taken, as
    /// (request id, group, block id, tokens), oldest first (§4.19.2). An
    /// offer's request still holds its blocks (a finished one held by the
    /// connector included).
    fn take_boundary_states(&mut self) -> Vec<(String, usize, u32, usize)> {
        let offered = self.core.take_boundary_states();
        offered
            .into_iter()
            .map(|s| {
                let owner = self
                    .core
                    .request(s.owner)
                    .expect("an offer's request holds its blocks");
                (owner.request_id.clone(), s.group, s.block_id, s.num_tokens)
            })
            .collect()
    }

    /// The KV-cache events since last taken, oldest first.
    fn take_kv_events(&mut self) -> Vec<PyKvEvent> {
        self.core
            .take_kv_events()
            .into_iter()
            .map(PyKvEvent::from)
            .collect()
    }

    /// A structured-output request's grammar compiled (`compiled=True`) or
    /// failed; it counts when a waiting pass next reaches the request.
    #[pyo3(signature = (*, request_id, compiled))]
    fn report_grammar(&mut self, request_id: &str, compiled: bool) -> PyResult<()> {
        Ok(self.core.report_grammar(request_id, compiled)?)
    }

    /// Draft tokens for the requests' next steps: `request_ids[i]` gets
    /// `token_ids[offsets[i]:offsets[i+1]]`, replacing what it had (vLLM's
    /// `update_draft_token_ids`; docs/scheduling.md §4.13).
    #[pyo3(signature = (*, request_ids, token_ids, offsets))]
    fn update_draft_token_ids(
        &mut self,
        request_ids: Vec<String>,
        token_ids: &Bound<'_, PyAny>,
        offsets: Vec<i64>,
    ) -> PyResult<()> {
        let tokens = draft_list("token_ids", token_ids)?;
        let offsets = offsets
            .iter()
            .map(|&o| {
                usize::try_from(o).map_err(|_| PyValueError::new_err(format!("offsets: {o} < 0")))
            })
            .collect::<PyResult<Vec<usize>>>()?;
        Ok(self
            .core
            .update_draft_token_ids(&request_ids, &tokens, &offsets)?)
    }

    /// Apply a step's tokens. With `offsets`, entry `i` gets
    /// `token_ids[offsets[i]:offsets[i+1]]`; without, `token_ids` holds one
    /// token per entry in scheduling order, -1 for none. `accept` judges
    /// structured-output requests' tokens (see `apply`).
    /// `errors`: request ids to end with an error after the output, with
    /// those a failed load ends under the "fail" policy;
    /// `end_order(whole, loading, running, requested)` orders them all (a
    /// trace's recorded order, vLLM's set's).
    #[pyo3(signature = (*, step, token_ids, offsets, accept=None, kv_connector_output=None,
                        errors=None, end_order=None))]
    #[allow(clippy::too_many_arguments)] // PyO3 keyword arguments, all named at the call
    fn update_from_output<'py>(
        &mut self,
        py: Python<'py>,
        step: &Bound<'py, PyStep>,
        token_ids: PyReadonlyArray1<'py, i64>,
        offsets: Option<PyReadonlyArray1<'py, i64>>,
        accept: Option<&Bound<'py, PyAny>>,
        kv_connector_output: Option<&Bound<'py, PyAny>>,
        errors: Option<&Bound<'py, PyAny>>,
        end_order: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<PyStepUpdate> {
        let kv = StepReport::of(kv_connector_output, errors, end_order)?;
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
        let out = self.apply(py, &step.step, &tokens, &offsets, accept, &kv)?;
        PyStepUpdate::of(py, out)
    }

    /// A pooling runner's output: `pooled[i]` is whether the step's entry
    /// `i` got a pooled result, which finishes its request (stopped);
    /// `kv_connector_output`, `errors` and `end_order` as
    /// `update_from_output` takes them.
    #[pyo3(signature = (step, pooled, *, kv_connector_output=None, errors=None, end_order=None))]
    fn update_from_pooler_output<'py>(
        &mut self,
        py: Python<'py>,
        step: &Bound<'py, PyStep>,
        pooled: Vec<bool>,
        kv_connector_output: Option<&Bound<'py, PyAny>>,
        errors: Option<&Bound<'py, PyAny>>,
        end_order: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<PyStepUpdate> {
        let kv = StepReport::of(kv_connector_output, errors, end_order)?;
        let out = self.apply_pooled(&step.get().step, &pooled, &kv)?;
        PyStepUpdate::of(py, out)
    }

    /// End requests from outside, freeing them in the order given (unknown
    /// ids ignored).
    #[pyo3(signature = (*, request_ids, status))]
    fn finish_requests(&mut self, request_ids: &Bound<'_, PyAny>, status: &str) -> PyResult<()> {
        if request_ids.is_instance_of::<PyString>() {
            return Err(PyTypeError::new_err(
                "request_ids must be a list of str, got str",
            ));
        }
        let ids: Vec<String> = request_ids.extract()?;
        let status = status_named(status)?;
        for slot in self.core.finish_requests(&ids, status) {
            self.py_ids[slot as usize] = None;
        }
        Ok(())
    }

    /// Pin each listed block once, from outside any request (a KV
    /// connector that manages vLLM's GPU block pool: its `touch`); the null
    /// block is passed over. Checked first.
    fn pin_blocks(&mut self, block_ids: &Bound<'_, PyAny>) -> PyResult<()> {
        let ids = u32_list("block_ids", block_ids)?;
        Ok(self.core.pin_blocks(&ids)?)
    }

    /// Drop one pin per listed block, in the order given (the connector's
    /// `free_blocks`); refused, changing nothing, past a block's pins.
    fn unpin_blocks(&mut self, block_ids: &Bound<'_, PyAny>) -> PyResult<()> {
        let ids = u32_list("block_ids", block_ids)?;
        Ok(self.core.unpin_blocks(&ids)?)
    }

    /// A handle to ask for pins on from anywhere, from inside a
    /// connector's call too (where the scheduler cannot be called): the
    /// scheduler applies the asks right after that call returns, or at its
    /// next step or update.
    fn pin_requests(&self) -> PyPinRequests {
        PyPinRequests(self.core.pin_requests())
    }

    /// The asks on `pin_requests` that were refused since the last call,
    /// as messages, oldest first (a refused ask changed nothing).
    fn take_pin_errors(&mut self) -> Vec<String> {
        self.core
            .take_pin_errors()
            .into_iter()
            .map(|e| e.to_string())
            .collect()
    }

    /// Forget every cached block hash; refused (False) while blocks are
    /// held, unless `reset_running_requests` preempts the running ones.
    #[pyo3(signature = (*, reset_running_requests))]
    fn reset_prefix_cache(&mut self, reset_running_requests: bool) -> bool {
        self.core.reset_prefix_cache(reset_running_requests)
    }

    /// Attach a KV connector's scheduler side (docs/scheduling.md §4.19),
    /// before any request.
    #[pyo3(signature = (
        *,
        connector,
        kv_load_failure_policy,
        defer_block_free,
        requires_kv_delivery,
        divergent_hybrid_hits = false,
    ))]
    fn set_kv_connector(
        &mut self,
        connector: Bound<'_, PyAny>,
        kv_load_failure_policy: &str,
        defer_block_free: bool,
        requires_kv_delivery: bool,
        divergent_hybrid_hits: bool,
    ) -> PyResult<()> {
        let policy = LoadFailurePolicy::parse(kv_load_failure_policy).ok_or_else(|| {
            PyValueError::new_err(format!(
                "kv_load_failure_policy must be 'fail' or 'recompute', got {kv_load_failure_policy:?}"
            ))
        })?;
        let connector = Box::new(PyKvConnector::new(connector)?);
        let setup = KvConnectorSetup {
            load_failure_policy: policy,
            defer_block_free,
            requires_kv_delivery,
            divergent_hybrid_hits,
        };
        Ok(self.core.set_kv_connector(connector, setup)?)
    }

    /// Attach an encoder-cache connector (docs/scheduling.md §4.20).
    #[pyo3(signature = (*, connector))]
    fn set_ec_connector(&mut self, connector: Bound<'_, PyAny>) -> PyResult<()> {
        Ok(self
            .core
            .set_ec_connector(Box::new(PyEcConnector::new(connector)))?)
    }

    /// Forget every encoder output (after a weight update).
    fn reset_encoder_cache(&mut self) {
        self.core.reset_encoder_cache();
    }

    /// Counts and usage; takes the counters.
    fn make_stats(&mut self) -> PySchedulerStats {
        self.core.make_stats().into()
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

    /// (running, waiting) request counts.
    fn get_request_counts(&self) -> (usize, usize) {
        self.core.request_counts()
    }

    /// The fraction of usable KV-cache blocks in use.
    #[getter]
    fn kv_cache_usage(&self) -> f64 {
        self.core.kv().usage()
    }

    /// Whether `request_id` is a live request.
    fn has_request(&self, request_id: &str) -> bool {
        self.core.slot_of(request_id).is_some()
    }

    /// Whether the live request `request_id`'s last step left tokens to
    /// compute (vLLM's `is_prefill_chunk`: such a request takes no drafts);
    /// None for an id without a live request.
    fn is_prefill_chunk(&self, request_id: &str) -> Option<bool> {
        let slot = self.core.slot_of(request_id)?;
        self.core.request(slot).map(|r| r.prefill_chunk)
    }

    /// Waiting requests that hold KV blocks (sessions between turns).
    #[getter]
    fn num_kv_holding(&self) -> usize {
        self.core.num_kv_holding()
    }

    /// Streaming sessions waiting for their next input chunk.
    #[getter]
    fn num_waiting_for_input(&self) -> usize {
        self.core.num_waiting_for_input()
    }

    fn get_num_unfinished_requests(&self) -> usize {
        self.core.num_unfinished_requests()
    }

    /// Everything the two backends must agree on, for differential tests:
    /// the queues, each live request's state by name, and the pool.
    fn debug_state<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        debug_state(py, &self.core)
    }
}

/// Pins and unpins asked for while the scheduler may be busy (see
/// `Scheduler.pin_requests`); block ids are checked when applied.
#[pyclass(name = "PinRequests", module = "ironbatch._core", frozen)]
pub struct PyPinRequests(crate::scheduler::PinRequests);

#[pymethods]
impl PyPinRequests {
    /// Ask for each listed block to be pinned once.
    fn pin(&self, block_ids: &Bound<'_, PyAny>) -> PyResult<()> {
        self.0.pin(u32_list("block_ids", block_ids)?);
        Ok(())
    }

    /// Ask for one pin per listed block to be dropped, in the order given.
    fn unpin(&self, block_ids: &Bound<'_, PyAny>) -> PyResult<()> {
        self.0.unpin(u32_list("block_ids", block_ids)?);
        Ok(())
    }
}
