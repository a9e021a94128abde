//! PyO3 bindings: the `ironbatch._core` extension module. Every argument is
//! converted and checked here or in the core before any state changes, and
//! bad input raises `ValueError`/`TypeError` naming the field and value.

mod args;
mod block_pool;
mod debug_state;
mod ec_connector;
mod errors;
mod kv_cache_manager;
mod kv_connector;
mod kv_events;
mod prefix_cache_stats;
mod request_extras;
mod scheduler;
mod simulate;
mod step;
mod vllm;
mod vllm_objects;
mod vllm_step_rows;
mod vllm_step_update;

use pyo3::prelude::*;

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    // One set of size limits for the core, the Python API and the twin.
    let limits = pyo3::types::PyDict::new(m.py());
    for (field, max) in crate::limits::ALL {
        limits.set_item(field, max)?;
    }
    m.add("LIMITS", limits)?;
    m.add_class::<block_pool::PyBlockPool>()?;
    m.add_class::<kv_cache_manager::PyKvCacheManager>()?;
    m.add_class::<prefix_cache_stats::PyPrefixCacheStats>()?;
    m.add_class::<scheduler::PyScheduler>()?;
    m.add_class::<scheduler::PyPinRequests>()?;
    m.add_class::<step::PyStep>()?;
    m.add_class::<step::PyStepUpdate>()?;
    m.add_class::<step::PyFinishedRequest>()?;
    m.add_class::<step::PySchedulerStats>()?;
    m.add_class::<step::PySpecDecodingStats>()?;
    m.add_class::<kv_events::PyKvEvent>()?;
    m.add_class::<vllm_objects::PyVllmObjects>()?;
    m.add_class::<vllm_step_rows::PyVllmStepRows>()?;
    m.add_class::<vllm_step_update::PyVllmStepUpdate>()?;
    m.add_class::<vllm_step_update::PyErroredRequest>()?;
    // The step's columns and their NumPy dtypes, named once (rust/src/step.rs).
    let columns = pyo3::types::PyDict::new(m.py());
    for (name, dtype) in crate::step::StepColumns::DTYPES {
        columns.set_item(name, dtype)?;
    }
    m.add("STEP_COLUMNS", columns)?;
    m.add_class::<simulate::PySimWorkload>()?;
    m.add_class::<simulate::PyStepTimeModel>()?;
    m.add_function(wrap_pyfunction!(simulate::simulate, m)?)?;
    m.add_function(wrap_pyfunction!(vllm::vllm_update_from_runner_output, m)?)?;
    m.add_function(wrap_pyfunction!(vllm::vllm_request_state, m)?)?;
    m.add_function(wrap_pyfunction!(vllm::vllm_request_tail, m)?)?;
    m.add_function(wrap_pyfunction!(vllm::vllm_shared_prefix_boundary, m)?)?;
    m.add_function(wrap_pyfunction!(vllm::vllm_block_ids, m)?)?;
    m.add_function(wrap_pyfunction!(vllm::vllm_confirmed_tokens, m)?)?;
    m.add_function(wrap_pyfunction!(vllm::vllm_encoder_cache_state, m)?)?;
    Ok(())
}
