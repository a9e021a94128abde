"""ironbatch: a vLLM-exact continuous-batching scheduler and paged KV-cache
core in Rust, with a plain-Python twin in :mod:`ironbatch.reference`.

``from ironbatch import LLM, SamplingParams`` reads as vLLM's does. The
engine's names (``LLM``, ``LLMEngine``, ``EngineArgs``) load on first use, so
``import ironbatch`` alone imports neither torch nor triton. ``ironbatch.simulate``
(the simulator, :mod:`ironbatch.simulation`) loads on first use too."""

import importlib
from typing import TYPE_CHECKING, Any

from ironbatch._core import BlockPool, KVCacheManager, PrefixCacheStats, __version__
from ironbatch.config import CacheConfig, KVCacheGroup, SchedulerConfig
from ironbatch.lora import LoRARequest
from ironbatch.multimodal import MultimodalInput
from ironbatch.outputs import CompletionOutput, RequestOutput
from ironbatch.request import Request
from ironbatch.sampling_params import RepetitionDetectionParams, SamplingParams
from ironbatch.scheduler import Scheduler
from ironbatch.scheduler_output import RequestUpdate, SchedulerOutput, UpdateOutputs
from ironbatch.scheduler_stats import SchedulerStats

if TYPE_CHECKING:
    from ironbatch.engine import LLM, EngineArgs, LLMEngine
    from ironbatch.simulation import simulate

_ENGINE_NAMES = ("LLM", "LLMEngine", "EngineArgs")


def __getattr__(name: str) -> Any:
    if name in _ENGINE_NAMES:
        value = getattr(importlib.import_module("ironbatch.engine"), name)
        globals()[name] = value  # later lookups skip this function
        return value
    if name == "simulate":
        value = importlib.import_module("ironbatch.simulation").simulate
        globals()[name] = value
        return value
    raise AttributeError(f"module 'ironbatch' has no attribute {name!r}")


__all__ = [
    "LLM",
    "BlockPool",
    "CacheConfig",
    "CompletionOutput",
    "EngineArgs",
    "KVCacheGroup",
    "KVCacheManager",
    "LLMEngine",
    "LoRARequest",
    "MultimodalInput",
    "PrefixCacheStats",
    "Request",
    "RequestOutput",
    "RequestUpdate",
    "RepetitionDetectionParams",
    "SamplingParams",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerOutput",
    "SchedulerStats",
    "UpdateOutputs",
    "__version__",
    "simulate",
]
