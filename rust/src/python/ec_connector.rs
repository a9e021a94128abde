//! An encoder-cache connector written in Python, as the core calls it
//! (docs/scheduling.md §4.20): an object with `has_cache_item(identifier)`,
//! `ensure_cache_available(request_id, num_computed_tokens)`,
//! `update_state_after_alloc(request_id, input_id)`,
//! `update_state_after_free(request_id, input_id)` and
//! `request_finished(request_id)`.
//!
//! A call that raises goes to `sys.unraisablehook` and counts as the safe
//! answer (compute it here, nothing in transit, no hold): a failing
//! connector costs encoder work, never a stalled request.

use crate::ec_connector::EcConnector;
use pyo3::prelude::*;

#[derive(Debug)]
pub(super) struct PyEcConnector {
    obj: Py<PyAny>,
}

impl PyEcConnector {
    pub(super) fn new(obj: Bound<'_, PyAny>) -> Self {
        Self { obj: obj.unbind() }
    }

    /// `name(*args)`, its answer's truth; `fallback` where it raises.
    fn ask<A: for<'py> pyo3::call::PyCallArgs<'py>>(
        &self,
        name: &str,
        args: A,
        fallback: bool,
    ) -> bool {
        Python::attach(|py| {
            let obj = self.obj.bind(py);
            match obj.call_method1(name, args).and_then(|v| v.is_truthy()) {
                Ok(answer) => answer,
                Err(e) => {
                    e.write_unraisable(py, Some(obj));
                    fallback
                }
            }
        })
    }

    /// `name(*args)`, told, its answer ignored.
    fn tell<A: for<'py> pyo3::call::PyCallArgs<'py>>(&self, name: &str, args: A) {
        Python::attach(|py| {
            let obj = self.obj.bind(py);
            if let Err(e) = obj.call_method1(name, args) {
                e.write_unraisable(py, Some(obj));
            }
        })
    }
}

impl EcConnector for PyEcConnector {
    fn has_cache_item(&mut self, identifier: &str) -> bool {
        self.ask("has_cache_item", (identifier,), false)
    }

    fn ensure_cache_available(&mut self, request_id: &str, num_computed_tokens: i64) -> bool {
        self.ask(
            "ensure_cache_available",
            (request_id, num_computed_tokens),
            true,
        )
    }

    fn update_state_after_alloc(&mut self, request_id: &str, input_id: u32) {
        self.tell("update_state_after_alloc", (request_id, input_id));
    }

    fn update_state_after_free(&mut self, request_id: &str, input_id: u32) {
        self.tell("update_state_after_free", (request_id, input_id));
    }

    fn request_finished(&mut self, request_id: &str) -> bool {
        self.ask("request_finished", (request_id,), false)
    }
}
