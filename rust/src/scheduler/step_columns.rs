//! The end of a step (docs/scheduling.md §4.7): the decisions become the
//! model runner's columns, and every scheduled request is advanced as if
//! the step had already run.

use super::Scheduler;
use crate::spec_decode::Drafts;
use crate::step::{Kind, StepEntry, StepOutput};

impl Scheduler {
    /// Write the columns of `entries` and advance every scheduled request
    /// (optimistically, before the step runs).
    pub(super) fn finish_step(&mut self, mut entries: Vec<StepEntry>) -> StepOutput {
        debug_assert!(
            entries.iter().map(|e| e.num_tokens).sum::<usize>()
                <= self.config.max_num_batched_tokens
        );
        debug_assert!(self.running.len() <= self.config.max_num_seqs);
        let fenced = self.kv_setup.defer_block_free && entries.iter().any(|e| e.num_tokens > 0);
        if fenced {
            // A step that writes KV: frees of its requests wait for it.
            self.sched_step_seq += 1;
        }
        // The drafts the runner proposes after this step (async: each
        // request scheduled waits for that many placeholders).
        let next_drafts = match &self.config.drafts_by_batch_size {
            Some(table) if !entries.is_empty() => table
                .get(entries.len())
                .copied()
                .unwrap_or(self.config.num_speculative_tokens),
            _ => self.config.num_speculative_tokens,
        };
        let block_sizes = self.kv.group_block_sizes();
        let mut out = StepOutput::with_capacity(entries.len(), block_sizes);
        out.slotless_groups = self.kv.slotless_groups();
        for e in &mut entries {
            let r = &mut self.requests[e.slot];
            e.num_output_tokens = r.num_output_tokens() + r.num_output_placeholders;
            let end = e.num_computed_tokens + e.num_tokens;
            let groups = r
                .tables
                .iter()
                .zip(self.kv.groups())
                .zip(block_sizes.iter());
            for ((table, group), &bs) in groups {
                let len = table.len();
                if group.kind.is_cross() {
                    // Taken whole on admission, read by no decoder position.
                    if e.kind != Kind::Running {
                        out.push_new_blocks(table.block_ids());
                    }
                    out.end_group();
                    out.push_span(&[]);
                    continue;
                }
                // Each group's new blocks (the whole table for an admission).
                let block_start = match e.kind {
                    Kind::Running => len - table.grown(),
                    Kind::New | Kind::Resumed => 0,
                };
                if block_start < len {
                    out.push_new_blocks(&table.block_ids()[block_start..]);
                }
                out.end_group();
                if group.kind.is_slotless() {
                    // A recurrent group's blocks hold states, not slots.
                    out.push_span(&[]);
                    continue;
                }
                // The blocks its tokens fall in: the per-token slots are
                // made from these when read (StepOutput::slot_mapping).
                if e.num_tokens > 0 && len > 0 && e.num_computed_tokens >= (len - 1) * bs {
                    // Its tokens fall in the last block (a decode's): no
                    // table read, no division.
                    out.push_span(&[table.last]);
                } else {
                    let span = match e.num_tokens {
                        0 => 0..0,
                        _ => e.num_computed_tokens / bs..(end - 1) / bs + 1,
                    };
                    out.push_span(&table.block_ids()[span]);
                }
            }
            r.seq.num_computed_tokens += e.num_tokens;
            r.in_flight_tokens += e.num_tokens;
            if fenced {
                r.last_sched_seq = self.sched_step_seq;
            }
            r.prefill_chunk = r.is_prefill_chunk();
            if !r.prefill_chunk {
                // Its prefill is done: an async load reserves nothing for it.
                r.inflight_prefill = false;
                let structured = r.grammar.is_some();
                out.has_structured_output_requests |= structured;
                if self.config.async_scheduling {
                    // Its grammar mask needs the token still in flight.
                    out.pending_structured_output_tokens |=
                        structured && r.num_output_placeholders > 0;
                    // The token this step samples (none for a pooling
                    // runner) and the drafts it verifies; the runner
                    // proposes the next drafts meanwhile.
                    r.num_output_placeholders +=
                        self.config.runner.sampled_tokens_per_step() + e.drafts.len();
                    r.drafts = match next_drafts {
                        0 => Drafts::None,
                        k => Drafts::Placeholders(k),
                    };
                    if self.config.decode_stagger > 0 {
                        r.next_decode_step = self.current_step + self.config.decode_stagger as u64;
                    }
                }
            }
        }
        out.entries = entries;
        out.new_block_ids_to_zero = self.kv.take_blocks_to_zero();
        // In the order vLLM adds them to its sets: a set's iteration order
        // (which a connector building its metadata follows) can depend on it.
        out.preempted_req_ids = std::mem::take(&mut self.preempted_ids);
        out.finished_req_ids = std::mem::take(&mut self.finished_ids);
        out.scheduler_id = self.id;
        out.step_id = self.next_step;
        self.pending_steps.push_back(self.next_step);
        self.next_step += 1;
        out
    }
}
