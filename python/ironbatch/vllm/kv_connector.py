"""vLLM's KV connector behind the drop-in (docs/scheduling.md §4.19).

The connector object stays vLLM's: built by vLLM's factory with the
scheduler role, exactly as vLLM's scheduler builds it, so every connector
vLLM ships (and a user's own) is the same object. The core calls a
connector by request id at the points vLLM's scheduler does;
``ConnectorBridge`` turns each call into vLLM's, with the vLLM ``Request``
brought up to date from the core's ``observe_request`` (tokens, block
hashes, computed count, status as vLLM's scheduler has them at that call)
and the blocks as ``KVCacheBlocks`` whose cached ones carry their hashes.

What vLLM's scheduler does around the calls is here too: the prefix-cache
stats of external hits, the transfer parameters a finished request returns,
and which requests wait for their KV (``WAITING_FOR_REMOTE_KVS``)."""

from __future__ import annotations

from typing import Any

from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole, SupportsHMA
from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.core.kv_cache_utils import KVCacheBlock, make_block_hash_with_group_id
from vllm.v1.metrics.stats import (
    KV_FETCH_COMPLETED_WAITING,
    KV_FETCH_IN_PROGRESS,
    KV_FETCH_STAGES,
    KV_FETCH_WAITING_TO_START,
    PrefixCacheStats,
)
from vllm.v1.request import Request, RequestStatus

from ironbatch.reference.kv_connector import KvConnectorSetup, LoadFailurePolicy


def build_connector(vllm_config: Any, kv_cache_config: Any) -> Any:
    """The scheduler side of the deployment's KV connector, as vLLM's
    scheduler builds it."""
    return KVConnectorFactory.create_connector(
        config=vllm_config, role=KVConnectorRole.SCHEDULER, kv_cache_config=kv_cache_config
    )


# Connectors whose build_connector_meta reads no Request state but their
# transfer parameters (read from vLLM 0.33's code): NIXL's pull and push
# schedulers. Before any other connector builds its metadata, the drop-in
# brings every scheduled request's Request up to date (tokens, block hashes,
# computed count), which costs a call per request a step.
BUILDS_FROM_OWN_STATE = frozenset({"NixlPullConnector", "NixlPushConnector"})


def reads_requests_when_building(connector: Any) -> bool:
    """Whether ``connector`` may read scheduled requests' state in
    ``build_connector_meta`` (a MultiConnector: if any of its own may)."""
    children = getattr(connector, "_connectors", None)
    if type(connector).__name__ == "MultiConnector" and children is not None:
        return any(reads_requests_when_building(c) for c in children)
    return type(connector).__name__ not in BUILDS_FROM_OWN_STATE


def connector_setup(vllm_config: Any, connector: Any) -> KvConnectorSetup:
    """How the core works with the connector, as vLLM's scheduler derives
    it: the load-failure policy; fenced frees with more than one step in
    flight on a consumer (a load into reused blocks is not ordered against
    a step still writing them); dropped stale output where the connector
    requires delivery; per-group local hits where it completes a hybrid's
    divergent ones (NIXL, MoRIIO reading)."""
    config = vllm_config.kv_transfer_config
    return KvConnectorSetup(
        load_failure_policy=LoadFailurePolicy(config.kv_load_failure_policy),
        defer_block_free=vllm_config.max_concurrent_batches > 1 and config.is_kv_consumer,
        requires_kv_delivery=bool(connector.requires_kv_delivery),
        divergent_hybrid_hits=bool(connector.supports_divergent_local_hybrid_hits),
    )


class ConnectorBridge:
    """vLLM's connector as the core calls a connector (by request id).

    ``requests`` are the drop-in's vLLM Requests by id (finished ones whose
    blocks a send holds included). ``allocated`` collects the requests
    told of their blocks in the schedule() now running (those it did not
    schedule are loading their KV); ``transfer_params`` holds the
    parameters finished requests return."""

    def __init__(self, connector: Any, requests: dict[str, Request], log_stats: bool) -> None:
        self.connector = connector
        self.requests = requests
        self.hybrid = isinstance(connector, SupportsHMA)
        #: Scheduled requests are brought up to date before each metadata.
        self.refreshes_scheduled = reads_requests_when_building(connector)
        #: vLLM's prefix-cache stats of external hits (with stats on).
        self.prefix_cache_stats: PrefixCacheStats | None = PrefixCacheStats() if log_stats else None
        #: Per request asked in this admission: its local hit and whether the
        #: answer was an async load.
        self._asked: dict[str, tuple[int, bool]] = {}
        #: Requests with an async KV load by stage, and their counts (vLLM
        #: tracks them with stats on).
        self._fetch_stage: dict[str, str] | None = {} if log_stats else None
        self.fetch_counts: dict[str, int] = dict.fromkeys(KV_FETCH_STAGES, 0)
        #: Per request, per group: the table positions whose block has a hash.
        self._cached_blocks: dict[str, list[list[int]]] = {}
        self.allocated: list[str] = []
        #: Per KV-cache group, a KVCacheBlock per block id (see ``_blocks``).
        self._block_views: list[list[KVCacheBlock]] = []
        #: Per request admitted after asking: its (local, external) hit
        #: tokens, for its prefill stats.
        self.hit_split: dict[str, tuple[int, int]] = {}
        self.transfer_params: dict[str, dict[str, Any] | None] = {}
        #: Per request a call brought up to date since last cleared (a
        #: finish inside an update): its token count before.
        self.synced_from: dict[str, int] = {}

    # -- the core's calls -------------------------------------------------------

    def observe_request(
        self,
        request_id: str,
        token_ids: list[int],
        num_computed_tokens: int,
        status: str,
        cached_blocks: list[list[int]],
    ) -> None:
        r = self.requests[request_id]
        self.synced_from.setdefault(request_id, r.num_tokens)
        set_tokens(r, token_ids)
        r.num_computed_tokens = num_computed_tokens
        r.status = RequestStatus[status]
        self._cached_blocks[request_id] = cached_blocks

    def get_num_new_matched_tokens(
        self, request_id: str, num_tokens: int, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        r = self.requests[request_id]
        answer = self.connector.get_num_new_matched_tokens(r, num_computed_tokens)
        tokens, load_async = answer
        if tokens is not None:
            load_async = load_async and not r.skip_reading_prefix_cache
            self._asked[request_id] = (num_computed_tokens, load_async)
        return answer

    def local_hit_reconciled(self, request_id: str, num_computed_tokens: int) -> None:
        # vLLM's stats count the hit found again, not the one it asked with.
        asked = self._asked.get(request_id)
        if asked is not None:
            self._asked[request_id] = (num_computed_tokens, asked[1])

    def external_hit_settled(self, request_id: str, num_tokens: int, load_async: bool) -> None:
        # Where vLLM sets the load stage: after routed experts capped the
        # hit and the encoder-cache connector's check.
        self.set_fetch_stage(request_id, KV_FETCH_WAITING_TO_START if load_async else None)

    def update_state_after_alloc(
        self, request_id: str, block_ids: list[list[int]], num_external_tokens: int
    ) -> None:
        r = self.requests[request_id]
        blocks = self._blocks(r, block_ids)
        self.connector.update_state_after_alloc(r, blocks, num_external_tokens)
        asked = self._asked.pop(request_id, None)
        load_async = asked is not None and asked[1] and num_external_tokens > 0
        self.set_fetch_stage(request_id, KV_FETCH_IN_PROGRESS if load_async else None)
        if asked is not None:
            self.hit_split[request_id] = (asked[0], num_external_tokens)
        if asked is not None and self.prefix_cache_stats is not None:
            queries = r.num_tokens - asked[0]
            if queries:
                preempted = r.num_preemptions > 0
                sources = (
                    self.connector.get_external_cache_hit_sources(r, num_external_tokens)
                    if num_external_tokens and not preempted
                    else None
                )
                self.prefix_cache_stats.record(
                    num_tokens=queries,
                    num_hits=num_external_tokens,
                    preempted=preempted,
                    hits_by_source=sources,
                )
        self.allocated.append(request_id)

    def get_loaded_kv_cache_group_ids(self, request_id: str) -> tuple[int, ...]:
        return tuple(self.connector.get_loaded_kv_cache_group_ids(self.requests[request_id]))

    def request_finished(self, request_id: str, block_ids: list[list[int]], status: str) -> bool:
        r = self.requests[request_id]
        if self.hybrid:
            hold, params = self.connector.request_finished_all_groups(r, tuple(block_ids))
        else:
            hold, params = self.connector.request_finished(r, block_ids[0])
        self.transfer_params[request_id] = params
        self._cached_blocks.pop(request_id, None)
        self._asked.pop(request_id, None)
        self.hit_split.pop(request_id, None)
        self.set_fetch_stage(request_id, None)
        return bool(hold)

    def has_pending_block_frees(self) -> bool:
        return bool(self.connector.has_pending_block_frees())

    # -- what vLLM's scheduler tracks around the calls ---------------------------

    def arrived(self, r: Request) -> None:
        """A new request: one whose KV comes from a prefill instance counts
        as waiting to fetch from its arrival."""
        params = r.kv_transfer_params
        if params and params.get("do_remote_prefill"):
            self.set_fetch_stage(r.request_id, KV_FETCH_WAITING_TO_START)

    def load_done(self, request_id: str) -> None:
        self.set_fetch_stage(request_id, KV_FETCH_COMPLETED_WAITING)

    def set_fetch_stage(self, request_id: str, stage: str | None) -> None:
        stages = self._fetch_stage
        if stages is None:
            return
        before = stages.pop(request_id, None)
        if before is not None:
            self.fetch_counts[before] -= 1
        if stage is not None:
            stages[request_id] = stage
            self.fetch_counts[stage] += 1

    def take_prefix_cache_stats(self) -> PrefixCacheStats | None:
        stats = self.prefix_cache_stats
        if stats is not None:
            self.prefix_cache_stats = PrefixCacheStats()
        return stats

    # -- helpers -----------------------------------------------------------------

    def _blocks(self, r: Request, block_ids: list[list[int]]) -> KVCacheBlocks:
        """The request's blocks as vLLM's ``KVCacheBlocks``: each cached one
        carries its hash (connectors tell loaded blocks from hit ones by
        them), a window's past is vLLM's null block. One ``KVCacheBlock``
        per block id and group, reused from call to call as vLLM's pool
        reuses its own."""
        cached = self._cached_blocks.get(r.request_id, [])
        hashes = r.block_hashes
        groups = []
        for group_id, ids in enumerate(block_ids):
            views = self._views(group_id, max(ids, default=0))
            blocks = [views[b] for b in ids]
            for block in blocks:
                block._block_hash = None
            for i in cached[group_id] if group_id < len(cached) else ():
                if i < len(blocks) and i < len(hashes):
                    blocks[i]._block_hash = make_block_hash_with_group_id(hashes[i], group_id)
            groups.append(blocks)
        return KVCacheBlocks(tuple(groups))

    def _views(self, group_id: int, largest: int) -> list[KVCacheBlock]:
        """Group ``group_id``'s block views, indexed by block id, at least
        up to ``largest``."""
        while len(self._block_views) <= group_id:
            self._block_views.append([])
        views = self._block_views[group_id]
        if len(views) <= largest:
            views.extend(KVCacheBlock(b, ref_cnt=1) for b in range(len(views), largest + 1))
            views[0].is_null = True  # vLLM's pool keeps block 0 as its null block
        return views


def set_tokens(r: Request, tokens: list[int]) -> None:
    """Bring a Request's tokens (and block hashes) to ``tokens``: usually
    the tail is new; otherwise (a session dropped a token) all of it."""
    have = r._all_token_ids
    n = len(have)
    if len(tokens) >= n and (n == 0 or have[n - 1] == tokens[n - 1]):
        tail = tokens[n:]
        if tail:
            have.extend(tail)
            r._output_token_ids.extend(tail[max(0, r.num_prompt_tokens - n) :])
    else:
        have[:] = tokens
        r._output_token_ids[:] = tokens[r.num_prompt_tokens :]
        r.block_hashes.clear()
    r.update_block_hashes()
