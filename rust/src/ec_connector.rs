//! The scheduler's side of an encoder-cache connector (docs/scheduling.md
//! §4.20): what vLLM 0.33's scheduler asks a connector that moves encoder
//! outputs between instances (encoder/prefill/decode disaggregation) and
//! tells it. The connector itself lives outside the core (vLLM's, or a
//! caller's, behind the Python binding); the core calls it at the points
//! vLLM's scheduler does, in its order. What only the caller needs (the
//! connector's metadata for the workers, its report, the requests it can
//! no longer serve, its stats) stays with the caller.

/// The scheduler's calls into an encoder-cache connector, by request id and
/// index into the request's encoder inputs.
pub trait EcConnector: std::fmt::Debug + Send + Sync {
    /// Whether the connector can supply the encoder output of `identifier`:
    /// then the step loads it into the encoder cache instead of running the
    /// encoder (it takes cache space, not encoder budget).
    fn has_cache_item(&mut self, identifier: &str) -> bool;

    /// Whether the encoder outputs the request needs past
    /// `num_computed_tokens` are there (a connector may start fetching them
    /// now); false: some are still in transit, and the request waits a step.
    /// Signed, as vLLM passes it: for a running request it is the computed
    /// tokens less those in flight, which a failed load's cut-back can take
    /// below zero.
    fn ensure_cache_available(&mut self, request_id: &str, num_computed_tokens: i64) -> bool;

    /// Cache space was taken for the request's input `input_id` this step
    /// (run by the encoder, or loaded by the connector).
    fn update_state_after_alloc(&mut self, request_id: &str, input_id: u32);

    /// The request no longer needs its input `input_id` (its placeholders
    /// are computed).
    fn update_state_after_free(&mut self, request_id: &str, input_id: u32);

    /// The request finished; true holds its KV blocks until a KV
    /// connector's report names its send done (as vLLM ORs the two holds).
    fn request_finished(&mut self, request_id: &str) -> bool;
}

#[cfg(test)]
pub(crate) mod scripted {
    //! An encoder-cache connector for unit tests: fixed answers, a log of
    //! every call.

    use super::EcConnector;
    use std::collections::{HashMap, HashSet};
    use std::sync::{Arc, Mutex};

    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum EcCall {
        HasItem(String),
        Ensure(String, i64),
        Alloc(String, u32),
        Free(String, u32),
        Finished(String),
    }

    #[derive(Debug, Default)]
    pub struct ScriptedEc {
        /// Identifiers the connector holds.
        pub items: HashSet<String>,
        /// Requests whose inputs are in transit, and for how many more asks
        /// (shared, so a test can set it after attaching the connector).
        pub in_transit: Arc<Mutex<HashMap<String, usize>>>,
        pub log: Arc<Mutex<Vec<EcCall>>>,
    }

    impl EcConnector for ScriptedEc {
        fn has_cache_item(&mut self, identifier: &str) -> bool {
            self.log
                .lock()
                .unwrap()
                .push(EcCall::HasItem(identifier.into()));
            self.items.contains(identifier)
        }

        fn ensure_cache_available(&mut self, request_id: &str, num_computed_tokens: i64) -> bool {
            self.log
                .lock()
                .unwrap()
                .push(EcCall::Ensure(request_id.into(), num_computed_tokens));
            match self.in_transit.lock().unwrap().get_mut(request_id) {
                Some(left) if *left > 0 => {
                    *left -= 1;
                    false
                }
                _ => true,
            }
        }

        fn update_state_after_alloc(&mut self, request_id: &str, input_id: u32) {
            self.log
                .lock()
                .unwrap()
                .push(EcCall::Alloc(request_id.into(), input_id));
        }

        fn update_state_after_free(&mut self, request_id: &str, input_id: u32) {
            self.log
                .lock()
                .unwrap()
                .push(EcCall::Free(request_id.into(), input_id));
        }

        fn request_finished(&mut self, request_id: &str) -> bool {
            self.log
                .lock()
                .unwrap()
                .push(EcCall::Finished(request_id.into()));
            false
        }
    }
}
