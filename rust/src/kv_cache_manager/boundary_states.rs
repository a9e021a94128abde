//! Boundary states a KV connector can offload (vLLM's
//! `take_boundary_state_offloads`, docs/scheduling.md §4.19.2 rule 7): each
//! state block a recurrent group hash-caches in cache mode "align", with the
//! token boundary its key holds. A state block is no token range a
//! connector could resolve by position (a table's past states go back to
//! the pool), so each is named with its block.

use crate::block::BlockId;
use crate::slab::Slot;

/// One cached state a connector may store: the request in `owner` cached
/// group `group`'s block `block_id` as the state after `num_tokens` tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BoundaryState {
    pub owner: Slot,
    pub group: usize,
    pub block_id: BlockId,
    pub num_tokens: usize,
}

/// The states offered since they were last taken; none are kept unless a
/// connector is attached.
#[derive(Clone, Debug, Default)]
pub struct BoundaryStates {
    offered: Vec<BoundaryState>,
    enabled: bool,
}

impl BoundaryStates {
    /// Keep offers from now on.
    pub fn enable(&mut self) {
        self.enabled = true;
    }

    /// Whether offers are kept.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Offer `state`.
    pub fn offer(&mut self, state: BoundaryState) {
        if self.enabled {
            self.offered.push(state);
        }
    }

    /// The offers so far, oldest first, leaving none.
    pub fn take(&mut self) -> Vec<BoundaryState> {
        std::mem::take(&mut self.offered)
    }

    /// Withdraw the offers of the request in `owner`, whose blocks go back
    /// to the pool before the offers were taken (another request may be
    /// handed those blocks).
    pub fn withdraw(&mut self, owner: Slot) {
        if !self.offered.is_empty() {
            self.offered.retain(|s| s.owner != owner);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(owner: Slot, block_id: BlockId) -> BoundaryState {
        BoundaryState {
            owner,
            group: 0,
            block_id,
            num_tokens: 16,
        }
    }

    #[test]
    fn offers_only_when_enabled_and_withdraws_a_requests_own() {
        let mut states = BoundaryStates::default();
        states.offer(state(1, 5));
        assert!(states.take().is_empty());
        states.enable();
        states.offer(state(1, 5));
        states.offer(state(2, 6));
        states.offer(state(1, 7));
        states.withdraw(1);
        assert_eq!(states.take(), vec![state(2, 6)]);
        assert!(states.take().is_empty());
    }
}
