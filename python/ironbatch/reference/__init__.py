"""The plain-Python twin of ironbatch's Rust core.

Module for module the same design and the same decisions as ``rust/src/``,
written to be read: it is where to learn how a paged KV cache with prefix
caching works, the oracle of the differential tests, and the baseline of the
benchmarks. It never imports the Rust core.

Reading order: ``block`` → ``free_queue`` → ``block_hash`` / ``hash_chain`` →
``prefix_cache_map`` → ``block_pool`` → ``block_table`` / ``sequence`` →
``kv_cache_manager`` → ``request`` / ``request_queue`` / ``stop_check`` →
``scheduler``.
"""

from ironbatch.reference.block_pool import BlockPool
from ironbatch.reference.kv_cache_manager import KVCacheManager
from ironbatch.reference.prefix_cache_stats import PrefixCacheStats
from ironbatch.reference.request import RequestStatus
from ironbatch.reference.scheduler import Scheduler

__all__ = ["BlockPool", "KVCacheManager", "PrefixCacheStats", "RequestStatus", "Scheduler"]
