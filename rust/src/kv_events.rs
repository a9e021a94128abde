//! KV-cache events (docs/scheduling.md §7.12): what vLLM publishes to KV-aware
//! routers as `BlockStored`, `BlockRemoved` and `AllBlocksCleared`, logged
//! where and in the order vLLM creates them. The core's block hashes are its
//! own, so a `Stored` names the request and its blocks; the caller, who has
//! vLLM's hashes of that request's tokens, builds vLLM's event from it.
//!
//! A second kind, off unless asked for separately, follows each block's life
//! (handed out, hit) for vLLM's KV-cache residency metrics, which sample
//! blocks and time them.

use crate::block::BlockId;
use crate::slab::Slot;

/// One KV-cache event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KvEvent {
    /// The request in `owner` hash-cached group `group`'s full blocks
    /// `first_block..first_block + block_ids.len()` (vLLM's `BlockStored`
    /// from caching full blocks, one per group in group order); `block_ids`
    /// holds each one's id, or the null block where a window group holds
    /// none or keeps it out of the cache (§7.13).
    Stored {
        owner: Slot,
        group: usize,
        first_block: usize,
        block_ids: Vec<BlockId>,
    },
    /// The request in `owner` keyed group `group`'s block `block_id` by the
    /// hash at `num_hash_blocks` hash blocks, inside the block or where it
    /// ends (vLLM's `BlockStored` from `cache_partial_block`: a prompt's
    /// recurrent state, a full-attention prompt tail beside groups of
    /// different block sizes, §7.15–7.16). A block keyed already gets it
    /// as a second key; its `Removed` then ends both.
    StoredKey {
        owner: Slot,
        group: usize,
        num_hash_blocks: usize,
        block_id: BlockId,
    },
    /// A lookup found the first `num_blocks` hash blocks of the request in
    /// `owner` cached; logged only for requests that ask (vLLM's
    /// `kv_cache_report_mode="full"`), at every lookup with a hit, admitted
    /// or not.
    Hit { owner: Slot, num_blocks: usize },
    /// A cached block lost its keys: evicted to be reused, or re-keyed
    /// (vLLM's `BlockRemoved`, one per key).
    Removed { block_id: BlockId },
    /// The prefix cache was reset (vLLM's `AllBlocksCleared`; the
    /// residency metrics start over).
    Cleared,
    /// A block was handed out by `get_new_blocks` (evicted first when
    /// cached): a residency-metrics event.
    Allocated { block_id: BlockId },
    /// A cached block was hit (vLLM's `touch`): a residency-metrics event.
    Accessed { block_id: BlockId },
    /// A block's residency ends without its being handed out again: a
    /// prefill checkpoint's state that no later request can resume from
    /// (vLLM's `_maybe_evict_cached_block`, which ends it whether or not
    /// the block is cached): a residency-metrics event.
    Evicted { block_id: BlockId },
    /// The waiting pass looked up the prefix of the request in `owner`, which
    /// had computed nothing (where vLLM's scheduler asks its auxiliary-output
    /// connector how far a hit may reach): a request event.
    Lookup { owner: Slot },
    /// The request in `owner` gives its blocks back, finished or preempted,
    /// having computed `num_computed_tokens` (where vLLM's scheduler tells its
    /// auxiliary-output connector that the request finished): a request
    /// event.
    Released {
        owner: Slot,
        num_computed_tokens: usize,
    },
    /// The request in `owner` starts loading its KV from a KV connector,
    /// `num_computed_tokens` tokens once loaded (where vLLM's scheduler
    /// tells its auxiliary-output connector the request is loading): a
    /// request event.
    Loading {
        owner: Slot,
        num_computed_tokens: usize,
    },
}

/// The events since they were last taken; each kind off (and free) unless
/// enabled.
#[derive(Clone, Debug, Default)]
pub struct KvEventLog {
    events: Vec<KvEvent>,
    /// Routers' events: stored, hit, removed, cleared.
    routing: bool,
    /// Blocks' lives for the residency metrics: allocated, accessed,
    /// cleared.
    lifecycle: bool,
    /// Requests' lookups and releases, in order among the others: what an
    /// auxiliary-output connector follows (§7.12).
    requests: bool,
}

impl KvEventLog {
    /// Log routers' events from now on.
    pub fn enable(&mut self) {
        self.routing = true;
    }

    /// Log blocks' lives (residency metrics) from now on.
    pub fn enable_lifecycle(&mut self) {
        self.lifecycle = true;
    }

    /// Log requests' lookups and releases from now on.
    pub fn enable_requests(&mut self) {
        self.requests = true;
    }

    /// Whether routers' events are logged.
    pub fn enabled(&self) -> bool {
        self.routing
    }

    /// Whether blocks' lives are logged.
    pub fn lifecycle_enabled(&self) -> bool {
        self.lifecycle
    }

    /// Log `event` when its kind is enabled.
    pub fn push(&mut self, event: KvEvent) {
        let on = match event {
            KvEvent::Allocated { .. } | KvEvent::Accessed { .. } | KvEvent::Evicted { .. } => {
                self.lifecycle
            }
            KvEvent::Cleared => self.routing || self.lifecycle,
            KvEvent::Lookup { .. } | KvEvent::Released { .. } | KvEvent::Loading { .. } => {
                self.requests
            }
            _ => self.routing,
        };
        if on {
            self.events.push(event);
        }
    }

    /// The events so far, oldest first, leaving none.
    pub fn take(&mut self) -> Vec<KvEvent> {
        std::mem::take(&mut self.events)
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
        log.push(KvEvent::Allocated { block_id: 1 }); // lifecycle: not asked for
        assert!(log.take().is_empty());
    }

    #[test]
    fn lifecycle_events_alone() {
        let mut log = KvEventLog::default();
        log.enable_lifecycle();
        log.push(KvEvent::Removed { block_id: 3 }); // routing: not asked for
        log.push(KvEvent::Allocated { block_id: 3 });
        log.push(KvEvent::Cleared);
        let expected = vec![KvEvent::Allocated { block_id: 3 }, KvEvent::Cleared];
        assert_eq!(log.take(), expected);
    }

    #[test]
    fn request_events_alone_in_order_among_the_others() {
        let mut log = KvEventLog::default();
        log.enable_requests();
        log.push(KvEvent::Lookup { owner: 2 });
        log.push(KvEvent::Removed { block_id: 3 }); // routing: not asked for
        log.push(KvEvent::Released {
            owner: 2,
            num_computed_tokens: 16,
        });
        let released = KvEvent::Released {
            owner: 2,
            num_computed_tokens: 16,
        };
        assert_eq!(log.take(), vec![KvEvent::Lookup { owner: 2 }, released]);
        log.enable();
        log.push(KvEvent::Removed { block_id: 3 });
        log.push(KvEvent::Lookup { owner: 4 });
        let both = vec![
            KvEvent::Removed { block_id: 3 },
            KvEvent::Lookup { owner: 4 },
        ];
        assert_eq!(log.take(), both);
    }
}
