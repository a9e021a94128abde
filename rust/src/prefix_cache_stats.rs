//! Prefix-cache counters (docs/scheduling.md §7.10), recorded once per admission.

/// Counters since the last time they were taken.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PrefixCacheStats {
    /// Whether the prefix cache was reset meanwhile.
    pub reset: bool,
    /// Admissions of requests never preempted.
    pub requests: u64,
    /// Tokens those admissions looked up.
    pub queries: u64,
    /// Tokens those admissions found cached.
    pub hits: u64,
    /// Admissions of requests preempted before.
    pub preempted_requests: u64,
    /// Tokens those re-admissions looked up.
    pub preempted_queries: u64,
    /// Tokens those re-admissions found cached.
    pub preempted_hits: u64,
}

impl PrefixCacheStats {
    /// Count one admission of a request with `num_tokens` known tokens, of
    /// which `num_hit_tokens` were prefix-cache hits.
    pub fn record(&mut self, num_tokens: usize, num_hit_tokens: usize, preempted: bool) {
        let (requests, queries, hits) = if preempted {
            (
                &mut self.preempted_requests,
                &mut self.preempted_queries,
                &mut self.preempted_hits,
            )
        } else {
            (&mut self.requests, &mut self.queries, &mut self.hits)
        };
        *requests += 1;
        *queries += num_tokens as u64;
        *hits += num_hit_tokens as u64;
    }
}
