"""vLLM schedulers on the CPU, built the way vLLM's EngineCore builds them,
from a local model config (no weights, no network, no GPU): what the drop-in's
tests and ``benches/compare_vllm.py`` use to drive vLLM's scheduler and
``ironbatch.vllm.Scheduler`` side by side on the same inputs."""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import random
import tempfile
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from vllm.config import (
    CacheConfig,
    DeviceConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
    SpeculativeConfig,
    VllmConfig,
)
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
)
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

EOS = 2
DEFAULTS: dict[str, Any] = {
    "max_num_seqs": 16,
    "max_num_batched_tokens": 256,
    "max_model_len": 512,
    "enable_chunked_prefill": True,
    "long_prefill_token_threshold": 0,
    "policy": "fcfs",
    "block_size": 16,
    "num_blocks": 200,  # including the null block 0
    "enable_prefix_caching": True,
    "async_scheduling": False,
    "log_stats": True,
    "max_num_scheduled_tokens": None,
    "max_num_active_seqs": None,
    "long_prefill_token_threshold_adaptive": False,
    "watermark": 0.0,
    "mla": False,  # the KV cache as MLA models have it (MLAAttentionSpec)
    # The KV-cache groups, shaped as vLLM's engine groups a model's layers:
    # "full" (one group), "gpt-oss" (a sliding window, then full attention),
    # "gemma3" (five sliding windows, then full attention), "llama4" (three
    # chunked-local groups, then full attention), "none" (no KV cache: a
    # model with encoder-only attention, an encoder-only deployment; vLLM
    # gives it one block, the null block, and turns prefix caching off);
    # and with recurrent-state groups (Mamba, linear attention; vLLM's
    # mamba_cache_mode "align" with prefix caching, else "none"):
    # "qwen3-next" (three linear-attention groups, then full attention),
    # "jamba" (a Mamba group, then full attention), "swa-mamba" (a sliding
    # window, a Mamba group, full attention), "mamba" (a Mamba group alone);
    # `window` is the sliding window or the attention chunk, in tokens;
    # `mamba_block_size` a recurrent group's tokens per state block (None:
    # vLLM's default, the block size with prefix caching, else
    # max_model_len).
    "kv_layout": "full",
    # The full-attention group holds an EAGLE-style drafter's layers (vLLM's
    # planner flags it, is_eagle_group); False flags none, and vLLM then
    # drops a block in every group.
    "drafter_in_full_group": False,
    "window": 32,
    # Groups of other block sizes: a mixed-precision hybrid's (gpt-oss and
    # Gemma 3 layouts, held at another precision), or attention blocks
    # larger than a hybrid's recurrent states (Qwen3-Next with MTP; the
    # swa-mamba layout's window too): the windows' or the full group's own,
    # None for the cache's.
    "window_block_size": None,
    "full_block_size": None,
    "cross_block_size": None,
    "mamba_block_size": None,
    # The recurrent groups' specs alike (one layer type: Qwen3-Next's
    # linear attention), or unlike (states of two shapes with one page:
    # a hybrid of two recurrent layer types), which vLLM looks up apart.
    "mamba_specs_alike": True,
    # With prefix caching: the offsets at which the recurrent groups' backend
    # writes a prefill checkpoint inside a chunk (vLLM's
    # prefill_checkpoint_alignment with one num_prefill_checkpoint_blocks:
    # Mamba2's), None for none.
    "mamba_checkpoint_alignment": None,
    # vLLM's prefix_cache_retention_interval as its engine sets it (0: a
    # window group caches only the blocks a later request can resume from);
    # None caches them all.
    "retention_interval": 0,
    "prefill_schedule_interval": 1,
    # What this engine's scheduler sees of parallelism: a pipeline depth, and
    # data-parallel ranks (coordinated ones: MoE models).
    "pipeline_parallel_size": 1,
    "data_parallel_size": 1,
    # Decode context parallelism (with as many tensor-parallel ranks): each
    # rank holds every n-th token of a block, so vLLM schedules blocks of
    # block_size * n tokens.
    "decode_context_parallel_size": 1,
    # A local tokenizer folder (for grammars over it); None: no tokenizer.
    "tokenizer": None,
    # The target model's shape: "llama", "deepseek_mtp" (DeepSeek-V3's,
    # with MTP layers, for the "mtp" speculative method), "vision"
    # (Qwen2.5-VL's: images beside a Llama-like language model) or
    # "whisper" (an encoder-decoder: audio for the encoder, a decoder
    # self-attention group and a cross-attention group; as vLLM's engine
    # arguments do for such a model, prefix caching is off).
    "target": "llama",
    # For "deepseek_mtp": its MTP layers (num_nextn_predict_layers); above
    # one, with as many drafts, vLLM's multi-module MTP.
    "num_mtp_layers": 1,
    # For "vision" and "whisper": the encoder's compute budget and cache size, in
    # embeddings, as vLLM's MultiModalBudget would derive them from the
    # model's processor (which needs files this offline config lacks).
    "mm_budget": (64, 128),
    # vLLM's --disable-chunked-mm-input.
    "disable_chunked_mm_input": False,
    # vLLM's --enable-prompt-embeds: requests may give their prompt as
    # embeddings.
    "enable_prompt_embeds": False,
    # vLLM's --runner: "pooling" serves the target as an embedding model
    # (vLLM converts a causal LM with --convert embed, its default there).
    "runner": "generate",
    # vLLM's --mm-encoder-only (with the "vision" target): the instance runs
    # the multimodal encoder alone, with no KV cache (kv_layout "none").
    "mm_encoder_only": False,
    # The runner returns each sample's post-processing token support
    # (--return-sampling-mask).
    "return_sampling_mask": False,
    # Each output carries its tokens' routed experts
    # (--enable-return-routed-experts, vLLM's auxiliary outputs).
    "return_routed_experts": False,
}
# VllmConfig parts passed through as given (to exercise the fallback).
EXTRAS = (
    "lora_config",
    "speculative_config",
    "structured_outputs_config",
    "kv_events_config",
    "observability_config",
    "kv_transfer_config",
    "ec_transfer_config",
)


def _config_dir(prefix: str, config: dict[str, Any]) -> str:
    """A fresh folder holding ``config`` as its config.json."""
    path = tempfile.mkdtemp(prefix=prefix)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    return path


# The tiny Llama's shape, which its drafters share.
_TINY_LLAMA: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "vocab_size": 32000,
    "max_position_embeddings": 65536,
    "rms_norm_eps": 1e-6,
    "torch_dtype": "float16",
    "bos_token_id": 1,
    "eos_token_id": EOS,
}


@functools.cache
def tiny_model_dir() -> str:
    """A folder with a small Llama config.json: all vLLM reads here."""
    return _config_dir("ironbatch-tiny-llama-", _TINY_LLAMA)


# Each speculative method's tiny drafter: the architecture of a one-layer
# Llama-shaped draft config, or None where the drafter is the target's own
# (MTP layers) or a copy of the target (a draft model).
DRAFT_ARCHITECTURES: dict[str, str | None] = {
    "eagle": "EagleLlamaForCausalLM",
    "eagle3": "Eagle3LlamaForCausalLM",
    "mtp": None,
    "draft_model": None,
    "ngram": None,
    "ngram_gpu": None,
    "suffix": None,
    "extract_hidden_states": None,
    # DFlash and DSpark: Qwen3-shaped block drafters over the target's
    # hidden states (folders of their own: they name the target layers they
    # read).
    "dflash": "DFlashDraftModel",
    "dspark": "DSparkDraftModel",
    # A proposer class of the user's: vLLM imports it in the worker only,
    # which the harness stands in for, so its path names nothing here.
    "custom_class": None,
}


@functools.cache
def tiny_draft_dir(architecture: str) -> str:
    """A folder with a one-layer draft config of ``architecture`` over the
    tiny Llama's shapes."""
    config = _TINY_LLAMA | {"architectures": [architecture], "num_hidden_layers": 1}
    return _config_dir("ironbatch-tiny-draft-", config)


@functools.cache
def tiny_dflash_dir() -> str:
    """A folder with a one-layer DFlash drafter config over the tiny Llama's
    shapes, reading the target's two layers and masking with token 5."""
    config = _TINY_LLAMA | {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "num_hidden_layers": 1,
        "head_dim": _TINY_LLAMA["hidden_size"] // _TINY_LLAMA["num_attention_heads"],
        "dflash_config": {"target_layer_ids": [0, 1], "mask_token_id": 5},
    }
    return _config_dir("ironbatch-tiny-dflash-", config)


@functools.cache
def tiny_dspark_dir(sample_from_anchor: bool = True) -> str:
    """A folder with a one-layer Qwen3 DSpark drafter config over the tiny
    Llama's shapes, reading the target's two layers: it samples its first
    draft from the anchor (k lookahead slots) or, with
    ``sample_from_anchor=False``, fills in after a bonus query (k + 1)."""
    config = _TINY_LLAMA | {
        "architectures": ["DSparkDraftModel"],
        "model_type": "qwen3",
        "num_hidden_layers": 1,
        "head_dim": _TINY_LLAMA["hidden_size"] // _TINY_LLAMA["num_attention_heads"],
        "dspark_target_layer_ids": [0, 1],
        "use_aux_hidden_state": True,
        "sample_from_anchor": sample_from_anchor,
    }
    return _config_dir("ironbatch-tiny-dspark-", config)


@functools.cache
def tiny_mtp_model_dir(num_mtp_layers: int = 1) -> str:
    """A folder with a small DeepSeek-V3 config.json (MLA, MoE) carrying
    ``num_mtp_layers`` multi-token-prediction layers."""
    config = {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "hidden_size": 64,
        "intermediate_size": 128,
        "moe_intermediate_size": 32,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "num_hidden_layers": 2,
        "vocab_size": 32000,
        "max_position_embeddings": 65536,
        "rms_norm_eps": 1e-6,
        "torch_dtype": "bfloat16",
        "bos_token_id": 1,
        "eos_token_id": EOS,
        "kv_lora_rank": 16,
        "q_lora_rank": None,
        "qk_nope_head_dim": 16,
        "qk_rope_head_dim": 8,
        "v_head_dim": 16,
        "n_routed_experts": 4,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "first_k_dense_replace": 1,
        "moe_layer_freq": 1,
        "n_group": 1,
        "topk_group": 1,
        "routed_scaling_factor": 1.0,
        "scoring_func": "sigmoid",
        "topk_method": "noaux_tc",
        "num_nextn_predict_layers": num_mtp_layers,
    }
    return _config_dir("ironbatch-tiny-deepseek-", config)


# A tiny Qwen2.5-VL: a small vision tower beside the tiny Llama's shapes.
_TINY_VISION: dict[str, Any] = _TINY_LLAMA | {
    "architectures": ["Qwen2_5_VLForConditionalGeneration"],
    "model_type": "qwen2_5_vl",
    "rope_theta": 1000000.0,
    "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]},
    "image_token_id": 31000,
    "video_token_id": 31001,
    "vision_start_token_id": 31002,
    "vision_end_token_id": 31003,
    "vision_token_id": 31004,
    "vision_config": {
        "depth": 1,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "out_hidden_size": 64,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "window_size": 112,
        "fullatt_block_indexes": [0],
        "tokens_per_second": 2,
        "temporal_patch_size": 2,
        "in_chans": 3,
    },
}


@functools.cache
def tiny_vision_model_dir() -> str:
    """A folder with a small Qwen2.5-VL config.json."""
    return _config_dir("ironbatch-tiny-vision-", _TINY_VISION)


# A tiny Whisper: one encoder and one decoder layer.
_TINY_WHISPER: dict[str, Any] = {
    "architectures": ["WhisperForConditionalGeneration"],
    "model_type": "whisper",
    "d_model": 64,
    "encoder_layers": 1,
    "decoder_layers": 1,
    "encoder_attention_heads": 2,
    "decoder_attention_heads": 2,
    "encoder_ffn_dim": 128,
    "decoder_ffn_dim": 128,
    "vocab_size": 32000,
    "max_source_positions": 1500,
    "max_target_positions": 448,
    "num_mel_bins": 80,
    "is_encoder_decoder": True,
    "decoder_start_token_id": 1,
    "bos_token_id": 1,
    "eos_token_id": EOS,
    "pad_token_id": 0,
    "torch_dtype": "float16",
}


@functools.cache
def tiny_whisper_model_dir() -> str:
    """A folder with a small Whisper config.json."""
    return _config_dir("ironbatch-tiny-whisper-", _TINY_WHISPER)


class FixedMultiModalBudget:
    """Stands in for vLLM's ``MultiModalBudget`` where the model's processor
    cannot be built (no processor files offline): the same two numbers the
    scheduler reads from it, as given."""

    budget: tuple[int, int] = (0, 0)

    def __init__(self, vllm_config: Any, mm_registry: Any, **_: Any) -> None:
        self.encoder_compute_budget, self.encoder_cache_size = self.budget
        self.mm_max_toks_per_item = {"image": self.encoder_compute_budget}


@contextlib.contextmanager
def fixed_mm_budget(budget: tuple[int, int] | None) -> Iterator[None]:
    """vLLM's scheduler module (where both vLLM's scheduler and the drop-in
    look it up) reads ``budget`` as the encoder's, inside the block."""
    if budget is None:
        yield
        return
    from vllm.v1.core.sched import scheduler as vllm_scheduler

    real = vllm_scheduler.MultiModalBudget
    vllm_scheduler.MultiModalBudget = type(  # type: ignore[misc]
        "FixedMultiModalBudget", (FixedMultiModalBudget,), {"budget": budget}
    )
    try:
        yield
    finally:
        vllm_scheduler.MultiModalBudget = real  # type: ignore[misc]


def speculative_config(
    spec: dict[str, Any], model_config: ModelConfig, parallel_config: ParallelConfig
) -> SpeculativeConfig:
    """vLLM's SpeculativeConfig for ``spec`` (``--speculative-config``'s
    keys) over the target, its drafter the method's tiny one."""
    spec = dict(spec)
    method = spec.get("method")
    if method not in DRAFT_ARCHITECTURES:
        raise ValueError(f"speculative method must be one of {sorted(DRAFT_ARCHITECTURES)}")
    architecture = DRAFT_ARCHITECTURES[method]
    if method == "dflash":
        spec.setdefault("model", tiny_dflash_dir())
    elif method == "dspark":
        spec.setdefault("model", tiny_dspark_dir())
    elif method == "custom_class":
        spec.setdefault("model", "custom_proposer.Proposer")
    elif architecture is not None:
        spec.setdefault("model", tiny_draft_dir(architecture))
    elif method == "draft_model":
        spec.setdefault("model", tiny_model_dir())
    with suffix_decoding_allowed(method == "suffix"):
        return SpeculativeConfig(
            **spec, target_model_config=model_config, target_parallel_config=parallel_config
        )


@contextlib.contextmanager
def suffix_decoding_allowed(allowed: bool) -> Iterator[None]:
    """vLLM refuses suffix decoding without the arctic-inference package,
    whose suffix trees run in the worker; the scheduler reads only the
    config, so the harness lets vLLM build it without the package."""
    import vllm.config.speculative as speculative

    real = speculative.has_arctic_inference
    if allowed:
        speculative.has_arctic_inference = lambda: True
    try:
        yield
    finally:
        speculative.has_arctic_inference = real


def vllm_config(
    scheduler_cls: str | type | None = None, **settings: Any
) -> tuple[VllmConfig, KVCacheConfig]:
    """A VllmConfig and KVCacheConfig for DEFAULTS updated by ``settings``."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")
    cfg = {**DEFAULTS, **settings}
    unknown = set(cfg) - set(DEFAULTS) - set(EXTRAS)
    if unknown:
        raise TypeError(f"unknown settings {sorted(unknown)}")
    dirs = {"llama": tiny_model_dir, "deepseek_mtp": tiny_mtp_model_dir}
    dirs["vision"] = tiny_vision_model_dir
    dirs["whisper"] = tiny_whisper_model_dir
    whisper = cfg["target"] == "whisper"
    if cfg["target"] not in dirs:
        raise ValueError(f"target must be one of {sorted(dirs)}, got {cfg['target']!r}")
    if cfg["target"] == "deepseek_mtp":
        model_dir = tiny_mtp_model_dir(cfg["num_mtp_layers"])
    else:
        model_dir = dirs[cfg["target"]]()
    sc = SchedulerConfig(
        max_num_seqs=cfg["max_num_seqs"],
        max_num_batched_tokens=cfg["max_num_batched_tokens"],
        max_model_len=cfg["max_model_len"],
        enable_chunked_prefill=cfg["enable_chunked_prefill"],
        long_prefill_token_threshold=cfg["long_prefill_token_threshold"],
        policy=cfg["policy"],
        is_encoder_decoder=whisper,
        async_scheduling=cfg["async_scheduling"],
        scheduler_cls=scheduler_cls,
        max_num_scheduled_tokens=cfg["max_num_scheduled_tokens"],
        max_num_active_seqs=cfg["max_num_active_seqs"],
        long_prefill_token_threshold_adaptive=cfg["long_prefill_token_threshold_adaptive"],
        watermark=cfg["watermark"],
        prefill_schedule_interval=cfg["prefill_schedule_interval"],
        disable_chunked_mm_input=cfg["disable_chunked_mm_input"],
    )
    mc = ModelConfig(
        model=model_dir,
        tokenizer=cfg["tokenizer"] or model_dir,
        dtype="bfloat16" if cfg["target"] == "deepseek_mtp" else "float16",
        seed=42,
        max_model_len=cfg["max_model_len"],
        skip_tokenizer_init=cfg["tokenizer"] is None,
        enable_prompt_embeds=cfg["enable_prompt_embeds"],
        runner=cfg["runner"],
        mm_encoder_only=cfg["mm_encoder_only"] or None,
        return_sampling_mask=cfg["return_sampling_mask"],
        # vLLM replays the sampling distribution only over processed logprobs.
        **({"logprobs_mode": "processed_logprobs"} if cfg["return_sampling_mask"] else {}),
    )
    recurrent = cfg["kv_layout"] in RECURRENT_LAYOUTS
    # vLLM turns prefix caching off without a KV cache and for an
    # encoder-decoder.
    caching = cfg["enable_prefix_caching"] and not whisper and cfg["kv_layout"] != "none"
    cc = CacheConfig(
        block_size=cfg["block_size"],
        gpu_memory_utilization=0.9,
        cache_dtype="auto",
        enable_prefix_caching=caching,
        # Recurrent states with prefix caching: vLLM's mode "align", its
        # states of the cache's block size.
        **({"mamba_cache_mode": "align"} if recurrent and caching else {}),
    )
    dcp = cfg["decode_context_parallel_size"]
    pc = ParallelConfig(
        pipeline_parallel_size=cfg["pipeline_parallel_size"],
        data_parallel_size=cfg["data_parallel_size"],
        # vLLM splits a GQA model's KV heads first: more ranks than heads.
        tensor_parallel_size=dcp * _TINY_LLAMA["num_key_value_heads"] if dcp > 1 else 1,
        decode_context_parallel_size=dcp,
        distributed_executor_backend="mp",
    )
    extras = {k: cfg[k] for k in EXTRAS if k in cfg}
    if isinstance(extras.get("speculative_config"), dict):
        extras["speculative_config"] = speculative_config(extras["speculative_config"], mc, pc)
    vc = VllmConfig(
        scheduler_config=sc,
        model_config=mc,
        cache_config=cc,
        parallel_config=pc,
        device_config=DeviceConfig(device="cpu"),
        **extras,
    )
    # VllmConfig may resolve async scheduling from the platform; pin it.
    vc.scheduler_config.async_scheduling = cfg["async_scheduling"]
    if cfg["return_routed_experts"]:
        # vLLM builds it for a generating MoE model with prefix caching on its
        # V2 runner; a scheduler reads only the switch, so it is set after
        # the checks and the tiny dense target stands in for the MoE.
        vc.aux_output_config.enable_return_routed_experts = True
    kvc = KVCacheConfig(
        num_blocks=cfg["num_blocks"],
        kv_cache_tensors=[],
        kv_cache_groups=kv_cache_groups(
            cfg,
            num_speculative_tokens=vc.num_speculative_tokens,
            num_prefill_lookahead_tokens=vc.num_prefill_lookahead_tokens,
        ),
        prefix_cache_retention_interval=cfg["retention_interval"],
    )
    cc.num_gpu_blocks = cfg["num_blocks"]
    return vc, kvc


#: The layouts with recurrent-state groups (see DEFAULTS).
RECURRENT_LAYOUTS = ("qwen3-next", "jamba", "swa-mamba", "mamba")


def kv_cache_groups(
    cfg: dict[str, Any], *, num_speculative_tokens: int = 0, num_prefill_lookahead_tokens: int = 0
) -> list[KVCacheGroupSpec]:
    """The KV-cache groups of ``cfg["kv_layout"]`` (see DEFAULTS); a
    recurrent group keeps a scratch state per draft, as vLLM's Mamba layers
    ask, and a window the blocks of the tokens a drafter may prefill again
    (vLLM's engine sets ``extra_retained_tokens`` so)."""
    common = {"block_size": cfg["block_size"], "num_kv_heads": 1, "head_size": 1}
    common["dtype"] = torch.float32
    full_cls = MLAAttentionSpec if cfg["mla"] else FullAttentionSpec
    # A group of its own block size holds its KV at another precision (a
    # mixed-precision hybrid's, whose new blocks vLLM zeroes).
    half = {"dtype": torch.float16}
    full_common = {**common, "block_size": cfg["full_block_size"] or cfg["block_size"]}
    # (Beside recurrent states, larger attention blocks are vLLM's way to
    # match their page at one precision: Qwen3-Next's with MTP.)
    recurrent = cfg["kv_layout"] in RECURRENT_LAYOUTS
    if cfg["full_block_size"] and not recurrent:
        full_common |= half
    full = KVCacheGroupSpec(
        ["full"], full_cls(**full_common), is_eagle_group=cfg["drafter_in_full_group"]
    )
    layout, window = cfg["kv_layout"], cfg["window"]
    retained = max(0, num_prefill_lookahead_tokens - 1)
    if layout == "none":
        return []
    if cfg["target"] == "whisper":
        if layout != "full":
            raise ValueError(f"the whisper target has kv_layout full, got {layout!r}")
        cross = {**common, "block_size": cfg["cross_block_size"] or cfg["block_size"]}
        if cfg["cross_block_size"]:
            cross |= half
        return [full, KVCacheGroupSpec(["cross"], CrossAttentionSpec(**cross))]
    if layout == "full":
        return [full]
    if layout in ("gpt-oss", "gemma3"):
        own = {**common, "block_size": cfg["window_block_size"] or cfg["block_size"]}
        if cfg["window_block_size"]:
            own |= half
        swa = SlidingWindowSpec(sliding_window=window, extra_retained_tokens=retained, **own)
        n = 1 if layout == "gpt-oss" else 5
        return [KVCacheGroupSpec([f"swa{i}"], swa) for i in range(n)] + [full]
    if layout == "llama4":
        own = {**common, "block_size": cfg["window_block_size"] or cfg["block_size"]}
        if cfg["window_block_size"]:
            own |= half
        chunked = ChunkedLocalAttentionSpec(attention_chunk_size=window, **own)
        return [KVCacheGroupSpec([f"chunked{i}"], chunked) for i in range(3)] + [full]
    if layout in RECURRENT_LAYOUTS:
        # With prefix caching, vLLM's mode "align": states of the cache's
        # block size unless set.
        align = cfg["enable_prefix_caching"]
        default = cfg["block_size"] if align else cfg["max_model_len"]
        n = 3 if layout == "qwen3-next" else 1
        # (Unlike: the same page, one float, in two shapes.)
        shapes = [((1,),) if cfg["mamba_specs_alike"] or i % 2 else ((1, 1),) for i in range(n)]
        groups = [
            KVCacheGroupSpec(
                [f"mamba{i}"],
                MambaSpec(
                    block_size=cfg["mamba_block_size"] or default,
                    shapes=shapes[i],
                    dtypes=(torch.float32,),
                    mamba_cache_mode="align" if align else "none",
                    num_speculative_blocks=num_speculative_tokens,
                    num_prefill_checkpoint_blocks=int(
                        cfg["mamba_checkpoint_alignment"] is not None
                    ),
                    prefill_checkpoint_alignment=cfg["mamba_checkpoint_alignment"],
                ),
            )
            for i in range(n)
        ]
        if layout == "swa-mamba":
            own = {**common, "block_size": cfg["window_block_size"] or cfg["block_size"]}
            swa = SlidingWindowSpec(sliding_window=window, extra_retained_tokens=retained, **own)
            groups.insert(0, KVCacheGroupSpec(["swa"], swa))
        return groups if layout == "mamba" else [*groups, full]
    raise ValueError(
        "kv_layout must be full, gpt-oss, gemma3, llama4, none or one of "
        f"{RECURRENT_LAYOUTS}, got {layout!r}"
    )


def draw_layout(rng: random.Random, layout: str, block_size: int) -> dict[str, Any]:
    """Settings for a window ``layout`` drawn from ``rng``: a window or chunk
    from under a block to several (chunks whole blocks, as vLLM's chunked
    attention needs), and vLLM's retention interval 0 (sparse window
    caching) most often, else None (dense) or, beside sliding windows, 1 to
    8 blocks (sparse, with a tail kept per segment)."""
    bs = block_size
    if layout == "llama4":
        window = rng.choice([bs, 2 * bs, 4 * bs])
    else:
        window = rng.choice([bs // 2 + 1, bs + 3, 2 * bs, 5 * bs + 1])
    retention = rng.choice([0, 0, 0, None])
    # (Drawn apart, so the draws above stay each seed's; vLLM refuses an
    # interval without a sliding window.)
    segments = random.Random(rng.random())
    if layout != "llama4" and retention == 0 and segments.random() < 0.35:
        retention = bs * segments.choice([1, 2, 4, 8])
    return {"kv_layout": layout, "window": window, "retention_interval": retention}


def construct(cls: type, vc: VllmConfig, kvc: KVCacheConfig, log_stats: bool = True) -> Any:
    """Construct ``cls`` with the arguments vLLM's EngineCore passes: the
    block size its KV-cache groups schedule (decode context parallelism's
    ranks each hold part of a block; a recurrent group's blocks are its own
    size, and the scheduler's is the least common multiple)."""
    bs = vc.cache_config.block_size * vc.parallel_config.decode_context_parallel_size
    specs = [g.kv_cache_spec for g in kvc.kv_cache_groups]
    hash_bs = bs
    recurrent = [spec for spec in specs if isinstance(spec, MambaSpec)]
    if recurrent or len({spec.block_size for spec in specs}) > 1:
        # Groups of different block sizes (a mixed-precision hybrid, a
        # hybrid's states): the scheduler's is their least common multiple,
        # hashes their greatest common divisor's, unless nothing is hashed
        # (prefix caching off) or recurrent states are not cached (vLLM's
        # resolve_kv_cache_block_sizes).
        bs = math.lcm(*(spec.block_size for spec in specs))
        unaligned = any(spec.mamba_cache_mode != "align" for spec in recurrent)
        hashed = vc.cache_config.enable_prefix_caching and not unaligned
        hash_bs = math.gcd(*(spec.block_size for spec in specs)) if hashed else bs
    return cls(
        vllm_config=vc,
        kv_cache_config=kvc,
        structured_output_manager=StructuredOutputManager(vc),
        include_finished_set=False,
        log_stats=log_stats,
        block_size=bs,
        hash_block_size=hash_bs,
    )


def make_scheduler(kind: str, **settings: Any) -> Any:
    """``kind`` "vllm": vLLM's own scheduler class for the config (Scheduler
    or AsyncScheduler); "ironbatch": the drop-in, resolved by class path."""
    if kind not in ("vllm", "ironbatch"):
        raise ValueError(f"kind must be 'vllm' or 'ironbatch', got {kind!r}")
    cls_path = "ironbatch.vllm.Scheduler" if kind == "ironbatch" else None
    vc, kvc = vllm_config(cls_path, **settings)
    log_stats = settings.get("log_stats", DEFAULTS["log_stats"])
    encoder = settings.get("target") in ("vision", "whisper")
    with fixed_mm_budget(settings.get("mm_budget", DEFAULTS["mm_budget"]) if encoder else None):
        return construct(vc.scheduler_config.get_scheduler_cls(), vc, kvc, log_stats)


@functools.cache
def _block_hasher(block_size: int, hash_lookahead_tokens: int) -> Any:
    init_none_hash(sha256)  # EngineCore does this once at start-up
    return get_request_block_hasher(block_size, sha256, hash_lookahead_tokens)


def make_request(
    request_id: str,
    prompt_token_ids: Sequence[int],
    max_tokens: int = 16,
    *,
    block_size: int = DEFAULTS["block_size"],
    priority: int = 0,
    arrival_time: float = 0.0,
    cache_salt: str | None = None,
    client_index: int = 0,
    resumable: bool = False,
    hash_lookahead_tokens: int = 0,
    lora_request: Any = None,
    mm_features: Sequence[Any] | None = None,
    prompt_embeds: Any = None,
    prompt_is_token_ids: list[bool] | None = None,
    pooling_params: Any = None,
    **sampling: Any,
) -> Request:
    """A vLLM Request as EngineCore builds it (block hasher included, its
    hashes covering ``hash_lookahead_tokens`` after each block: the engine's
    ``num_hash_lookahead_tokens``); ``sampling`` goes to SamplingParams
    (min_tokens, ignore_eos, ...). With ``pooling_params`` (vLLM's
    PoolingParams, for a pooling model) it has no sampling parameters."""
    sp = None
    if pooling_params is None:
        sp = SamplingParams(max_tokens=max_tokens, **sampling)
        sp.update_from_generation_config({}, EOS)
    # A prompt of embeddings alone has no token ids; a mixed one has both.
    embeds_only = prompt_embeds is not None and prompt_is_token_ids is None
    return Request(
        request_id=request_id,
        prompt_token_ids=None if embeds_only else list(prompt_token_ids),
        prompt_embeds=prompt_embeds,
        prompt_is_token_ids=prompt_is_token_ids,
        sampling_params=sp,
        pooling_params=pooling_params,
        block_hasher=_block_hasher(block_size, hash_lookahead_tokens),
        arrival_time=arrival_time,
        priority=priority,
        cache_salt=cache_salt,
        client_index=client_index,
        resumable=resumable,
        lora_request=lora_request,
        mm_features=list(mm_features) if mm_features else None,
    )
