"""What the Rust core cannot schedule yet, as one reason string (or None).

The configuration check runs once, when vLLM constructs the scheduler: any
reason there makes the whole engine use vLLM's own scheduler. The request
check runs per request under the drop-in, for the few features a request
can ask for without a configuration that announces them; such a request is
finished with an error instead of being scheduled wrongly."""

from __future__ import annotations

import math
from typing import Any

VLLM_VERSION = "0.33.0"  # the scheduler whose decisions the core makes

# Speculative methods whose scheduling the differential test proves equal to
# vLLM's (tests/vllm_dropin/test_vllm_differential.py draws each): n-gram
# lookup on the CPU and on the GPU (k drafts padded with -1), EAGLE, EAGLE-3,
# MTP (vLLM names every model's MTP "mtp"), a draft model, hidden-state
# extraction (it proposes the sampled tokens), DFlash (k + 1 lookahead
# slots), DSpark (k or k + 1), suffix decoding and a proposer class of the
# user's (drafts of any length up to k, no lookahead). That is every method
# vLLM 0.33 has; a method of another version uses vLLM's scheduler.
PROVEN_SPECULATIVE_METHODS = frozenset(
    {
        "ngram",
        "ngram_gpu",
        "eagle",
        "eagle3",
        "mtp",
        "draft_model",
        "extract_hidden_states",
        "dflash",
        "dspark",
        "suffix",
        "custom_class",
    }
)


def unsupported_config(
    vllm_config: Any, kv_cache_config: Any, block_size: int, hash_block_size: int | None
) -> str | None:
    """Why this engine configuration needs vLLM's own scheduler, if it does."""
    import vllm
    from vllm.v1.kv_cache_interface import (
        ChunkedLocalAttentionSpec,
        CrossAttentionSpec,
        FullAttentionSpec,
        MambaSpec,
        MLAAttentionSpec,
        SlidingWindowSpec,
    )

    from ironbatch.vllm.kv_cache_view import group_block_size
    from ironbatch.vllm.settings import drops_eagle_block

    if vllm.__version__ != VLLM_VERSION:
        # Another version may decide differently, or name its settings otherwise.
        return f"vLLM {vllm.__version__} (it makes vLLM {VLLM_VERSION}'s decisions)"

    c = vllm_config
    sc, mc, pc = c.scheduler_config, c.model_config, c.parallel_config
    groups = kv_cache_config.kv_cache_groups
    spec = c.speculative_config
    # The KV-cache groups the core models: full attention (or MLA, counted
    # and cached alike), sliding windows, chunked local attention and an
    # encoder-decoder's cross-attention, of one block size or of several,
    # and recurrent states (Mamba, linear attention) of their own
    # (docs/scheduling.md §7.13, §4.17, §7.15, §7.16).
    attention = (
        FullAttentionSpec,
        MLAAttentionSpec,
        SlidingWindowSpec,
        ChunkedLocalAttentionSpec,
        CrossAttentionSpec,
    )
    dcp = pc.decode_context_parallel_size
    recurrent = [g.kv_cache_spec for g in groups if type(g.kv_cache_spec) is MambaSpec]
    aligned = [s for s in recurrent if s.mamba_cache_mode == "align"]
    attention_sizes = {
        group_block_size(g.kv_cache_spec, dcp)
        for g in groups
        if type(g.kv_cache_spec) is not MambaSpec
    }
    # The groups whose blocks align prefix hits and caching: attention
    # (cross-attention too, which vLLM's scheduler block counts, though it
    # hashes nothing), and recurrent states cached in vLLM's mode "align".
    hashed_sizes = attention_sizes | {s.block_size for s in aligned}
    # Groups of different block sizes: a mixed-precision hybrid's (layers
    # that skip KV-cache quantization), or a hybrid's states smaller than
    # attention blocks grown to hold their page (Qwen3-Next with MTP).
    mixed_sizes = len(hashed_sizes) > 1
    # A chunked-local hit ends on its own blocks, which vLLM asserts at a
    # lookup are the scheduler block (the hashed sizes' least common
    # multiple).
    chunked_sizes = {
        group_block_size(g.kv_cache_spec, dcp)
        for g in groups
        if type(g.kv_cache_spec) is ChunkedLocalAttentionSpec
    }
    chunked_smaller = mixed_sizes and bool(chunked_sizes - {math.lcm(*hashed_sizes)})
    checks: list[tuple[bool, str]] = [
        (
            spec is not None and spec.method not in PROVEN_SPECULATIVE_METHODS,
            f"the {getattr(spec, 'method', None)!r} speculative method (proven: "
            f"{', '.join(sorted(PROVEN_SPECULATIVE_METHODS))})",
        ),
        (
            c.kv_transfer_config is not None,
            c.kv_transfer_config is not None and unsupported_connector(c, kv_cache_config) or "",
        ),
        (
            c.ec_transfer_config is not None,
            c.ec_transfer_config is not None and unsupported_ec_connector(c) or "",
        ),
        # Images and audio run through the core's encoder budget and cache
        # (docs/scheduling.md §4.15), an encoder-decoder's audio through its
        # slot count and cross-attention blocks (§4.17); a multimodal model
        # with every modality off is scheduled as text. Not yet: encoder-only
        # deployments, and options no test has combined with cross-attention.
        (
            # An encoder-only deployment samples nothing (docs/scheduling.md
            # §4.18); vLLM builds no drafter or pooler beside it.
            c.is_mm_encoder_only and (spec is not None or mc.runner_type != "generate"),
            "an encoder-only multimodal deployment (mm_encoder_only) with speculative "
            "decoding or a pooling runner",
        ),
        (
            mc.supports_multimodal_inputs and c.num_prefill_lookahead_tokens > 1,
            "multimodal inputs with multi-module MTP",
        ),
        (
            # Pooling models (embeddings, classification) are scheduled as
            # prefill-only requests (docs/scheduling.md §4.16).
            mc.runner_type not in ("generate", "pooling") or mc.is_diffusion,
            f"the {mc.runner_type!r} runner",
        ),
        (
            # A model without a KV cache (encoder-only attention, BERT and
            # kin; an encoder-only deployment) is scheduled with no KV-cache
            # group (§7.14); vLLM turns prefix caching off for it, and with
            # it forced on vLLM's own coordinator has no group to look in.
            not groups and c.cache_config.enable_prefix_caching,
            "a model without a KV cache with prefix caching on",
        ),
        (
            any(type(g.kv_cache_spec) not in (*attention, MambaSpec) for g in groups),
            "a KV cache with groups other than full-attention, MLA, sliding-window, "
            "chunked-local and Mamba ones",
        ),
        (
            # A state block of more than a hash block: vLLM then hits inside
            # a state block (its partial hash hits), which the core does
            # not model.
            any(s.block_size > math.gcd(*hashed_sizes) for s in aligned)
            or any(s.block_size > (hash_block_size or s.block_size) for s in aligned),
            "Mamba state blocks larger than the hash block with prefix caching on "
            "(prefix hits inside a state block)",
        ),
        (
            # vLLM's own lookup there runs past the lookahead hashes (an
            # IndexError in MambaManager.find_longest_cache_hit).
            bool(aligned) and c.num_prefill_lookahead_tokens > 1 and not attention_sizes,
            "multi-module MTP beside Mamba groups alone with prefix caching on "
            "(vLLM's lookup fails there)",
        ),
        (
            # Decode context parallelism shards a block's tokens across its
            # ranks: vLLM schedules blocks that many times larger. Attention
            # groups of one size unlike the scheduler's block are not known
            # to come from any deployment (recurrent groups have sizes of
            # their own).
            not mixed_sizes and not recurrent and bool(attention_sizes - {block_size}),
            "KV-cache groups of one block size unlike the scheduler's",
        ),
        (
            c.cache_config.enable_prefix_caching and chunked_smaller,
            "chunked-local groups of smaller blocks than others with prefix caching on "
            "(vLLM asserts at a prefix lookup)",
        ),
        (
            # vLLM turns its hybrid manager off for an EAGLE drafter beside
            # chunked local attention (one group then), and its coordinator
            # asserts against the two together.
            drops_eagle_block(c)
            and any(isinstance(g.kv_cache_spec, ChunkedLocalAttentionSpec) for g in groups),
            "EAGLE's last-block drop (lookahead block hashes off) with chunked local attention",
        ),
        (
            # Groups of different block sizes hash at their greatest common
            # divisor, as the core does (§7.16).
            hash_block_size not in (None, block_size)
            and not (mixed_sizes and hash_block_size == math.gcd(*hashed_sizes)),
            "a hash block size unlike the block size",
        ),
        (sc.policy not in ("fcfs", "priority"), f"the {sc.policy!r} policy"),
    ]
    return next((why for bad, why in checks if bad and why), None)


def unsupported_ec_connector(vllm_config: Any) -> str | None:
    """Why the core cannot take this deployment's encoder-cache connector,
    if it cannot (docs/scheduling.md §4.20): the core takes one beside an
    encoder whose outputs are shared by identifier, a vision or audio
    decoder's (an encoder-decoder's encoder runs per request)."""
    from vllm.multimodal import MULTIMODAL_REGISTRY

    from ironbatch.vllm.settings import encoder_budget

    mc = vllm_config.model_config
    if mc.is_encoder_decoder:
        return "an encoder-cache connector with an encoder-decoder model"
    if encoder_budget(vllm_config, MULTIMODAL_REGISTRY)[0] is None:
        return "an encoder-cache connector on a model without multimodal inputs"
    return None


def unsupported_connector(vllm_config: Any, kv_cache_config: Any) -> str | None:
    """Why the core cannot take this deployment's KV connector yet, if it
    cannot (docs/scheduling.md §4.19): the core takes connectors on
    attention KV-cache groups (full, MLA, sliding windows, chunked local
    attention) and recurrent states, several only beside a connector with
    hybrid support, as vLLM keeps them, of a model that generates. A
    connector that manages vLLM's GPU block pool itself (it overrides
    ``bind_gpu_block_pool``: SimpleCPUOffload, Mooncake's store, UMBP) needs
    vLLM's pool, which the drop-in does not have."""
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1
    from vllm.v1.kv_cache_interface import (
        ChunkedLocalAttentionSpec,
        FullAttentionSpec,
        MambaSpec,
        MLAAttentionSpec,
        SlidingWindowSpec,
    )

    c = vllm_config
    mc = c.model_config
    groups = kv_cache_config.kv_cache_groups
    if mc.is_encoder_decoder:
        return "a KV connector with an encoder-decoder model (vLLM refuses it)"
    attention = (FullAttentionSpec, MLAAttentionSpec, SlidingWindowSpec, ChunkedLocalAttentionSpec)
    kinds = (*attention, MambaSpec)
    if not groups or any(type(g.kv_cache_spec) not in kinds for g in groups):
        return "a KV connector with other than attention and recurrent-state KV-cache groups"
    if len(groups) > 1 and not KVConnectorFactory.supports_hma_config(c.kv_transfer_config):
        # (vLLM turns the hybrid manager off for it unless told otherwise,
        # and then refuses the connector when it builds it.)
        return "a KV connector without hybrid support beside several KV-cache groups"
    if kv_cache_config.hisparse_host_num_blocks is not None:
        return "a KV connector with HiSparse (deferred async loads)"
    for config in _connector_configs(c.kv_transfer_config):
        cls = KVConnectorFactory.get_connector_class(config)
        if cls.bind_gpu_block_pool is not KVConnectorBase_V1.bind_gpu_block_pool:
            return f"the {cls.__name__} KV connector (it manages vLLM's GPU block pool)"
    return None


def _connector_configs(config: Any) -> list[Any]:
    """A KV-transfer config and, for a MultiConnector, each of its own."""
    from vllm.config import KVTransferConfig

    if config.kv_connector != "MultiConnector":
        return [config]
    children = (config.kv_connector_extra_config or {}).get("connectors", [])
    found = []
    for child in children:
        found += _connector_configs(KVTransferConfig(**{"engine_id": config.engine_id, **child}))
    return found


def unsupported_request(request: Any) -> str | None:
    """Why this request cannot be scheduled by the drop-in, if it cannot."""
    sp = request.sampling_params
    checks: list[tuple[bool, str]] = [
        # A pooling request under a generating model (or the reverse)
        # cannot reach a scheduler: vLLM's front end refuses it.
        (sp is None and request.pooling_params is None, "a request without parameters"),
        (
            request.resumable and request.prompt_embeds is not None,
            "prompt embeddings in a streaming session",
        ),
    ]
    return next((why for bad, why in checks if bad), None)
