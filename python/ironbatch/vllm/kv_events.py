"""The drop-in's KV-cache events: the core's events (docs/scheduling.md
§7.12) made vLLM's ``BlockStored``, ``BlockRemoved`` and
``AllBlocksCleared``, and published through vLLM's own publisher (ZMQ, as
``--kv-events-config`` sets it), one batch per ``update_from_output``.

The core hashes blocks its own way; the events carry vLLM's hashes, which the
engine's block hasher computes on each vLLM ``Request`` (``block_hashes``,
from its tokens, cache salt and hash algorithm). So while events are on the
drop-in keeps every ``Request``'s tokens current, and a stored block's hash
is taken from its request when the core logs the store. The keys cached
now are kept too: the auxiliary outputs (``aux_outputs.py``) ask about them
as the events are followed, unpublished when events are off."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from vllm.distributed.kv_events import (
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventPublisherFactory,
    KVCacheEvent,
    KVEventBatch,
)
from vllm.v1.core.kv_cache_utils import (
    BlockHashWithGroupId,
    generate_block_hash_extra_keys,
    generate_lookahead_block_hash_extra_keys,
    get_block_hash,
    get_group_id,
    make_block_hash_with_group_id,
    maybe_convert_block_hash,
    to_event_extra_keys,
)
from vllm.v1.kv_cache_interface import (
    get_kv_cache_spec_kind,
    get_kv_cache_spec_sliding_window,
)
from vllm.v1.request import Request

from ironbatch import _core
from ironbatch.vllm.kv_cache_view import group_block_size

# Hears a request's lookup ("lookup"), release ("released", with the tokens
# it had computed) or load from a KV connector ("loading", with the tokens
# it will have computed), as the core logged it among the cache's events.
RequestEventHandler = Callable[[str, Request, int], None]


class KvEvents:
    """Turns the core's KV-cache events into vLLM's and publishes them."""

    def __init__(self, vllm_config: Any, kv_cache_config: Any, hash_block_size: int) -> None:
        config = vllm_config.kv_events_config
        self.enabled = bool(config is not None and config.enable_kv_cache_events)
        # vLLM's scheduler makes the same publisher (a no-op one when off).
        self.publisher = EventPublisherFactory.create(
            config, vllm_config.parallel_config.data_parallel_index
        )
        # Each group's kind and window, which vLLM's manager writes on the
        # group's stores (a model without a KV cache has none and stores
        # nothing).
        self.group_specs = [
            (
                get_kv_cache_spec_kind(g.kv_cache_spec).value,
                get_kv_cache_spec_sliding_window(g.kv_cache_spec),
            )
            for g in kv_cache_config.kv_cache_groups
        ]
        # Each group's block size, and the hash block a request's hashes are
        # cut at (their greatest common divisor, docs/scheduling.md §7.16):
        # a group's block is keyed by the hash where it ends.
        dcp = vllm_config.parallel_config.decode_context_parallel_size
        self.group_block_sizes = [
            group_block_size(g.kv_cache_spec, dcp) for g in kv_cache_config.kv_cache_groups
        ]
        self.hash_block_size = hash_block_size
        # An EAGLE-style drafter's block hashes cover the tokens after the
        # block too; its events name those tokens.
        self.hash_lookahead: int = vllm_config.num_hash_lookahead_tokens
        self.pending: list[KVCacheEvent] = []
        # Each cached block's published keys (vLLM's hash with its group),
        # for its BlockRemoved events: its own first, then those a prompt
        # tail gave it besides, in a set built as vLLM's pool builds it (one
        # event each, in the set's order).
        self.keys: dict[int, tuple[BlockHashWithGroupId, set[BlockHashWithGroupId]]] = {}
        # Every key cached now, counted per block holding it (the cache the
        # events describe, for the auxiliary-output connector's questions).
        self.cached: Counter[BlockHashWithGroupId] = Counter()

    def convert(
        self,
        events: list[_core.KvEvent],
        request_of: Callable[[int], Request],
        on_request_event: RequestEventHandler | None = None,
    ) -> None:
        """Follow the core's events in order, queueing vLLM's for them when
        they are published. ``request_of(slot)`` is the request in a slot,
        whose tokens must be current; ``on_request_event`` hears each
        request's lookups and releases as they come among the others."""
        publishing = self.enabled
        for e in events:
            if e.kind == "stored":
                r = request_of(e.slot)
                kept = [b != 0 for b in e.block_ids]  # 0: the null block, none stored
                stored, keys = self.stored(r, e.group, e.first_block, kept)
                ids = [b for b in e.block_ids if b]
                self.keys.update((b, (k, set())) for b, k in zip(ids, keys, strict=True))
                self.cached.update(keys)
                if publishing:
                    self.pending.append(stored)
            elif e.kind == "stored_key":
                # A key at a hash block's end, inside the block or where it
                # ends (one hash block's tokens).
                r = request_of(e.slot)
                (block_id,) = e.block_ids
                stored, (key,) = self.stored(
                    r, e.group, e.num_blocks - 1, [True], block_size=self.hash_block_size
                )
                if block_id in self.keys:
                    self.keys[block_id][1].add(key)
                else:
                    self.keys[block_id] = (key, set())
                self.cached[key] += 1
                if publishing:
                    self.pending.append(stored)
            elif e.kind == "hit" and publishing:
                # Every group finds the hit, its window's nulls counted, in
                # its own blocks (the core counts hash blocks).
                r = request_of(e.slot)
                tokens = e.num_blocks * self.hash_block_size
                for g, bs in enumerate(self.group_block_sizes):
                    self.pending.append(self.stored(r, g, 0, [True] * (tokens // bs))[0])
            elif e.kind == "removed":
                (block_id,) = e.block_ids
                own, others = self.keys.pop(block_id)
                self.cached.subtract((own, *others))
                for key in (own, *others):
                    if not self.cached[key]:
                        del self.cached[key]
                    if publishing:
                        block_hash = maybe_convert_block_hash(get_block_hash(key))
                        self.pending.append(
                            BlockRemoved(
                                block_hashes=[block_hash],
                                medium=MEDIUM_GPU,
                                group_idx=get_group_id(key),
                            )
                        )
            elif e.kind == "cleared":
                self.keys.clear()
                self.cached.clear()
                if publishing:
                    self.pending.append(AllBlocksCleared())
            elif e.kind in ("lookup", "released", "loading") and on_request_event is not None:
                on_request_event(e.kind, request_of(e.slot), e.num_computed_tokens)
            # "allocated" and "accessed" are the residency metrics' (kv_metrics).

    def stored(
        self, r: Request, group: int, first: int, kept: list[bool], block_size: int | None = None
    ) -> tuple[BlockStored, list[BlockHashWithGroupId]]:
        """vLLM's BlockStored for group ``group``'s blocks ``first..`` of
        ``r``, ``kept[i]`` whether block ``first + i`` was stored (a window
        group skips its nulls and what sparse retention leaves out; the
        tokens span them all), built as vLLM's block pool builds it, in
        blocks of the group's size or ``block_size``; and the keys stored."""
        r.update_block_hashes()  # vLLM's hasher, over the tokens so far
        bs = block_size or self.group_block_sizes[group]
        per_block = bs // self.hash_block_size
        hashes = r.block_hashes[per_block - 1 :: per_block]  # each block's: where it ends
        n = len(kept)
        stored = [first + i for i in range(n) if kept[i]]
        if stored and stored[-1] >= len(hashes):
            # The core and vLLM's hasher disagree on what a block's hash
            # covers: a broken setting, not a request's fault.
            raise ValueError(
                f"request {r.request_id!r}: block {stored[-1]} stored, but vLLM's "
                f"hasher has {len(hashes)} block hashes"
            )
        extra_keys = []
        lookahead = self.hash_lookahead
        lookahead_token_ids: list[list[int]] | None = [] if lookahead else None
        mm_index = 0
        for k in stored:
            start, end = k * bs, (k + 1) * bs
            if lookahead_token_ids is None:
                keys, mm_index = generate_block_hash_extra_keys(r, start, end, mm_index)
            else:
                keys, mm_index = generate_lookahead_block_hash_extra_keys(
                    r, start, end, end + lookahead, mm_index
                )
                lookahead_token_ids.append(r.all_token_ids[end : end + lookahead])
            extra_keys.append(keys)
        lora = r.lora_request
        kind, window = self.group_specs[group]
        keys = [make_block_hash_with_group_id(hashes[k], group) for k in stored]
        event = BlockStored(
            block_hashes=[maybe_convert_block_hash(hashes[k]) for k in stored],
            parent_block_hash=maybe_convert_block_hash(hashes[first - 1]) if first else None,
            token_ids=r.all_token_ids[first * bs : (first + n) * bs],
            block_size=bs,
            lora_id=None if lora is None else lora.adapter_id,
            medium=MEDIUM_GPU,
            lora_name=None if lora is None else lora.name,
            extra_keys=to_event_extra_keys(extra_keys),
            group_idx=group,
            kv_cache_spec_kind=kind,
            kv_cache_spec_sliding_window=window,
            session_id=r.session_id,
            lookahead_token_ids=lookahead_token_ids,
        )
        return event, keys

    def add_connector_events(self, events: Any) -> None:
        """A KV connector's own events, published after the cache's (vLLM
        publishes them whether or not its cache's events are on)."""
        if events:
            self.pending.extend(events)

    def publish(self) -> None:
        """Publish what is queued as one batch, as vLLM does at the end of
        each ``update_from_output``."""
        if self.pending:
            batch = KVEventBatch(ts=time.time(), events=self.pending)
            self.pending = []
            self.publisher.publish(batch)
