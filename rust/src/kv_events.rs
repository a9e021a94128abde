//! KV-cache events (docs/scheduling.md §7.12): what vLLM publishes to KV-aware
//! routers as `BlockStored`, `BlockRemoved` and `AllBlocksCleared`, logged
//! where and in the order vLLM creates them. The core's block hashes are its
//! own, so a `Stored` names the request and its blocks; the caller, who has
//! vLLM's hashes of that request's tokens, builds vLLM's event from it.

use crate::block::BlockId;
use crate::slab::Slot;

/// One KV-cache event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KvEvent {
    /// The request in `owner` hash-cached its blocks `first_block..`, whose
    /// ids are `block_ids` (vLLM's `BlockStored` from caching full blocks).
    Stored {
        owner: Slot,
        first_block: usize,
        block_ids: Vec<BlockId>,
    },
    /// A lookup found the first `num_blocks` blocks of the request in
    /// `owner` cached; logged only for requests that ask (vLLM's
    /// `kv_cache_report_mode="full"`), at every lookup with a hit, admitted
    /// or not.
    Hit { owner: Slot, num_blocks: usize },
    /// A cached block was evicted to be reused (vLLM's `BlockRemoved`).
    Removed { block_id: BlockId },
    /// The prefix cache was reset (vLLM's `AllBlocksCleared`).
    Cleared,
}

/// The events since they were last taken; off (and free) unless enabled.
#[derive(Clone, Debug, Default)]
pub struct KvEventLog {
    events: Option<Vec<KvEvent>>,
}

impl KvEventLog {
    /// Start logging.
    pub fn enable(&mut self) {
        self.events.get_or_insert_with(Vec::new);
    }

    /// Whether events are logged.
    pub fn enabled(&self) -> bool {
        self.events.is_some()
    }

    /// Log `event` when enabled.
    pub fn push(&mut self, event: KvEvent) {
        if let Some(events) = &mut self.events {
            events.push(event);
        }
    }

    /// The events so far, oldest first, leaving none.
    pub fn take(&mut self) -> Vec<KvEvent> {
        self.events.as_mut().map(std::mem::take).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logs_only_when_enabled_and_takes_in_order() {
        let mut log = KvEventLog::default();
        log.push(KvEvent::Cleared);
        assert!(log.take().is_empty());
        log.enable();
        log.push(KvEvent::Removed { block_id: 3 });
        log.push(KvEvent::Cleared);
        assert_eq!(
            log.take(),
            vec![KvEvent::Removed { block_id: 3 }, KvEvent::Cleared]
        );
        assert!(log.take().is_empty() && log.enabled());
    }
}
