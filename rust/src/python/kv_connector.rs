//! A KV connector written in Python, as the core calls it (docs/scheduling.md
//! §4.19): an object with `get_num_new_matched_tokens(request_id,
//! num_tokens, num_computed_tokens)`, `update_state_after_alloc(request_id,
//! block_ids, num_external_tokens)`, `request_finished(request_id,
//! block_ids, status)` and optionally `has_pending_block_frees()`,
//! `observe_request(request_id, token_ids, num_computed_tokens, status,
//! cached_blocks)` (per KV-cache group, the table positions whose block has
//! a hash), called before each call that names a request, and
//! `local_hit_reconciled(request_id, num_computed_tokens)` and
//! `external_hit_settled(request_id, num_tokens, load_async)`.
//!
//! A call that raises, or answers with the wrong shape, goes to
//! `sys.unraisablehook` and counts as the safe answer (ask again later, no
//! hold, no pending frees): a failing connector stalls its own requests,
//! never a step.

use crate::block::BlockId;
use crate::kv_connector::{ExternalHit, KvConnector, KvTransferReport, RequestState};
use crate::scheduler::ErrorGroups;
use crate::slab::Slot;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyString;

#[derive(Debug)]
pub(super) struct PyKvConnector {
    obj: Py<PyAny>,
    /// It has `observe_request` (looked up once: it is called often).
    observes: bool,
    /// It has `local_hit_reconciled` (optional, looked up once).
    hears_reconciled: bool,
    /// It has `external_hit_settled` (optional, looked up once).
    hears_settled: bool,
}

impl PyKvConnector {
    pub(super) fn new(obj: Bound<'_, PyAny>) -> PyResult<Self> {
        let observes = obj.hasattr("observe_request")?;
        let hears_reconciled = obj.hasattr("local_hit_reconciled")?;
        let hears_settled = obj.hasattr("external_hit_settled")?;
        Ok(Self {
            obj: obj.unbind(),
            observes,
            hears_reconciled,
            hears_settled,
        })
    }

    fn call<T, A: for<'py> pyo3::call::PyCallArgs<'py>>(
        &self,
        name: &str,
        args: A,
        read: impl FnOnce(&Bound<'_, PyAny>) -> PyResult<T>,
        fallback: T,
    ) -> T {
        Python::attach(|py| {
            let obj = self.obj.bind(py);
            match obj.call_method1(name, args).and_then(|v| read(&v)) {
                Ok(value) => value,
                Err(e) => {
                    e.write_unraisable(py, Some(obj));
                    fallback
                }
            }
        })
    }
}

impl KvConnector for PyKvConnector {
    fn observe_request(&mut self, r: &RequestState<'_>) {
        if self.observes {
            let args = (
                r.request_id,
                r.token_ids.to_vec(),
                r.num_computed_tokens,
                r.status,
                r.cached_blocks.to_vec(),
            );
            self.call("observe_request", args, |_| Ok(()), ());
        }
    }

    fn get_num_new_matched_tokens(
        &mut self,
        request_id: &str,
        num_tokens: usize,
        num_computed_tokens: usize,
    ) -> Option<ExternalHit> {
        let read = |v: &Bound<'_, PyAny>| {
            let (n, load_async): (Option<usize>, bool) = v.extract()?;
            Ok(n.map(|num_tokens| ExternalHit {
                num_tokens,
                load_async,
            }))
        };
        let args = (request_id, num_tokens, num_computed_tokens);
        self.call("get_num_new_matched_tokens", args, read, None)
    }

    fn update_state_after_alloc(
        &mut self,
        request_id: &str,
        block_ids: &[Vec<BlockId>],
        num_external_tokens: usize,
    ) {
        let args = (request_id, block_ids.to_vec(), num_external_tokens);
        self.call("update_state_after_alloc", args, |_| Ok(()), ());
    }

    fn local_hit_reconciled(&mut self, request_id: &str, num_computed_tokens: usize) {
        if self.hears_reconciled {
            let args = (request_id, num_computed_tokens);
            self.call("local_hit_reconciled", args, |_| Ok(()), ());
        }
    }

    fn external_hit_settled(&mut self, request_id: &str, hit: ExternalHit) {
        if self.hears_settled {
            let args = (request_id, hit.num_tokens, hit.load_async);
            self.call("external_hit_settled", args, |_| Ok(()), ());
        }
    }

    fn request_finished(
        &mut self,
        request_id: &str,
        block_ids: &[Vec<BlockId>],
        status: &str,
    ) -> bool {
        let args = (request_id, block_ids.to_vec(), status);
        self.call("request_finished", args, |v| v.is_truthy(), false)
    }

    fn loaded_groups(&mut self, request_id: &str, num_groups: usize) -> Vec<usize> {
        let every = (0..num_groups).collect::<Vec<_>>();
        let asks = Python::attach(|py| {
            let obj = self.obj.bind(py);
            obj.hasattr("get_loaded_kv_cache_group_ids")
                .unwrap_or(false)
        });
        if !asks {
            return every;
        }
        // Ints >= 0 only, as the twin reads them (a bool is refused, and
        // the safe answer stands).
        let read = |v: &Bound<'_, PyAny>| {
            let mut groups = Vec::new();
            for item in v.try_iter()? {
                let item = item?;
                if item.is_instance_of::<pyo3::types::PyBool>() {
                    return Err(pyo3::exceptions::PyTypeError::new_err(
                        "group ids must be ints >= 0, got a bool",
                    ));
                }
                groups.push(item.extract::<usize>()?);
            }
            Ok(groups)
        };
        self.call("get_loaded_kv_cache_group_ids", (request_id,), read, every)
    }

    fn has_pending_block_frees(&mut self) -> bool {
        Python::attach(|py| {
            let obj = self.obj.bind(py);
            if !obj.hasattr("has_pending_block_frees").unwrap_or(false) {
                return false;
            }
            match obj
                .call_method0("has_pending_block_frees")
                .and_then(|v| v.is_truthy())
            {
                Ok(pending) => pending,
                Err(e) => {
                    e.write_unraisable(py, Some(obj));
                    false
                }
            }
        })
    }
}

/// The worker's report of a step's KV transfers, read from any object with
/// vLLM's `KVConnectorOutput` attributes (`finished_recving`,
/// `finished_sending`, `failed_recving`, `invalid_block_ids`; absent or
/// `None`: empty), each iterated in its own order.
fn kv_report(obj: Option<&Bound<'_, PyAny>>) -> PyResult<KvTransferReport> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(KvTransferReport::default());
    };
    let field = |name: &str| -> PyResult<Option<Bound<'_, PyAny>>> {
        match obj.getattr_opt(name)? {
            Some(v) if !v.is_none() => Ok(Some(v)),
            _ => Ok(None),
        }
    };
    let ids = |name: &str| -> PyResult<Vec<String>> {
        let Some(v) = field(name)? else {
            return Ok(Vec::new());
        };
        if v.is_instance_of::<pyo3::types::PyString>() {
            return Err(PyTypeError::new_err(format!(
                "kv_connector_output.{name} must be a collection of request ids, got str"
            )));
        }
        v.try_iter()?
            .map(|id| {
                id?.extract::<String>().map_err(|_| {
                    PyTypeError::new_err(format!("kv_connector_output.{name} must hold str"))
                })
            })
            .collect()
    };
    let invalid_block_ids = match field("invalid_block_ids")? {
        None => Vec::new(),
        Some(v) => v
            .try_iter()?
            .map(|b| {
                let b = b?;
                b.extract::<BlockId>().map_err(|_| {
                    PyValueError::new_err(format!(
                        "kv_connector_output.invalid_block_ids: {b} is not a block id"
                    ))
                })
            })
            .collect::<PyResult<_>>()?,
    };
    Ok(KvTransferReport {
        finished_recving: ids("finished_recving")?,
        finished_sending: ids("finished_sending")?,
        failed_recving: ids("failed_recving")?,
        invalid_block_ids,
    })
}

/// What a caller reports of a step besides its tokens: the worker's
/// report of its KV transfers, the requests to end with an error after it
/// (`errors`: a grammar that did not compile, an encoder mismatch, an
/// encoder output gone), and how the whole error set is ordered:
/// `end_order(whole, loading, running, requested)` takes each source's
/// request ids and returns them all, once each, in the order to end them
/// (the vLLM drop-in's: vLLM's set's).
pub(super) struct StepReport<'a, 'py> {
    pub(super) report: KvTransferReport,
    pub(super) errors: Vec<String>,
    pub(super) end_order: Option<&'a Bound<'py, PyAny>>,
}

impl<'a, 'py> StepReport<'a, 'py> {
    /// Read from a call's keyword arguments, checked.
    pub(super) fn of(
        kv_connector_output: Option<&Bound<'py, PyAny>>,
        errors: Option<&Bound<'py, PyAny>>,
        end_order: Option<&'a Bound<'py, PyAny>>,
    ) -> PyResult<Self> {
        if let Some(f) = end_order {
            if !f.is_callable() {
                return Err(PyTypeError::new_err(format!(
                    "end_order must be callable, got {}",
                    f.get_type().name()?
                )));
            }
        }
        Ok(StepReport {
            report: kv_report(kv_connector_output)?,
            errors: error_ids(errors)?,
            end_order,
        })
    }

    pub(super) fn none() -> Self {
        StepReport {
            report: KvTransferReport::default(),
            errors: Vec::new(),
            end_order: None,
        }
    }
}

/// `errors` as request ids: a collection of str (a str alone is refused,
/// not read as its characters).
fn error_ids(errors: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<String>> {
    let Some(errors) = errors else {
        return Ok(Vec::new());
    };
    if errors.is_instance_of::<PyString>() {
        return Err(PyTypeError::new_err(
            "errors must be a collection of request ids, got str",
        ));
    }
    let not_ids = || {
        PyTypeError::new_err(format!(
            "errors must be a collection of request ids (str), got {}",
            errors
                .get_type()
                .name()
                .map_or("?".into(), |n| n.to_string())
        ))
    };
    errors
        .try_iter()
        .map_err(|_| not_ids())?
        .map(|id| id?.extract::<String>().map_err(|_| not_ids()))
        .collect()
}

/// `groups` in the order `end_order` gives (ids read through `id_of`); an
/// answer that raises or is not the same ids goes to `sys.unraisablehook`,
/// and the order found stands.
pub(super) fn order_errors(
    end_order: &Bound<'_, PyAny>,
    groups: &ErrorGroups,
    id_of: impl Fn(Slot) -> Py<PyAny>,
) -> Vec<Slot> {
    let py = end_order.py();
    let ids = |slots: &[Slot]| slots.iter().map(|&s| id_of(s)).collect::<Vec<_>>();
    let by_id = |id: &Bound<'_, PyAny>| -> PyResult<Slot> {
        let all = groups
            .whole
            .iter()
            .chain(&groups.loading)
            .chain(&groups.running)
            .chain(&groups.requested);
        for &slot in all {
            if id_of(slot).bind(py).eq(id)? {
                return Ok(slot);
            }
        }
        Err(PyValueError::new_err(format!(
            "end_order gave {id}, which is not ending with an error"
        )))
    };
    let answer = end_order
        .call1((
            ids(&groups.whole),
            ids(&groups.loading),
            ids(&groups.running),
            ids(&groups.requested),
        ))
        .and_then(|order| order.try_iter()?.map(|id| by_id(&id?)).collect());
    answer.unwrap_or_else(|e| {
        e.write_unraisable(py, Some(end_order));
        Vec::new() // not a permutation: the order found stands
    })
}
