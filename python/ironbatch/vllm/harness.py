"""vLLM schedulers on the CPU, built the way vLLM's EngineCore builds them,
from a local model config (no weights, no network, no GPU): what the drop-in's
tests and ``benches/compare_vllm.py`` use to drive vLLM's scheduler and
``ironbatch.vllm.Scheduler`` side by side on the same inputs."""

from __future__ import annotations

import functools
import json
import os
import tempfile
from collections.abc import Sequence
from typing import Any

import torch
from vllm.config import (
    CacheConfig,
    DeviceConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
    VllmConfig,
)
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MLAAttentionSpec,
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
    "prefill_schedule_interval": 1,
    # What this engine's scheduler sees of parallelism: a pipeline depth, and
    # data-parallel ranks (coordinated ones: MoE models).
    "pipeline_parallel_size": 1,
    "data_parallel_size": 1,
    # A local tokenizer folder (for grammars over it); None: no tokenizer.
    "tokenizer": None,
}
# VllmConfig parts passed through as given (to exercise the fallback).
EXTRAS = (
    "lora_config",
    "speculative_config",
    "structured_outputs_config",
    "kv_events_config",
    "observability_config",
)


@functools.cache
def tiny_model_dir() -> str:
    """A folder with a small Llama config.json: all vLLM reads here."""
    path = tempfile.mkdtemp(prefix="ironbatch-tiny-llama-")
    config = {
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
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    return path


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
    model_dir = tiny_model_dir()
    sc = SchedulerConfig(
        max_num_seqs=cfg["max_num_seqs"],
        max_num_batched_tokens=cfg["max_num_batched_tokens"],
        max_model_len=cfg["max_model_len"],
        enable_chunked_prefill=cfg["enable_chunked_prefill"],
        long_prefill_token_threshold=cfg["long_prefill_token_threshold"],
        policy=cfg["policy"],
        is_encoder_decoder=False,
        async_scheduling=cfg["async_scheduling"],
        scheduler_cls=scheduler_cls,
        max_num_scheduled_tokens=cfg["max_num_scheduled_tokens"],
        max_num_active_seqs=cfg["max_num_active_seqs"],
        long_prefill_token_threshold_adaptive=cfg["long_prefill_token_threshold_adaptive"],
        watermark=cfg["watermark"],
        prefill_schedule_interval=cfg["prefill_schedule_interval"],
    )
    mc = ModelConfig(
        model=model_dir,
        tokenizer=cfg["tokenizer"] or model_dir,
        dtype="float16",
        seed=42,
        max_model_len=cfg["max_model_len"],
        skip_tokenizer_init=cfg["tokenizer"] is None,
    )
    cc = CacheConfig(
        block_size=cfg["block_size"],
        gpu_memory_utilization=0.9,
        cache_dtype="auto",
        enable_prefix_caching=cfg["enable_prefix_caching"],
    )
    pc = ParallelConfig(
        pipeline_parallel_size=cfg["pipeline_parallel_size"],
        data_parallel_size=cfg["data_parallel_size"],
        distributed_executor_backend="mp",
    )
    vc = VllmConfig(
        scheduler_config=sc,
        model_config=mc,
        cache_config=cc,
        parallel_config=pc,
        device_config=DeviceConfig(device="cpu"),
        **{k: cfg[k] for k in EXTRAS if k in cfg},
    )
    # VllmConfig may resolve async scheduling from the platform; pin it.
    vc.scheduler_config.async_scheduling = cfg["async_scheduling"]
    spec_cls = MLAAttentionSpec if cfg["mla"] else FullAttentionSpec
    spec = spec_cls(block_size=cfg["block_size"], num_kv_heads=1, head_size=1, dtype=torch.float32)
    kvc = KVCacheConfig(
        num_blocks=cfg["num_blocks"],
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)],
    )
    cc.num_gpu_blocks = cfg["num_blocks"]
    return vc, kvc


def construct(cls: type, vc: VllmConfig, kvc: KVCacheConfig, log_stats: bool = True) -> Any:
    """Construct ``cls`` with the arguments vLLM's EngineCore passes."""
    bs = vc.cache_config.block_size
    return cls(
        vllm_config=vc,
        kv_cache_config=kvc,
        structured_output_manager=StructuredOutputManager(vc),
        include_finished_set=False,
        log_stats=log_stats,
        block_size=bs,
        hash_block_size=bs,
    )


def make_scheduler(kind: str, **settings: Any) -> Any:
    """``kind`` "vllm": vLLM's own scheduler class for the config (Scheduler
    or AsyncScheduler); "ironbatch": the drop-in, resolved by class path."""
    if kind not in ("vllm", "ironbatch"):
        raise ValueError(f"kind must be 'vllm' or 'ironbatch', got {kind!r}")
    cls_path = "ironbatch.vllm.Scheduler" if kind == "ironbatch" else None
    vc, kvc = vllm_config(cls_path, **settings)
    log_stats = settings.get("log_stats", DEFAULTS["log_stats"])
    return construct(vc.scheduler_config.get_scheduler_cls(), vc, kvc, log_stats)


@functools.cache
def _block_hasher(block_size: int) -> Any:
    init_none_hash(sha256)  # EngineCore does this once at start-up
    return get_request_block_hasher(block_size, sha256)


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
    **sampling: Any,
) -> Request:
    """A vLLM Request as EngineCore builds it (block hasher included);
    ``sampling`` goes to SamplingParams (min_tokens, ignore_eos, ...)."""
    sp = SamplingParams(max_tokens=max_tokens, **sampling)
    sp.update_from_generation_config({}, EOS)
    return Request(
        request_id=request_id,
        prompt_token_ids=list(prompt_token_ids),
        sampling_params=sp,
        pooling_params=None,
        block_hasher=_block_hasher(block_size),
        arrival_time=arrival_time,
        priority=priority,
        cache_salt=cache_salt,
        client_index=client_index,
        resumable=resumable,
    )
