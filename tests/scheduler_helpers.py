"""Helpers for driving a Scheduler through steps in tests."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ironbatch import (
    CacheConfig,
    KVCacheGroup,
    LoRARequest,
    MultimodalInput,
    RepetitionDetectionParams,
    Request,
    SamplingParams,
    Scheduler,
    SchedulerConfig,
    reference,
)

BACKENDS = ["rust", "python"]


def make(
    backend: str,
    num_blocks: int = 10000,
    block_size: int = 16,
    caching: bool = True,
    kv_cache_groups: tuple[KVCacheGroup, ...] | None = None,
    sparse_retention: bool = True,
    retention_interval: int = 0,
    mixed_precision: bool = False,
    **sched: Any,
) -> Scheduler:
    sched.setdefault("max_model_len", 2048)
    return Scheduler(
        SchedulerConfig(**sched),
        CacheConfig(
            num_blocks=num_blocks,
            block_size=block_size,
            enable_prefix_caching=caching,
            kv_cache_groups=kv_cache_groups,
            sparse_retention=sparse_retention,
            retention_interval=retention_interval,
            mixed_precision=mixed_precision,
        ),
        backend=backend,
    )


def req(
    rid: str,
    tokens: Sequence[int],
    *,
    max_tokens: int = 16,
    min_tokens: int = 0,
    ignore_eos: bool = False,
    stop: Sequence[int] = (),
    priority: int = 0,
    arrival: float = 0.0,
    eos: int | None = 2,
    repetition: RepetitionDetectionParams | None = None,
    skip_reading_prefix_cache: bool = False,
    structured_output: bool = False,
    resumable: bool = False,
    lora: int | None = None,
    images: Sequence[MultimodalInput] = (),
    prompt_embeds: Any = None,
) -> Request:
    """A request; ``lora`` is an adapter's id (its name and path follow from
    it); ``images`` its multimodal inputs; ``prompt_embeds`` its prompt as
    embeddings."""
    return Request(
        rid,
        list(tokens),
        SamplingParams(
            max_tokens=max_tokens,
            min_tokens=min_tokens,
            ignore_eos=ignore_eos,
            stop_token_ids=list(stop),
            repetition_detection=repetition,
            skip_reading_prefix_cache=skip_reading_prefix_cache,
        ),
        eos_token_id=eos,
        priority=priority,
        arrival_time=arrival,
        structured_output=structured_output,
        resumable=resumable,
        lora_request=None if lora is None else LoRARequest(f"adapter-{lora}", lora, f"/a/{lora}"),
        mm_features=list(images) or None,
        prompt_embeds=prompt_embeds,
    )


def rows(out: Any) -> list[list[Any]]:
    """The step as docs/scheduling.md and the traces write it."""
    return [list(e) for e in out.entries()]


def step(s: Scheduler, tokens: int | Mapping[str, int] = 100) -> tuple[Any, list[list[Any]]]:
    """schedule() then update_from_output(), every request whose step reached
    its last known token sampling ``tokens`` (one id for all, or per id)."""
    out = s.schedule()
    sampled = {}
    for i, rid in enumerate(out.req_ids):
        if out.samples[i]:
            t = tokens if isinstance(tokens, int) else tokens.get(rid)
            if t is not None:
                sampled[rid] = [t]
    updates = s.update_from_output(out, sampled)
    return out, [[u.request_id, u.new_token_ids, u.finish_reason, u.stop_reason] for u in updates]


def kv_events(s: Any) -> list[tuple[Any, ...]]:
    """KV-cache events of the core (``CoreScheduler``) or the twin, as
    (kind, slot, first block, block ids or count), a store with its group
    last."""
    out = []
    for e in s.take_kv_events():
        if isinstance(e, reference.kv_events.Stored):
            out.append(("stored", e.owner, e.first_block, e.block_ids, e.group))
        elif isinstance(e, reference.kv_events.StoredKey):
            out.append(("stored_key", e.owner, e.num_hash_blocks, [e.block_id], e.group))
        elif isinstance(e, reference.kv_events.Hit):
            out.append(("hit", e.owner, 0, e.num_blocks))
        elif isinstance(e, reference.kv_events.Removed):
            out.append(("removed", None, 0, e.block_id))
        elif isinstance(e, reference.kv_events.Cleared):
            out.append(("cleared", None, 0, None))
        elif isinstance(e, reference.kv_events.Allocated):
            out.append(("allocated", None, 0, e.block_id))
        elif isinstance(e, reference.kv_events.Accessed):
            out.append(("accessed", None, 0, e.block_id))
        elif isinstance(e, reference.kv_events.Evicted):
            out.append(("evicted", None, 0, e.block_id))
        elif isinstance(e, reference.kv_events.Lookup):
            out.append(("lookup", e.owner, 0, None))
        elif isinstance(e, reference.kv_events.Released):
            out.append(("released", e.owner, 0, e.num_computed_tokens))
        elif isinstance(e, reference.kv_events.Loading):
            out.append(("loading", e.owner, 0, e.num_computed_tokens))
        elif e.kind == "stored":
            out.append(("stored", e.slot, e.first_block, e.block_ids, e.group))
        elif e.kind == "stored_key":
            out.append(("stored_key", e.slot, e.num_blocks, e.block_ids, e.group))
        elif e.kind == "hit":
            out.append(("hit", e.slot, 0, e.num_blocks))
        elif e.kind in ("removed", "allocated", "accessed", "evicted"):
            out.append((e.kind, None, 0, e.block_ids[0]))
        elif e.kind == "lookup":
            out.append(("lookup", e.slot, 0, None))
        elif e.kind in ("released", "loading"):
            out.append((e.kind, e.slot, 0, e.num_computed_tokens))
        else:
            out.append((e.kind, None, 0, None))
    return out
