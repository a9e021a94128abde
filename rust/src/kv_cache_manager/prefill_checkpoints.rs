//! Prefill checkpoints of recurrent states (docs/scheduling.md §7.15): the
//! state a chunk writes from inside itself at the prompt's checkpoint, and
//! each request's latest plan for one, which its caching keys until its
//! next allocation (vLLM's `MambaManager._checkpoints`).

use crate::slab::Slot;

/// A prefill checkpoint a step writes from inside its chunk: the state
/// after `position` tokens, into every recurrent group's block `block`, the
/// one before the block the chunk ends in. The two agree (`block` ends at
/// `position`) when the groups' block sizes do; else `position` is on the
/// scheduler block and `block` where the chunk ends (§7.16).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct StateCheckpoint {
    pub position: usize,
    pub block: usize,
}

/// Per request (by slot), the checkpoint its latest allocation planned.
/// vLLM records it as it counts an allocation's blocks (before it knows
/// they are free) and forgets it at the next count without one; caching
/// between the two (a step's output) keys it. A slot's entry is replaced
/// at its request's first allocation, before any caching, so one left by
/// a request that ended is never read.
#[derive(Clone, Debug, Default)]
pub(crate) struct StateCheckpoints {
    by_slot: Vec<Option<StateCheckpoint>>,
}

impl StateCheckpoints {
    /// Record the plan of the request in `slot` (None: no checkpoint).
    pub(crate) fn set(&mut self, slot: Slot, checkpoint: Option<StateCheckpoint>) {
        let i = slot as usize;
        if i >= self.by_slot.len() {
            if checkpoint.is_none() {
                return;
            }
            self.by_slot.resize(i + 1, None);
        }
        self.by_slot[i] = checkpoint;
    }

    /// The latest plan of the request in `slot`.
    pub(crate) fn get(&self, slot: Slot) -> Option<StateCheckpoint> {
        self.by_slot.get(slot as usize).copied().flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plan_holds_until_the_next_one() {
        let mut plans = StateCheckpoints::default();
        let at = StateCheckpoint {
            position: 96,
            block: 25,
        };
        assert_eq!(plans.get(3), None);
        plans.set(3, Some(at));
        assert_eq!((plans.get(3), plans.get(2)), (Some(at), None));
        plans.set(3, None);
        assert_eq!(plans.get(3), None);
    }
}
