"""What vLLM's EngineCore reads of a scheduler's ``kv_cache_manager``: each
KV-cache group's block size and spec (for the engine's
``effective_attention_block_size`` and ``get_kv_cache_group_metadata``). The
blocks themselves live in the Rust core; this view only describes them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class GroupView:
    """One KV-cache group, as vLLM's per-group managers describe it."""

    block_size: int
    kv_cache_spec: Any


@dataclass(frozen=True)
class CoordinatorView:
    single_type_managers: tuple[GroupView, ...]


def group_block_size(spec: Any, dcp_world_size: int) -> int:
    """Tokens per block of a group, as vLLM's manager for it counts them:
    decode context parallelism's ranks each hold part of a sharded group's
    block (a recurrent state is never sharded)."""
    return spec.block_size * (dcp_world_size if spec.dcp_sharded else 1)


class KVCacheManagerView:
    """A read-only stand-in for vLLM's ``KVCacheManager`` where EngineCore
    looks; ``usage`` is the core's."""

    def __init__(self, kv_cache_config: Any, dcp_world_size: int, core: Any) -> None:
        groups = kv_cache_config.kv_cache_groups
        self.coordinator = CoordinatorView(
            tuple(
                GroupView(group_block_size(g.kv_cache_spec, dcp_world_size), g.kv_cache_spec)
                for g in groups
            )
        )
        # The blocks live in the core: a KV connector that manages vLLM's
        # block pool gets vLLM's scheduler instead (support.py), and the
        # others only pass this on (``bind_kv_cache_manager``).
        self.block_pool = None
        self._core = core

    @property
    def usage(self) -> float:
        return self._core.kv_cache_usage
