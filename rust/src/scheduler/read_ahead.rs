//! Reading ahead before a pass over requests (docs/architecture.md, "Read
//! ahead before a pass"): after another scheduler's step a request's lines
//! are in L3 or DRAM, and a pass whose iterations run hundreds of
//! instructions takes those misses one request at a time. A loop that
//! only reads, with no dependencies between its iterations, lets the CPU
//! keep many misses in flight; the pass then finds the lines cached.

use super::Scheduler;
use crate::request::Request;
use crate::slab::Slot;

impl Scheduler {
    /// Read `read(request)` for each live request among `slots` (generic, so
    /// the read is inlined into the loop).
    pub(super) fn read_ahead(
        &self,
        slots: impl Iterator<Item = Slot>,
        read: impl Fn(&Request) -> usize,
    ) {
        let mut sum = 0usize;
        for slot in slots {
            if let Some(r) = self.requests.get(slot) {
                sum = sum.wrapping_add(read(r));
            }
        }
        std::hint::black_box(sum);
    }
}
