"""The plain-Python twin of ironbatch's Rust core.

Module for module and name for name the same design and the same decisions
as ``rust/src/``, written to be read: it is where to learn how a paged KV
cache with prefix caching and vLLM's scheduler work, the oracle of the
differential tests, and the baseline of the benchmarks. It never imports the
Rust core. The semantics are specified in ``docs/scheduling.md``.

Reading order: ``block`` → ``free_queue`` → ``block_hash`` / ``hash_chain`` →
``prefix_cache_map`` → ``block_pool`` → ``block_table`` / ``sequence`` →
``attention_group`` / ``prefix_hit`` (KV-cache groups: full attention,
sliding windows, chunked local attention, cross-attention) → ``kv_cache_manager`` (the core's
manager over tables and sequences) →
``kv_cache_registry`` (the id-keyed ``KVCacheManager`` users call) →
``multimodal`` / ``encoder_cache`` / ``encoder_decoder_cache`` (images:
their placeholders and the encoder's cache; an encoder-decoder's slot
count) → ``request`` / ``request_queue`` / ``slab`` / ``stop_check``
→ ``step`` → ``scheduler_config`` → ``scheduler`` (``running_pass`` →
``encoder_inputs`` → ``preemption`` → ``waiting_pass`` → ``step_columns`` →
``update``). ``limits``, ``error`` and
``args`` hold the shared checks and messages.
"""

from ironbatch.reference.block_pool import BlockPool
from ironbatch.reference.kv_cache_manager import KvCacheManager
from ironbatch.reference.kv_cache_registry import KVCacheManager
from ironbatch.reference.prefix_cache_stats import PrefixCacheStats
from ironbatch.reference.request import (
    FINISHED_STATUS_NAMES,
    NewRequest,
    Request,
    RequestStatus,
    StopRules,
)
from ironbatch.reference.scheduler import Pause, Scheduler, SchedulerStats
from ironbatch.reference.step import (
    Finished,
    Kind,
    StepColumns,
    StepEntry,
    StepOutput,
    UpdateOutput,
    UpdateRecord,
)

__all__ = [
    "FINISHED_STATUS_NAMES",
    "BlockPool",
    "Finished",
    "KVCacheManager",
    "Kind",
    "KvCacheManager",
    "NewRequest",
    "Pause",
    "PrefixCacheStats",
    "Request",
    "RequestStatus",
    "Scheduler",
    "SchedulerStats",
    "StepColumns",
    "StepEntry",
    "StepOutput",
    "StopRules",
    "UpdateOutput",
    "UpdateRecord",
]
