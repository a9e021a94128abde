"""ironbatch: a vLLM-exact continuous-batching scheduler and paged KV-cache
core in Rust, with a plain-Python twin in :mod:`ironbatch.reference`."""

from ironbatch._core import BlockPool, KVCacheManager, PrefixCacheStats, __version__

__all__ = ["BlockPool", "KVCacheManager", "PrefixCacheStats", "__version__"]
