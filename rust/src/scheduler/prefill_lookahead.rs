//! Multi-module MTP's prefill lookahead (docs/scheduling.md §4.13): at a
//! prefill chunk's end the drafter's modules read the next
//! `drafter_read_ahead` prompt tokens as their inputs, so a chunk never ends
//! closer than that to the prompt's end: it either finishes the prompt or
//! leaves the modules their runway (vLLM's `_reserve_prefill_lookahead`).

use super::Scheduler;
use crate::slab::Slot;

impl Scheduler {
    /// `n` tokens for the request in `slot` from `computed` on, cut so the
    /// chunk does not end within the drafter's read-ahead of the known
    /// tokens' end; 0 when nothing is left to schedule. Only a read-ahead
    /// above 1 can cut (one token ahead always lies in the next chunk).
    pub(super) fn reserve_prefill_lookahead(&self, slot: Slot, computed: usize, n: usize) -> usize {
        let read_ahead = self.config.drafter_read_ahead;
        let end = computed + n;
        let known = self.requests[slot].num_tokens();
        if end < known && known - end < read_ahead {
            n.saturating_sub(read_ahead - (known - end))
        } else {
            n
        }
    }
}
