//! `PrefixCacheStats` as a frozen Python object.

use crate::prefix_cache_stats::PrefixCacheStats;
use pyo3::prelude::*;

/// Prefix-cache counters since they were last taken (docs/scheduling.md §7.10).
#[pyclass(
    name = "PrefixCacheStats",
    module = "ironbatch._core",
    frozen,
    get_all,
    eq
)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PyPrefixCacheStats {
    reset: bool,
    requests: u64,
    queries: u64,
    hits: u64,
    preempted_requests: u64,
    preempted_queries: u64,
    preempted_hits: u64,
}

impl From<PrefixCacheStats> for PyPrefixCacheStats {
    fn from(s: PrefixCacheStats) -> Self {
        PyPrefixCacheStats {
            reset: s.reset,
            requests: s.requests,
            queries: s.queries,
            hits: s.hits,
            preempted_requests: s.preempted_requests,
            preempted_queries: s.preempted_queries,
            preempted_hits: s.preempted_hits,
        }
    }
}

#[pymethods]
impl PyPrefixCacheStats {
    fn __repr__(&self) -> String {
        format!(
            "PrefixCacheStats(reset={}, requests={}, queries={}, hits={}, \
             preempted_requests={}, preempted_queries={}, preempted_hits={})",
            if self.reset { "True" } else { "False" },
            self.requests,
            self.queries,
            self.hits,
            self.preempted_requests,
            self.preempted_queries,
            self.preempted_hits
        )
    }
}
