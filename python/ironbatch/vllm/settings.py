"""The core's settings from a vLLM engine's configuration: the same budgets,
caps, policy and options vLLM's scheduler reads, resolved the way vLLM
resolves them for this engine (its data and pipeline parallelism, its model
runner)."""

from __future__ import annotations

import math
from typing import Any

from ironbatch.config import CacheConfig, KVCacheGroup, SchedulerConfig
from ironbatch.core_scheduler import CoreScheduler


def core_scheduler(
    vllm_config: Any, kv_cache_config: Any, block_size: int, mm_registry: Any
) -> CoreScheduler:
    """The core scheduler vLLM's scheduler would be for this engine. vLLM's
    engine checked that the cache holds a ``max_model_len`` sequence; its
    scheduler (and so the core) runs with whatever it was given."""
    sc = vllm_config.scheduler_config
    spec = vllm_config.speculative_config
    lora = vllm_config.lora_config
    compute_budget, cache_size = encoder_budget(vllm_config, mm_registry)
    return CoreScheduler(
        SchedulerConfig(
            max_model_len=vllm_config.model_config.max_model_len,
            max_num_seqs=sc.max_num_seqs,
            max_num_batched_tokens=sc.max_num_batched_tokens,
            enable_chunked_prefill=sc.enable_chunked_prefill,
            long_prefill_token_threshold=sc.long_prefill_token_threshold,
            policy=sc.policy,
            scheduler_reserve_full_isl=sc.scheduler_reserve_full_isl,
            async_scheduling=bool(sc.async_scheduling),
            max_num_scheduled_tokens=sc.max_num_scheduled_tokens,
            max_num_active_seqs=sc.max_num_active_seqs,
            long_prefill_token_threshold_adaptive=sc.long_prefill_token_threshold_adaptive,
            watermark=sc.watermark,
            prefill_schedule_interval=local_prefill_interval(vllm_config),
            decode_stagger=decode_stagger(vllm_config),
            num_speculative_tokens=vllm_config.num_speculative_tokens,
            # What a drafter with its own forward pass adds, as vLLM derives
            # it from the speculative config (docs/scheduling.md §4.13).
            num_lookahead_tokens=vllm_config.num_lookahead_tokens,
            num_hash_lookahead_tokens=vllm_config.num_hash_lookahead_tokens,
            drop_eagle_block=drops_eagle_block(vllm_config),
            # The groups vLLM flags as holding the drafter's layers (none
            # flagged: every group drops, as vLLM falls back).
            eagle_groups=tuple(
                g for g, group in enumerate(kv_cache_config.kv_cache_groups) if group.is_eagle_group
            )
            or None,
            num_draft_slots=0 if spec is None else spec.max_num_new_slots_for_drafting,
            # Dynamic speculation lengths: vLLM's lookup, built as it builds it.
            drafts_by_batch_size=drafts_by_batch_size(vllm_config),
            max_loras=None if lora is None else lora.max_loras,
            encoder_compute_budget=compute_budget,
            encoder_cache_size=cache_size,
            disable_chunked_mm_input=sc.disable_chunked_mm_input,
            drafter_read_ahead=vllm_config.num_prefill_lookahead_tokens,
            runner=runner(vllm_config),
        ),
        CacheConfig(
            num_blocks=kv_cache_config.num_blocks,
            block_size=attention_block_size(vllm_config, kv_cache_config, block_size),
            enable_prefix_caching=vllm_config.cache_config.enable_prefix_caching,
            kv_cache_groups=kv_cache_groups(
                vllm_config,
                kv_cache_config,
                attention_block_size(vllm_config, kv_cache_config, block_size),
            ),
            # vLLM's default retention interval, 0, caches a window group's
            # blocks sparsely; None caches them all.
            sparse_retention=kv_cache_config.prefix_cache_retention_interval is not None,
            retention_interval=kv_cache_config.prefix_cache_retention_interval or 0,
            # Layers that skip KV-cache quantization: vLLM zeroes new blocks.
            mixed_precision=kv_cache_config.has_mixed_precision_kv_cache,
        ),
    )


def attention_block_size(vllm_config: Any, kv_cache_config: Any, block_size: int) -> int:
    """The block size of the cache's attention groups, the core's
    ``block_size``: the scheduler's (``block_size``, the least common
    multiple of every group's) unless recurrent groups, of their own block
    size, sit beside them. Attention groups of different block sizes (a
    mixed-precision hybrid's) give their greatest common divisor, vLLM's
    hash block size, each group its own (``kv_cache_groups``). A cache of
    recurrent groups alone has no token
    slots, and vLLM hashes nothing without prefix caching: the scheduler's
    block size, capped to what the core takes, is as good as any."""
    from vllm.v1.kv_cache_interface import MambaSpec

    from ironbatch.reference.limits import MAX_BLOCK_SIZE
    from ironbatch.vllm.kv_cache_view import group_block_size

    dcp = vllm_config.parallel_config.decode_context_parallel_size
    sizes = {
        group_block_size(g.kv_cache_spec, dcp)
        for g in kv_cache_config.kv_cache_groups
        if not isinstance(g.kv_cache_spec, MambaSpec)
    }
    return math.gcd(*sizes) if sizes else min(block_size, MAX_BLOCK_SIZE)


def drops_eagle_block(vllm_config: Any) -> bool:
    """Whether a prefix hit gives up its last block (vLLM's scheduler hands
    its KV-cache manager ``use_eagle_block_drop``, cleared by lookahead
    hashes; docs/scheduling.md §7.4): an EAGLE-style drafter with prefix
    caching and lookahead block hashes off, or beside a KV connector."""
    spec = vllm_config.speculative_config
    return (
        spec is not None
        and spec.use_eagle_block_drop()
        and vllm_config.cache_config.enable_prefix_caching
        and not vllm_config.num_hash_lookahead_tokens
    )


def drafts_by_batch_size(vllm_config: Any) -> tuple[int, ...] | None:
    """vLLM's dynamic speculation lengths as the core takes them: the drafts
    its runner proposes after a step, by the step's batch size (vLLM's own
    lookup, built as its scheduler builds it); None without them."""
    spec = vllm_config.speculative_config
    if spec is None or not spec.num_speculative_tokens_per_batch_size:
        return None
    from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

    return tuple(
        build_dynamic_sd_schedule_lookup(
            spec.num_speculative_tokens_per_batch_size,
            vllm_max_batch_size=vllm_config.scheduler_config.max_num_seqs,
            vllm_num_speculative_tokens=vllm_config.num_speculative_tokens,
        )
    )


def runner(vllm_config: Any) -> str:
    """What the model does with a step, as the core names it: an embedding
    or classification model pools each prompt and samples nothing (vLLM's
    num_sampled_tokens_per_step = 0); an encoder-only deployment
    (``--mm-encoder-only``) encodes each prompt's images and ends it once
    the prompt is consumed."""
    if vllm_config.model_config.runner_type == "pooling":
        return "pooling"
    return "encoder_only" if vllm_config.is_mm_encoder_only else "generate"


def encoder_budget(vllm_config: Any, mm_registry: Any) -> tuple[int | None, int | None]:
    """The encoder's compute budget and cache size, in embeddings, as vLLM's
    scheduler takes them from the model's processor (``MultiModalBudget``);
    (None, None) for a text model, or a multimodal one with every modality
    turned off (vLLM's budget is then 0: no request carries an image)."""
    if not vllm_config.model_config.supports_multimodal_inputs:
        return None, None
    # Looked up where vLLM's scheduler looks it up, so both read one budget.
    from vllm.v1.core.sched import scheduler as vllm_scheduler

    budget = vllm_scheduler.MultiModalBudget(vllm_config, mm_registry)
    if budget.encoder_compute_budget == 0:
        return None, None
    return budget.encoder_compute_budget, budget.encoder_cache_size


def kv_cache_groups(
    vllm_config: Any, kv_cache_config: Any, cache_block_size: int
) -> tuple[KVCacheGroup, ...] | None:
    """The KV-cache groups as the core takes them, in vLLM's order, with
    vLLM's admission cap for each window group and its own block size where
    it is not the cache's ``cache_block_size`` (a mixed-precision hybrid's);
    None for one full-attention (or MLA) group. An encoder-decoder's
    cross-attention group is one too, and so is a recurrent state's (Mamba,
    linear attention), with its own block size and its drafts' scratch
    states."""
    from vllm.v1.kv_cache_interface import (
        ChunkedLocalAttentionSpec,
        CrossAttentionSpec,
        MambaSpec,
        SlidingWindowSpec,
    )

    from ironbatch.vllm.kv_cache_view import group_block_size

    specs = [g.kv_cache_spec for g in kv_cache_config.kv_cache_groups]
    one_kind = SlidingWindowSpec | ChunkedLocalAttentionSpec | MambaSpec
    if len(specs) == 1 and not isinstance(specs[0], one_kind):
        return None
    max_len = vllm_config.model_config.max_model_len
    in_flight = vllm_config.max_in_flight_tokens
    dcp = vllm_config.parallel_config.decode_context_parallel_size

    def own_block_size(spec: Any) -> int | None:
        size = group_block_size(spec, dcp)
        return None if size == cache_block_size else size

    def group(spec: Any) -> KVCacheGroup:
        if isinstance(spec, SlidingWindowSpec | ChunkedLocalAttentionSpec):
            cap = spec.max_admission_blocks_per_request(
                max_in_flight_tokens=in_flight, max_model_len=max_len
            )
            if isinstance(spec, SlidingWindowSpec):
                return KVCacheGroup(
                    kind="sliding_window",
                    size=spec.sliding_window,
                    admission_cap_blocks=cap,
                    block_size=own_block_size(spec),
                )
            return KVCacheGroup(
                kind="chunked_local",
                size=spec.attention_chunk_size,
                admission_cap_blocks=cap,
                block_size=own_block_size(spec),
            )
        if isinstance(spec, CrossAttentionSpec):
            return KVCacheGroup(kind="cross_attention", block_size=own_block_size(spec))
        if isinstance(spec, MambaSpec):
            # A backend that writes prefill checkpoints inside a chunk (in
            # cache mode "align": Mamba2's) says at what offsets.
            checkpoints = spec.mamba_cache_mode == "align" and spec.num_prefill_checkpoint_blocks
            return KVCacheGroup(
                kind="mamba",
                size=spec.block_size,
                speculative_blocks=spec.num_speculative_blocks,
                prefill_checkpoint_alignment=spec.prefill_checkpoint_alignment
                if checkpoints
                else None,
            )
        return KVCacheGroup(kind="full", block_size=own_block_size(spec))

    return tuple(group(spec) for spec in specs)


def local_prefill_interval(vllm_config: Any) -> int:
    """``prefill_schedule_interval`` as the scheduler applies it itself: on
    an engine that is not data-parallel-coordinated (a data-parallel engine
    holds prefills through ``schedule(throttle_prefills=...)`` instead)."""
    if vllm_config.parallel_config.data_parallel_size != 1:
        return 1
    return vllm_config.scheduler_config.prefill_schedule_interval


def decode_stagger(vllm_config: Any) -> int:
    """``schedule()`` calls between a request's decodes: the pipeline depth
    under vLLM's V2 model runner with async scheduling (its sampled tokens
    travel a ring of that many slots), 1 on XPU without pipeline
    microbatching, 0 (off) otherwise."""
    if not (vllm_config.scheduler_config.async_scheduling and vllm_config.use_v2_model_runner):
        return 0
    import vllm.envs as envs
    from vllm.platforms import current_platform

    if current_platform.is_xpu() and not envs.VLLM_XPU_PP_MICROBATCH:
        return 1
    return vllm_config.parallel_config.pipeline_parallel_size
