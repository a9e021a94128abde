//! Auxiliary outputs (routed experts) in the scheduler (docs/scheduling.md
//! §7.12): the retention of the workers' per-block routing is told what
//! vLLM's scheduler tells its auxiliary-output connector, at the same
//! moments, and caps prefix hits as that connector does.

use super::Scheduler;
use crate::aux_output_retention::AuxOutputRetention;
use crate::kv_connector::ExternalHit;
use crate::slab::Slot;

impl Scheduler {
    /// Follow auxiliary outputs from now on (vLLM's
    /// `--enable-return-routed-experts`): prefix hits reach only over blocks
    /// whose routing the workers hold. Keyed by the first full-attention
    /// group's blocks, else group 0's.
    pub fn enable_aux_outputs(&mut self) {
        let groups = self.kv.groups();
        let group = groups.iter().position(|g| g.kind.is_full()).unwrap_or(0);
        let block_size = if groups.is_empty() {
            self.kv.hash_block_size()
        } else {
            self.kv.group_block_size(group)
        };
        let retention = AuxOutputRetention::new(group, block_size, self.kv.hash_block_size());
        self.aux_retention = Some(retention);
    }

    /// Which blocks' auxiliary outputs the workers hold, when followed.
    pub fn aux_retention(&self) -> Option<&AuxOutputRetention> {
        self.aux_retention.as_ref()
    }

    /// How far the prefix hit of the request in `slot` may reach, where
    /// vLLM's scheduler asks before its lookup (`None`: no auxiliary outputs).
    pub(super) fn aux_max_cache_hit(&mut self, slot: Slot) -> Option<usize> {
        let retention = self.aux_retention.as_mut()?;
        let (kv, seq) = (&self.kv, &self.requests[slot].seq);
        let group = retention.group();
        let cached = |h| kv.is_cached_in(h, group);
        Some(retention.max_cache_hit(seq.block_hashes(), seq.num_tokens(), cached))
    }

    /// A connector's hit past `num_local` local tokens for the request in
    /// `slot`, capped where the workers hold no routing for it.
    pub(super) fn aux_cap_external_hit(
        &mut self,
        slot: Slot,
        num_local: usize,
        external: ExternalHit,
    ) -> ExternalHit {
        let Some(retention) = self.aux_retention.as_mut() else {
            return external;
        };
        let (kv, seq) = (&self.kv, &self.requests[slot].seq);
        let group = retention.group();
        let cached = |h| kv.is_cached_in(h, group);
        let (hashes, num_tokens) = (seq.block_hashes(), seq.num_tokens());
        let num_tokens =
            retention.cap_external_hit(hashes, num_tokens, num_local, external.num_tokens, cached);
        ExternalHit {
            num_tokens,
            load_async: external.load_async && num_tokens > 0,
        }
    }

    /// The request in `slot` starts loading its first `num_tokens` tokens'
    /// KV from a connector.
    pub(super) fn aux_request_loading(&mut self, slot: Slot, num_tokens: usize) {
        if let Some(retention) = self.aux_retention.as_mut() {
            let hashes = self.requests[slot].seq.block_hashes();
            retention.request_loading(slot, hashes, num_tokens);
        }
    }

    /// The request in `slot` gives its blocks back (finished or preempted),
    /// before they go.
    pub(super) fn aux_request_finished(&mut self, slot: Slot) {
        let Some(retention) = self.aux_retention.as_mut() else {
            return;
        };
        // The workers keep a block per KV-cache block, twice that beside a
        // KV connector (whose loads bring routing back with their KV).
        let per_block = if self.connector.is_some() { 2 } else { 1 };
        let capacity = self.kv.pool().num_blocks() * per_block;
        let (kv, seq) = (&self.kv, &self.requests[slot].seq);
        let group = retention.group();
        let cached = |h| kv.is_cached_in(h, group);
        let hashes = seq.block_hashes();
        retention.request_finished(slot, hashes, seq.num_computed_tokens, capacity, cached);
    }

    /// A step scheduled the requests in `slots` (vLLM tells its connector
    /// as it builds the step's metadata).
    pub(super) fn aux_scheduled(&mut self, slots: impl Iterator<Item = Slot>) {
        if let Some(retention) = self.aux_retention.as_mut() {
            slots.for_each(|s| retention.scheduled(s));
        }
    }

    /// The prefix cache was reset.
    pub(super) fn aux_reset(&mut self) {
        if let Some(retention) = self.aux_retention.as_mut() {
            retention.reset();
        }
    }
}
