//! The scheduler's side of a KV connector (docs/scheduling.md §4.19): what
//! the scheduler asks a connector and tells it. The connector itself lives
//! outside the core (vLLM's, or a caller's, behind the Python binding); the
//! core calls it at the points vLLM 0.33's scheduler does, in its order.

use crate::block::BlockId;

/// A connector's answer to "how many tokens past the local hit can you
/// supply?".
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct ExternalHit {
    /// Tokens past the local hit the connector supplies.
    pub num_tokens: usize,
    /// They arrive over later steps (the request waits for them), not in
    /// the step that schedules it.
    pub load_async: bool,
}

impl ExternalHit {
    pub const NONE: ExternalHit = ExternalHit {
        num_tokens: 0,
        load_async: false,
    };

    /// Whether the answer keeps the contract for a request of `num_tokens`
    /// with `num_local` tokens hit locally: never past its tokens, an async
    /// load brings at least one, a synchronous one leaves one to compute.
    /// (vLLM asserts these; the core counts a broken answer as "ask again
    /// later", so one bad connector answer stalls only its request.)
    pub fn fits(self, num_tokens: usize, num_local: usize) -> bool {
        let left = num_tokens.saturating_sub(num_local);
        if self.load_async {
            self.num_tokens >= 1 && self.num_tokens <= left
        } else {
            self.num_tokens == 0 || self.num_tokens < left
        }
    }
}

/// What becomes of a request whose KV load failed (vLLM's
/// `kv_load_failure_policy`).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub enum LoadFailurePolicy {
    /// It ends with an error (vLLM's default).
    #[default]
    Fail,
    /// It computes the tokens that did not arrive.
    Recompute,
}

impl LoadFailurePolicy {
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "fail" => Some(Self::Fail),
            "recompute" => Some(Self::Recompute),
            _ => None,
        }
    }
}

/// How the scheduler works with its connector: vLLM's settings, which it
/// derives from the deployment's `kv_transfer_config`.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct KvConnectorSetup {
    pub load_failure_policy: LoadFailurePolicy,
    /// Blocks freed while a step in flight may still write them wait until
    /// that step's output is back (vLLM's `defer_block_free`: a consumer
    /// role with more than one step in flight, where a load into reused
    /// blocks is not ordered against that write).
    pub defer_block_free: bool,
    /// A preempted request's output in flight is dropped, not delivered
    /// (the connector's `requires_kv_delivery`).
    pub requires_kv_delivery: bool,
    /// It completes a hybrid's divergent local hits (the connector's
    /// `supports_divergent_local_hybrid_hits`): beside cached recurrent
    /// states it is told full attention's own hit (§4.19.2).
    pub divergent_hybrid_hits: bool,
}

/// The worker's report of a step's KV transfers (vLLM's
/// `KVConnectorOutput`, the parts the scheduler reads).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KvTransferReport {
    /// Loads done (or, for a request that finished meanwhile, over).
    pub finished_recving: Vec<String>,
    /// Sends done: the requests' held blocks may go.
    pub finished_sending: Vec<String>,
    /// Loads that failed whole.
    pub failed_recving: Vec<String>,
    /// Blocks whose load failed.
    pub invalid_block_ids: Vec<BlockId>,
}

impl KvTransferReport {
    pub fn is_empty(&self) -> bool {
        self.finished_recving.is_empty()
            && self.finished_sending.is_empty()
            && self.failed_recving.is_empty()
            && self.invalid_block_ids.is_empty()
    }
}

/// A request as vLLM's scheduler holds it at the moment of a connector
/// call: what a connector reading vLLM's `Request` and `KVCacheBlocks`
/// would see (its tokens, its computed count and status before the call's
/// admission changes them, and which of its blocks hold cached KV, i.e.
/// have a block hash).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct RequestState<'a> {
    pub request_id: &'a str,
    pub token_ids: &'a [u32],
    pub num_computed_tokens: usize,
    /// The status's name, as vLLM spells it.
    pub status: &'static str,
    /// Per KV-cache group, the positions in its table whose block has a
    /// block hash (a window's nulls have none).
    pub cached_blocks: &'a [Vec<u32>],
}

/// The scheduler's calls into a KV connector.
pub trait KvConnector: std::fmt::Debug + Send + Sync {
    /// The request the next call names, as vLLM's scheduler holds it then.
    /// A connector that reads only ids and counts ignores it (the default);
    /// the vLLM drop-in brings vLLM's `Request` up to date from it.
    fn observe_request(&mut self, _request: &RequestState<'_>) {}

    /// The external hit of `request_id` (`num_tokens` tokens, the first
    /// `num_computed_tokens` hit locally, block-aligned); `None`: it cannot
    /// tell yet, ask again in a later step.
    fn get_num_new_matched_tokens(
        &mut self,
        request_id: &str,
        num_tokens: usize,
        num_computed_tokens: usize,
    ) -> Option<ExternalHit>;

    /// The request's blocks (per KV-cache group) after an admission's
    /// allocation, with the external tokens it will load into them.
    fn update_state_after_alloc(
        &mut self,
        request_id: &str,
        block_ids: &[Vec<BlockId>],
        num_external_tokens: usize,
    );

    /// A finished request (`status`: its finished status, as vLLM spells
    /// it) and its blocks up to its computed tokens; true holds the blocks
    /// until the connector reports the request's send done.
    fn request_finished(
        &mut self,
        request_id: &str,
        block_ids: &[Vec<BlockId>],
        status: &str,
    ) -> bool;

    /// The KV-cache groups (of `num_groups`) an asynchronous load of
    /// `request_id` writes (vLLM's `get_loaded_kv_cache_group_ids`): their
    /// blocks for the external tokens are not listed for zeroing, which
    /// would race the load. Every group by default.
    fn loaded_groups(&mut self, _request_id: &str, num_groups: usize) -> Vec<usize> {
        (0..num_groups).collect()
    }

    /// Whether blocks are about to come back (then a request that cannot
    /// grow waits instead of preempting).
    fn has_pending_block_frees(&mut self) -> bool {
        false
    }

    /// The local hit of `request_id` found again after the connector
    /// answered no tokens for a divergent hybrid hit (§4.19.2): the
    /// request takes `num_computed_tokens`, fewer than it was asked with.
    /// (vLLM's scheduler counts its stats from this hit.)
    fn local_hit_reconciled(&mut self, _request_id: &str, _num_computed_tokens: usize) {}

    /// The external hit `request_id`'s admission takes, as it stands once
    /// routed experts capped it (§7.12) and no encoder output it needs is
    /// still in transit (§4.20): where vLLM's scheduler sets the request's
    /// load stage.
    fn external_hit_settled(&mut self, _request_id: &str, _hit: ExternalHit) {}
}

#[cfg(test)]
pub(crate) mod scripted {
    //! A connector for unit tests: fixed answers by request id, a log of
    //! every call.
    use super::{ExternalHit, KvConnector, RequestState};
    use crate::block::BlockId;
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};

    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum Call {
        Matched(String, usize, usize),
        AfterAlloc(String, Vec<Vec<BlockId>>, usize),
        Finished(String, Vec<Vec<BlockId>>, String),
    }

    #[derive(Debug, Default)]
    pub struct Scripted {
        pub answers: HashMap<String, Option<ExternalHit>>,
        /// Request ids whose blocks are held after a normal finish.
        pub holds: Vec<String>,
        pub log: Arc<Mutex<Vec<Call>>>,
        pub observed: Arc<Mutex<Vec<Observed>>>,
        /// Where to pin each admitted request's blocks, as a connector
        /// that copies them out does (none: no pins).
        pub pins: Option<crate::scheduler::PinRequests>,
    }

    /// One `observe_request`: the request as the next call names it.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct Observed {
        pub request_id: String,
        pub num_tokens: usize,
        pub num_computed_tokens: usize,
        pub status: &'static str,
        pub num_cached_blocks: usize,
    }

    impl KvConnector for Scripted {
        fn observe_request(&mut self, r: &RequestState<'_>) {
            self.observed.lock().unwrap().push(Observed {
                request_id: r.request_id.into(),
                num_tokens: r.token_ids.len(),
                num_computed_tokens: r.num_computed_tokens,
                status: r.status,
                num_cached_blocks: r.cached_blocks.first().map_or(0, Vec::len),
            });
        }

        fn get_num_new_matched_tokens(
            &mut self,
            request_id: &str,
            num_tokens: usize,
            num_computed_tokens: usize,
        ) -> Option<ExternalHit> {
            self.log.lock().unwrap().push(Call::Matched(
                request_id.into(),
                num_tokens,
                num_computed_tokens,
            ));
            self.answers
                .get(request_id)
                .copied()
                .unwrap_or(Some(ExternalHit::NONE))
        }

        fn update_state_after_alloc(
            &mut self,
            request_id: &str,
            block_ids: &[Vec<BlockId>],
            num_external_tokens: usize,
        ) {
            self.log.lock().unwrap().push(Call::AfterAlloc(
                request_id.into(),
                block_ids.to_vec(),
                num_external_tokens,
            ));
            if let Some(pins) = &self.pins {
                pins.pin(block_ids.concat());
            }
        }

        fn request_finished(
            &mut self,
            request_id: &str,
            block_ids: &[Vec<BlockId>],
            status: &str,
        ) -> bool {
            self.log.lock().unwrap().push(Call::Finished(
                request_id.into(),
                block_ids.to_vec(),
                status.into(),
            ));
            self.holds.iter().any(|h| h == request_id)
        }
    }
}
