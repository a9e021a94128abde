"""ironbatch: a vLLM-exact continuous-batching scheduler and paged KV-cache
core in Rust, with a plain-Python twin in :mod:`ironbatch.reference`."""

from ironbatch._core import BlockPool, KVCacheManager, PrefixCacheStats, __version__
from ironbatch.config import CacheConfig, SchedulerConfig
from ironbatch.request import Request
from ironbatch.sampling_params import SamplingParams
from ironbatch.scheduler import Scheduler
from ironbatch.scheduler_output import RequestUpdate, SchedulerOutput, UpdateOutputs
from ironbatch.scheduler_stats import SchedulerStats

__all__ = [
    "BlockPool",
    "CacheConfig",
    "KVCacheManager",
    "PrefixCacheStats",
    "Request",
    "RequestUpdate",
    "SamplingParams",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerOutput",
    "SchedulerStats",
    "UpdateOutputs",
    "__version__",
]
