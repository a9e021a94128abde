//! KV loads that failed (docs/scheduling.md §4.19): a load that failed
//! whole (`failed_recving`) or blocks that did not arrive
//! (`invalid_block_ids`). The requests they touch are cut back to what
//! arrived and either compute the rest or end with an error, as the
//! connector's failure policy says; vLLM 0.33's rules, in its order.

use super::request_errors::ErrorGroups;
use super::Scheduler;
use crate::block::BlockId;
use crate::cdiv;
use crate::error::Error;
use crate::kv_connector::{KvTransferReport, LoadFailurePolicy};
use crate::request::RequestStatus;
use crate::slab::Slot;
use crate::step::StepOutput;
use rustc_hash::FxHashSet;

/// The requests a report's failures touched.
#[derive(Debug, Default)]
pub(super) struct FailedLoads {
    /// Scheduled in the step and touched: the update applies no output to
    /// them (their computed tokens were cut back).
    pub skip: Vec<Slot>,
    /// To end with an error after the update (the "fail" policy), in the
    /// order they were found.
    pub ended: Vec<Slot>,
    /// The same, as each of vLLM's three searches found them.
    pub groups: ErrorGroups,
}

/// What one walk over requests found (vLLM's
/// `_update_requests_with_invalid_blocks`).
#[derive(Default)]
struct Cut {
    affected: Vec<Slot>,
    /// Invalid blocks and every block after them, to uncache ("fail").
    to_evict: Vec<BlockId>,
}

impl Scheduler {
    /// Refuse a report naming blocks the pool does not have, or transfers
    /// of requests in no state for them, before anything changes.
    pub(super) fn check_kv_report(&self, report: &KvTransferReport) -> Result<(), Error> {
        let num_blocks = self.kv.pool().num_blocks();
        if let Some(&b) = report
            .invalid_block_ids
            .iter()
            .find(|&&b| b as usize >= num_blocks)
        {
            return Err(Error::invalid(format!(
                "invalid_block_ids: block {b} is not in the pool of {num_blocks} blocks"
            )));
        }
        if !report.invalid_block_ids.is_empty() && self.config.cache.groups.len() > 1 {
            // Block ids are unique within a group only.
            return Err(Error::invalid(
                "invalid_block_ids: a layout of several KV-cache groups reports failed_recving",
            ));
        }
        self.check_kv_transfers(&report.finished_recving, &report.finished_sending)
            .map(|_| ())
    }

    /// The report's failures, before the update applies the step's output:
    /// whole failed loads first, then invalid blocks.
    pub(super) fn apply_failed_loads(
        &mut self,
        report: &KvTransferReport,
        step: &StepOutput,
    ) -> FailedLoads {
        let recompute = self.kv_setup.load_failure_policy == LoadFailurePolicy::Recompute;
        let mut failed = FailedLoads::default();
        for id in &report.failed_recving {
            let Some(&slot) = self.ids.get(id.as_str()) else {
                continue; // gone already: nothing to fail
            };
            let r = &mut self.requests[slot];
            if r.status != RequestStatus::WaitingForRemoteKvs || failed.ended.contains(&slot) {
                continue;
            }
            if recompute {
                r.seq.num_computed_tokens = 0;
                r.kv_load_failed = true;
            } else {
                failed.ended.push(slot);
                failed.groups.whole.push(slot);
            }
        }
        if report.invalid_block_ids.is_empty() {
            return failed;
        }
        let invalid: FxHashSet<BlockId> = report.invalid_block_ids.iter().copied().collect();
        // Tokens each request got in this step: its blocks past what it had
        // computed before hold nothing loaded.
        let mut scheduled: Vec<(Slot, usize)> = Vec::with_capacity(step.entries.len());
        for e in &step.entries {
            if self.is_live(e) {
                scheduled.push((e.slot, e.num_tokens));
            }
        }
        let loading: Vec<Slot> = self
            .kv_holding
            .iter(&self.requests)
            .filter(|&s| self.requests[s].status == RequestStatus::WaitingForRemoteKvs)
            .collect();
        // Each walk claims blocks on its own (vLLM's two calls): a block a
        // loading request claimed is claimed again by the first running one.
        let loads = self.cut_at_invalid_blocks(&loading, &invalid, &scheduled);
        let running = self.running.clone();
        let runs = self.cut_at_invalid_blocks(&running, &invalid, &scheduled);
        if recompute {
            for &slot in &loads.affected {
                self.requests[slot].kv_load_failed = true;
            }
            failed.skip.extend(&runs.affected);
        } else {
            // The blocks cannot be trusted: nobody may hit them again.
            self.kv.uncache_blocks(&runs.to_evict);
            failed.groups.loading.clone_from(&loads.affected);
            failed.groups.running.clone_from(&runs.affected);
            for slot in loads.affected.into_iter().chain(runs.affected) {
                if !failed.ended.contains(&slot) {
                    failed.ended.push(slot);
                }
            }
            failed.skip = failed.ended.clone();
        }
        failed
    }

    /// Cut each of `slots` back to its first invalid block among those it
    /// had computed before this step, unless a request walked earlier in
    /// this walk claimed that block (it will compute it again; this one only
    /// loses this step's tokens).
    fn cut_at_invalid_blocks(
        &mut self,
        slots: &[Slot],
        invalid: &FxHashSet<BlockId>,
        scheduled: &[(Slot, usize)],
    ) -> Cut {
        let bs = self.kv.hash_block_size();
        let mut cut = Cut::default();
        let mut marked = FxHashSet::default();
        for &slot in slots {
            let r = &mut self.requests[slot];
            let in_step = scheduled
                .iter()
                .find(|&&(s, _)| s == slot)
                .map_or(0, |&(_, n)| n);
            let computed_before = r.seq.num_computed_tokens.saturating_sub(in_step);
            let ids = r.tables[0].block_ids();
            let mut affected = false;
            let mut claimed = false;
            for (idx, &block) in ids.iter().enumerate().take(cdiv(computed_before, bs)) {
                if !invalid.contains(&block) {
                    continue;
                }
                affected = true;
                if !marked.insert(block) || claimed {
                    continue; // an earlier request's to compute, or past the cut
                }
                claimed = true;
                r.seq.num_computed_tokens = idx * bs;
                cut.to_evict.extend_from_slice(&ids[idx..]);
            }
            if affected {
                if !claimed {
                    r.seq.num_computed_tokens = computed_before;
                }
                cut.affected.push(slot);
            }
        }
        cut
    }
}
