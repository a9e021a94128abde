//! Blocks pinned from outside the scheduler (docs/scheduling.md §4.19):
//! a KV connector that manages vLLM's GPU block pool itself
//! (SimpleCPUOffload, Mooncake's store, UMBP) takes a reference on blocks
//! while it copies them and drops it when the copy is done (vLLM's
//! `BlockPool.touch` and `free_blocks`). A pinned block is held like any:
//! it leaves the free queue, its request's free does not return it, and
//! a prefix-cache reset is refused while it is pinned. The null block is
//! passed over, as vLLM passes it over.

use super::Scheduler;
use crate::block::{BlockId, NULL_BLOCK};
use crate::error::Error;
use rustc_hash::FxHashMap;
use std::sync::{Arc, Mutex};

/// A handle on which pins and unpins are asked for while the scheduler
/// may be busy: a connector called from inside the scheduler's own work
/// cannot call back into it, so its asks queue here, and the scheduler
/// applies them, in order, right after that call returns (and before its
/// next step or update, for asks made between its calls).
#[derive(Clone, Debug, Default)]
pub struct PinRequests(Arc<Mutex<Vec<PinRequest>>>);

/// One ask.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PinRequest {
    Pin(Vec<BlockId>),
    Unpin(Vec<BlockId>),
}

impl PinRequests {
    /// Ask for `block_ids` to be pinned (as [`Scheduler::pin_blocks`]).
    pub fn pin(&self, block_ids: Vec<BlockId>) {
        self.push(PinRequest::Pin(block_ids));
    }

    /// Ask for `block_ids` to be unpinned (as [`Scheduler::unpin_blocks`]).
    pub fn unpin(&self, block_ids: Vec<BlockId>) {
        self.push(PinRequest::Unpin(block_ids));
    }

    fn push(&self, ask: PinRequest) {
        // A poisoned lock only means a panic elsewhere; the queue is intact.
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(ask);
    }

    fn take(&self) -> Vec<PinRequest> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl Scheduler {
    /// Pin each listed block once (a block listed twice, twice). Checked
    /// first: an id outside the pool changes nothing.
    pub fn pin_blocks(&mut self, block_ids: &[BlockId]) -> Result<(), Error> {
        let ids = not_null(block_ids);
        self.kv.touch_blocks(&ids)?;
        for id in ids {
            *self.pins.entry(id).or_default() += 1;
        }
        Ok(())
    }

    /// Drop one pin per listed block, in the order given: a block that
    /// holds no other reference goes back to the free queue (cached ones to
    /// its tail, in list order). Refused, changing nothing, for a block
    /// listed more often than it is pinned.
    pub fn unpin_blocks(&mut self, block_ids: &[BlockId]) -> Result<(), Error> {
        let ids = not_null(block_ids);
        let mut listed: FxHashMap<BlockId, u32> = FxHashMap::default();
        for (i, &id) in block_ids.iter().enumerate() {
            if id == NULL_BLOCK {
                continue;
            }
            let n = listed.entry(id).or_default();
            *n += 1;
            let pinned = self.pins.get(&id).copied().unwrap_or(0);
            if *n > pinned {
                return Err(Error::invalid(format!(
                    "unpin_blocks: block_ids[{i}] = {id} is pinned {pinned} time(s), \
                     listed {n} time(s)"
                )));
            }
        }
        self.kv.free_touched_blocks(&ids)?;
        for (id, n) in listed {
            let left = self.pins.get_mut(&id).expect("checked above");
            *left -= n;
            if *left == 0 {
                self.pins.remove(&id);
            }
        }
        Ok(())
    }

    /// A handle to ask for pins on from anywhere, the scheduler's own calls
    /// included (see [`PinRequests`]).
    pub fn pin_requests(&self) -> PinRequests {
        self.pin_requests.clone()
    }

    /// Apply the asks queued on [`PinRequests`], in order. One that is
    /// refused changes nothing and is kept for [`Self::take_pin_errors`]:
    /// a connector's bad ask never stops a step.
    pub(super) fn apply_pin_requests(&mut self) {
        for ask in self.pin_requests.take() {
            let done = match &ask {
                PinRequest::Pin(ids) => self.pin_blocks(ids),
                PinRequest::Unpin(ids) => self.unpin_blocks(ids),
            };
            if let Err(e) = done {
                self.pin_errors.push(e);
            }
        }
    }

    /// The queued asks refused since the last call, oldest first.
    pub fn take_pin_errors(&mut self) -> Vec<Error> {
        std::mem::take(&mut self.pin_errors)
    }

    /// Each pinned block and its pins, by block id.
    pub fn pinned_blocks(&self) -> Vec<(BlockId, u32)> {
        let mut pins: Vec<(BlockId, u32)> = self.pins.iter().map(|(&b, &n)| (b, n)).collect();
        pins.sort_unstable();
        pins
    }
}

/// `ids` without the null block, which vLLM's pool passes over.
fn not_null(ids: &[BlockId]) -> Vec<BlockId> {
    ids.iter().copied().filter(|&b| b != NULL_BLOCK).collect()
}

#[cfg(test)]
mod tests {
    use crate::scheduler::tests::{new_request, scheduler, Setup};

    fn small() -> Setup {
        Setup {
            num_blocks: 8,
            ..Setup::default()
        }
    }

    #[test]
    fn a_pinned_block_stays_out_of_the_free_queue_until_unpinned() {
        // A 20-token prompt in blocks of 16 ends after one token: its full,
        // cached first block would go back to the queue's tail; pinned, it
        // stays held until the pin goes, then goes there.
        let mut s = scheduler(small());
        s.add_request(new_request("r", (1..=20).collect(), 1))
            .unwrap();
        let out = s.schedule();
        let table = &s.request(out.entries[0].slot).unwrap().tables[0];
        let (cached, tail) = (table.block_ids()[0], table.block_ids()[1]);
        s.pin_blocks(&[cached, 0]).unwrap();
        s.update_from_output(&out, &[7], &[0, 1]).unwrap();
        let free: Vec<_> = s.kv().pool().free_block_ids().collect();
        assert_eq!(free.first(), Some(&tail), "the unhashed block, to the head");
        assert!(!free.contains(&cached));
        assert!(!s.reset_prefix_cache(false), "a pinned block is held");
        assert_eq!(s.pinned_blocks(), vec![(cached, 1)]);
        let err = s.unpin_blocks(&[cached, cached]).unwrap_err();
        assert!(err.to_string().contains("pinned 1 time(s), listed 2"));
        assert_eq!(s.pinned_blocks(), vec![(cached, 1)], "refused: unchanged");
        s.unpin_blocks(&[cached]).unwrap();
        assert_eq!(s.kv().pool().free_block_ids().last(), Some(cached));
        assert!(s.pinned_blocks().is_empty());
        assert!(s.reset_prefix_cache(false));
    }

    #[test]
    fn pins_are_checked_before_anything_changes() {
        let mut s = scheduler(small());
        let free = s.kv().pool().num_free_blocks();
        assert!(s.pin_blocks(&[1, 8]).is_err());
        assert!(s.unpin_blocks(&[1]).is_err());
        assert_eq!(s.kv().pool().num_free_blocks(), free);
        assert!(s.pinned_blocks().is_empty());
    }

    #[test]
    fn a_connector_pins_from_inside_its_calls_and_they_apply_at_once() {
        // The connector pins a request's blocks as it is told of them
        // (inside the waiting pass): its abort then leaves them held, and
        // the unpin asked between calls applies at the next step; a bad
        // ask is kept as an error and the step goes on.
        use crate::kv_connector::scripted::Scripted;
        use crate::kv_connector::KvConnectorSetup;
        let mut s = scheduler(small());
        let mut c = Scripted::default();
        let pins = s.pin_requests();
        c.pins = Some(pins.clone());
        s.set_kv_connector(Box::new(c), KvConnectorSetup::default())
            .unwrap();
        s.add_request(new_request("r", (1..=20).collect(), 4))
            .unwrap();
        let free = s.kv().pool().num_free_blocks();
        let out = s.schedule();
        let blocks = s.request(out.entries[0].slot).unwrap().tables[0]
            .block_ids()
            .to_vec();
        assert_eq!(s.pinned_blocks(), vec![(blocks[0], 1), (blocks[1], 1)]);
        s.finish_requests(&["r"], crate::request::RequestStatus::FinishedAborted);
        assert_eq!(s.kv().pool().num_free_blocks(), free - 2, "held by pins");
        pins.unpin(vec![blocks[1], blocks[0]]);
        pins.unpin(vec![blocks[0]]); // one too many: refused
        assert_eq!(
            s.kv().pool().num_free_blocks(),
            free - 2,
            "asked, not yet applied"
        );
        s.schedule();
        assert_eq!(s.kv().pool().num_free_blocks(), free);
        assert!(s.pinned_blocks().is_empty());
        let errors = s.take_pin_errors();
        assert_eq!(errors.len(), 1);
        assert!(errors[0].to_string().contains("pinned 0 time(s)"));
    }
}
