//! The requests a step's update ends with an error (docs/scheduling.md
//! §4.19): those a failed KV load ends under the "fail" policy, and those
//! the caller names (a grammar that did not compile, an image whose cached
//! encoding holds other content, an encoder output the encoder-cache
//! connector can no longer obtain). vLLM 0.33 ends them all at once, after
//! the step's output and before finished KV transfers settle, in the
//! iteration order of the one Python set it gathers them in; the order
//! decides the free queue, so it is the caller's to give.

use super::kv_load_failure::FailedLoads;
use super::Scheduler;
use crate::request::RequestStatus;
use crate::slab::Slot;
use crate::step::{ErroredRequest, UpdateOutput};

/// The requests an update ends with an error, as each source found them,
/// in its order (a request may be in more than one). A caller in vLLM's
/// process rebuilds vLLM's set from these, and so its order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ErrorGroups {
    /// Loads reported failed whole, in the report's order.
    pub whole: Vec<Slot>,
    /// Loading requests with an invalid block, in queue order.
    pub loading: Vec<Slot>,
    /// Running requests with an invalid block, in running order.
    pub running: Vec<Slot>,
    /// The caller's, still live after the output, in the caller's order.
    pub requested: Vec<Slot>,
}

/// Orders the requests an update ends with an error: a permutation of
/// them; anything else keeps the order found.
pub type EndOrder<'a> = &'a mut dyn FnMut(&ErrorGroups) -> Vec<Slot>;

/// What the caller ends with an error after a step's output, and how the
/// whole error set is ordered.
#[derive(Default)]
pub struct RequestErrors<'a> {
    /// Request ids, in the caller's order; unknown ones and those already
    /// finished (this step's stops among them) are skipped, as vLLM's
    /// `finish_requests` skips them.
    pub request_ids: &'a [String],
    pub order: Option<EndOrder<'a>>,
}

impl RequestErrors<'_> {
    /// No errors of the caller's; failed loads end in the order found.
    pub fn none() -> Self {
        RequestErrors::default()
    }
}

impl Scheduler {
    /// End the failed loads' requests and the caller's with an error, in
    /// one order: found order (failed loads first), or `order`'s.
    pub(super) fn end_with_errors(
        &mut self,
        out: &mut UpdateOutput,
        failed: FailedLoads,
        errors: RequestErrors<'_>,
    ) {
        let FailedLoads {
            ended: mut ends,
            mut groups,
            ..
        } = failed;
        for id in errors.request_ids {
            let Some(&slot) = self.ids.get(id.as_str()) else {
                continue;
            };
            if self.requests[slot].status.is_finished() || groups.requested.contains(&slot) {
                continue;
            }
            groups.requested.push(slot);
            if !ends.contains(&slot) {
                ends.push(slot);
            }
        }
        if ends.is_empty() {
            return;
        }
        if let Some(order) = errors.order {
            let ordered = order(&groups);
            if is_permutation(&ordered, &ends) {
                ends = ordered;
            }
        }
        out.errored = ends
            .iter()
            .map(|&slot| {
                let r = &self.requests[slot];
                ErroredRequest {
                    slot,
                    request_id: r.request_id.clone(),
                    token_ids: r.seq.tokens().to_vec(),
                    num_computed_tokens: r.seq.num_computed_tokens,
                }
            })
            .collect();
        let ids: Vec<&str> = out.errored.iter().map(|e| e.request_id.as_str()).collect();
        self.finish_requests(&ids, RequestStatus::FinishedError);
    }
}

fn is_permutation(a: &[Slot], b: &[Slot]) -> bool {
    a.len() == b.len() && {
        let mut a = a.to_vec();
        let mut b = b.to_vec();
        a.sort_unstable();
        b.sort_unstable();
        a == b
    }
}
