"""The drop-in's KV-cache residency metrics (``--kv-cache-metrics``): vLLM's
own collector, which samples blocks and times their lives, fed with the same
calls vLLM's block pool makes, in the same order, from the core's
block-lifecycle events (docs/scheduling.md §7.12): a block handed out is
evicted first (when prefix caching is on) and then allocated; a hit is an
access; a reset starts over. Sampling is random and times are the wall
clock's, as in vLLM."""

from __future__ import annotations

from typing import Any

from vllm.v1.core.kv_cache_metrics import KVCacheMetricsCollector
from vllm.v1.core.kv_cache_utils import KVCacheBlock
from vllm.v1.metrics.stats import KVCacheEvictionEvent

from ironbatch import _core


class KvMetrics:
    """vLLM's residency metrics over the core's blocks; off (``collector``
    None) unless the engine's observability config turns them on."""

    def __init__(self, vllm_config: Any, num_blocks: int) -> None:
        oc = vllm_config.observability_config
        self.collector = (
            KVCacheMetricsCollector(oc.kv_cache_metrics_sample) if oc.kv_cache_metrics else None
        )
        self.caching = bool(vllm_config.cache_config.enable_prefix_caching)
        # The collector keys on block ids; one handle per block, made once.
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)] if self.collector else []

    @property
    def enabled(self) -> bool:
        return self.collector is not None

    def feed(self, events: list[_core.KvEvent]) -> None:
        """Make the collector's calls for the core's block-lifecycle events."""
        collector = self.collector
        assert collector is not None
        for e in events:
            if e.kind == "allocated":
                block = self.blocks[e.block_ids[0]]
                if self.caching:
                    collector.on_block_evicted(block)
                collector.on_block_allocated(block)
            elif e.kind == "accessed":
                collector.on_block_accessed(self.blocks[e.block_ids[0]])
            elif e.kind == "evicted":
                collector.on_block_evicted(self.blocks[e.block_ids[0]])
            elif e.kind == "cleared":
                collector.reset()

    def drain(self) -> list[KVCacheEvictionEvent]:
        """The eviction events since last drained (empty when off)."""
        return self.collector.drain_events() if self.collector is not None else []
