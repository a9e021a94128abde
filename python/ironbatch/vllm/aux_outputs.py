"""Auxiliary outputs under the drop-in (``--enable-return-routed-experts``:
each output carries the experts its tokens were routed to, for RL rollouts
that replay the router).

The scheduler's side of them is vLLM's own ``AuxOutputSchedulerConnector``,
called where vLLM's scheduler calls it (docs/vllm-dropin.md). It keeps the
hashes of finished requests' blocks whose routing the workers still store
(up to one per KV-cache block, least recently used out first), tells the
workers each step which block hashes a request has completed, and slices
each output's rows. What it asks vLLM's KV-cache manager, whether a block
hash is cached on the GPU, depends on the moment it asks: a request's
lookup, a preemption and a finish happen between evictions. So the core
logs those moments among its KV-cache events (docs/scheduling.md §7.12),
and the connector is called as the events are replayed, against the cache
they describe."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from vllm.distributed.aux_output_connector.connector import AuxOutputSchedulerConnector
from vllm.v1.core.kv_cache_utils import BlockHashWithGroupId, make_block_hash_with_group_id
from vllm.v1.kv_cache_interface import FullAttentionSpec
from vllm.v1.request import Request

from ironbatch.vllm.kv_cache_view import group_block_size


class CachedBlocks:
    """vLLM's block pool as the connector reads it: which block hashes are
    cached, per group (the keys the replayed events stored and removed)."""

    def __init__(self, cached: Counter[BlockHashWithGroupId], hash_block_size: int) -> None:
        self.cached = cached
        self.hash_block_size = hash_block_size

    def get_cached_block(self, block_hash: bytes, group_ids: list[int]) -> list[bool] | None:
        """A truthy value when every group in ``group_ids`` holds the hash
        (the connector asks one group and only tests the answer)."""
        found = all(
            self.cached[make_block_hash_with_group_id(block_hash, g)] > 0 for g in group_ids
        )
        return [True] * len(group_ids) if found else None


def reference_group(kv_cache_config: Any) -> int:
    """The group whose blocks the connector keys routing by: vLLM's
    coordinator's full-attention group (the first prefix-cacheable full
    attention group, MLA included), or group 0 when there is none."""
    for i, g in enumerate(kv_cache_config.kv_cache_groups):
        spec = g.kv_cache_spec
        if isinstance(spec, FullAttentionSpec) and spec.prefix_cacheable:
            return i
    return 0


class AuxOutputs:
    """vLLM's auxiliary-output connector, on the drop-in's replayed cache."""

    def __init__(
        self,
        kv_cache_config: Any,
        dcp_world_size: int,
        hash_block_size: int,
        cached: Counter[BlockHashWithGroupId],
        hash_lookahead_tokens: int,
        kv_connector: Any | None,
    ) -> None:
        group = reference_group(kv_cache_config)
        pool = CachedBlocks(cached, hash_block_size)
        groups = kv_cache_config.kv_cache_groups
        managers = [
            SimpleNamespace(
                block_pool=pool, block_size=group_block_size(g.kv_cache_spec, dcp_world_size)
            )
            for g in groups
        ]
        # (What the connector reads of vLLM's KVCacheManager, and no more.)
        manager = SimpleNamespace(
            coordinator=SimpleNamespace(
                full_attention_group_id=group, single_type_managers=managers
            ),
            block_pool=pool,
            kv_cache_config=kv_cache_config,
        )
        # (Beside a KV connector it retains twice as many blocks.)
        self.connector = AuxOutputSchedulerConnector(manager, kv_connector)
        self.hash_lookahead_tokens = hash_lookahead_tokens

    def on_request_event(self, kind: str, r: Request, num_computed_tokens: int) -> None:
        """A request event from the core, replayed in order: a lookup
        ("lookup"), a load from a KV connector starting ("loading",
        ``num_computed_tokens`` once loaded), or its blocks going back,
        finished or preempted ("released", after ``num_computed_tokens``
        tokens)."""
        if kind == "loading":
            r.update_block_hashes()
            self.connector.request_loading(r, num_computed_tokens)
            return
        if kind == "lookup":
            if r.resumable and self.hash_lookahead_tokens:
                # As vLLM's scheduler does first: a session computing its KV
                # afresh hashes its tokens as they are now.
                r.block_hashes.clear()
            r.update_block_hashes()
            self.connector.max_cache_hit(r)
            return
        r.update_block_hashes()
        kept = r.num_computed_tokens
        r.num_computed_tokens = num_computed_tokens  # what vLLM's Request held then
        try:
            self.connector.request_finished(r)
        finally:
            r.num_computed_tokens = kept

    def metadata(
        self,
        output: Any,
        computed: list[int],
        requests: dict[str, Request],
        sync: Callable[[Request], None],
    ) -> Any:
        """The step's metadata for the workers, built as vLLM builds it
        before the step advances its requests: ``computed`` is each
        scheduled row's ``num_computed_tokens`` before the step; ``sync``
        brings a request that was not scheduled up to date."""
        scheduled = output.num_scheduled_tokens
        for rid, num_computed in zip(scheduled, computed, strict=True):
            r = requests[rid]
            r.num_computed_tokens = num_computed
            r.update_block_hashes()
        # Requests it sent hashes for earlier may complete a block now. (Its
        # own record of them: a private field of vLLM 0.33's connector, the
        # one version the drop-in takes, support.py.)
        for rid in self.connector._sent_hash_counts:
            if rid not in scheduled:
                r = requests[rid]
                sync(r)
                r.update_block_hashes()
        return self.connector.build_connector_meta(output, requests)

    def attach(self, outs: list[Any], requests: list[Request], runner_output: Any) -> None:
        """Each output's routed experts, for the tokens it accepted."""
        rows = runner_output.aux_output_connector_output
        for out, r in zip(outs, requests, strict=True):
            out.routed_experts = self.connector.take_output(r, rows)

    def reset(self) -> None:
        """The prefix cache was reset: the workers start a new namespace."""
        self.connector.reset()
