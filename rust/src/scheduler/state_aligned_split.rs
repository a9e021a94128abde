//! Prefill chunks that end where a recurrent state can be cached
//! (docs/scheduling.md §7.15; vLLM's `_mamba_block_aligned_split`). In
//! cache mode "align" a Mamba group keeps the state a chunk ends with, in
//! the block the chunk ends in; for that state to be a block's, the chunk
//! must end on a block boundary. So a prefill chunk is cut back to one,
//! and never runs past the last boundary a later request could resume from
//! or a prefix another request shares. The prompt's last chunk is exempt:
//! the decode steps after it carry its state on to the next boundary.

use super::Scheduler;
use crate::attention_group::checkpoint_in_chunk;
use crate::slab::Slot;

impl Scheduler {
    /// `n` tokens for the request in `slot` from `start` on (its computed
    /// tokens and hits), cut to end where a state can be cached; 0 when no
    /// such end fits. Unchanged past the prefill or outside cache mode
    /// "align".
    pub(super) fn state_aligned_split(&self, slot: Slot, n: usize, start: usize) -> usize {
        if !self.kv.caches_states() {
            return n;
        }
        let r = &self.requests[slot];
        let num_tokens = r.num_tokens();
        // A resumed request replays its output as prefill too.
        let prefill_end = r.seq.num_prompt_tokens().max(num_tokens.saturating_sub(1));
        if start >= prefill_end {
            return n;
        }
        // vLLM cuts at its cache's block size, the least group's: the
        // recurrent groups', which is the hash block (validated).
        let bs = self.kv.hash_block_size();
        let mut end = start + n;
        // A backend that writes the prompt's checkpoint from inside the
        // chunk that ends the prefill needs no stop there. That checkpoint
        // lies where hits land, on the scheduler block.
        let checkpoint = self
            .kv
            .state_checkpoint(prefill_end, self.kv.scheduler_block_size());
        let inside = self.kv.checkpoint_alignment().is_some_and(|alignment| {
            end >= prefill_end && checkpoint_in_chunk(start, end, checkpoint, bs, alignment)
        });
        let last_cacheable = if inside {
            0
        } else {
            self.kv.state_checkpoint(num_tokens, bs)
        };
        if end < prefill_end {
            let c = &self.config;
            let mut most = c.max_num_scheduled_tokens;
            if c.long_prefill_token_threshold > 0 {
                most = most.min(c.long_prefill_token_threshold);
            }
            // Back to a boundary, unless none lies past the start and a
            // block is more than a chunk may ever be (then the chunk runs on
            // privately to the next boundary).
            let aligned = end / bs * bs;
            if aligned > start || bs <= most {
                end = aligned;
            }
        }
        // A chunk that starts inside a block stops at its end.
        let block_end = if start % bs != 0 && !inside {
            (start / bs + 1) * bs
        } else {
            0
        };
        // A shared prefix's end, rounded down by whole blocks from the start.
        let junction = r.seq.shared_prefix_boundary;
        let junction_stop = if start < junction && junction < end {
            start + (junction - start) / bs * bs
        } else {
            0
        };
        let stops = [block_end, last_cacheable, junction_stop];
        let end = stops
            .into_iter()
            .filter(|&s| start < s && s < end)
            .min()
            .unwrap_or(end);
        end.saturating_sub(start)
    }
}
