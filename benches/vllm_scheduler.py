"""Build and drive vLLM's own V1 Scheduler on the CPU, from a local model
config (no weights, no network): the reference for benches/compare_vllm.py
and benches/record_vllm.py. Needs a Python environment with vLLM installed
(see the README); ironbatch itself never imports vLLM outside
``ironbatch.vllm``."""

from __future__ import annotations

import json
import os
import tempfile
import time
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ.setdefault("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import vllm  # noqa: E402
from vllm.config import (  # noqa: E402
    CacheConfig,
    DeviceConfig,
    ModelConfig,
    SchedulerConfig,
    VllmConfig,
)
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
)
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

init_none_hash(sha256)
VERSION = vllm.__version__
_MODEL_DIR: str | None = None


def tiny_model_dir() -> str:
    """A folder with a small Llama config.json: all vLLM reads here."""
    global _MODEL_DIR
    if _MODEL_DIR is None:
        _MODEL_DIR = tempfile.mkdtemp(prefix="ironbatch-tiny-llama-")
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
            "eos_token_id": 2,
        }
        with open(os.path.join(_MODEL_DIR, "config.json"), "w") as f:
            json.dump(config, f)
    return _MODEL_DIR


def build(cfg: dict[str, Any]) -> Scheduler:
    """vLLM's Scheduler for an ironbatch-trace/1 style config dict."""
    model_dir = tiny_model_dir()
    sc = SchedulerConfig(
        max_num_seqs=cfg["max_num_seqs"],
        max_num_batched_tokens=cfg["max_num_batched_tokens"],
        max_model_len=cfg["max_model_len"],
        enable_chunked_prefill=cfg["enable_chunked_prefill"],
        long_prefill_token_threshold=cfg["long_prefill_token_threshold"],
        policy=cfg["policy"],
        is_encoder_decoder=False,
    )
    mc = ModelConfig(
        model=model_dir,
        tokenizer=model_dir,
        dtype="float16",
        seed=42,
        max_model_len=cfg["max_model_len"],
        skip_tokenizer_init=True,
    )
    cc = CacheConfig(
        block_size=cfg["block_size"],
        gpu_memory_utilization=0.9,
        cache_dtype="auto",
        enable_prefix_caching=cfg["enable_prefix_caching"],
    )
    vc = VllmConfig(
        scheduler_config=sc,
        model_config=mc,
        cache_config=cc,
        device_config=DeviceConfig(device="cpu"),
    )
    kvc = KVCacheConfig(
        num_blocks=cfg["num_blocks"],
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(
                ["layer"],
                FullAttentionSpec(
                    block_size=cfg["block_size"], num_kv_heads=1, head_size=1, dtype=torch.float32
                ),
            )
        ],
    )
    cc.num_gpu_blocks = cfg["num_blocks"]
    return Scheduler(
        vllm_config=vc,
        kv_cache_config=kvc,
        block_size=cfg["block_size"],
        log_stats=True,
        structured_output_manager=StructuredOutputManager(vc),
    )


def request(d: dict[str, Any], block_size: int) -> Request:
    """vLLM's Request for an ironbatch-trace/1 request object."""
    sp = SamplingParams(
        max_tokens=d["max_tokens"],
        min_tokens=d.get("min_tokens", 0),
        ignore_eos=d.get("ignore_eos", False),
        stop_token_ids=list(d.get("stop_token_ids", [])),
    )
    sp.update_from_generation_config({}, d.get("eos_token_id"))
    return Request(
        request_id=d["request_id"],
        prompt_token_ids=list(d["prompt_token_ids"]),
        sampling_params=sp,
        pooling_params=None,
        block_hasher=get_request_block_hasher(block_size, sha256),
        arrival_time=d.get("arrival_time", 0.0),
        priority=d.get("priority", 0),
    )


def runner_output(sched: Scheduler, so: Any, token: int) -> ModelRunnerOutput:
    """What a model runner returns: one token per request whose step reached
    its last known token (schedule() advanced num_computed_tokens already)."""
    ids = list(so.num_scheduled_tokens)
    sampled = []
    for rid in ids:
        r = sched.requests[rid]
        sampled.append([token] if r.num_computed_tokens >= r.num_tokens else [])
    return ModelRunnerOutput(
        req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)}, sampled_token_ids=sampled
    )


class VllmDriver:
    """vLLM's scheduler as an ``ironbatch.bench`` driver."""

    def __init__(self, workload: Any) -> None:
        self.name = f"vllm-{VERSION}"
        self.bs = workload.block_size
        self.sched = build(
            {
                "max_num_seqs": workload.max_num_seqs,
                "max_num_batched_tokens": workload.max_num_batched_tokens,
                "max_model_len": workload.max_model_len,
                "enable_chunked_prefill": True,
                "long_prefill_token_threshold": 0,
                "policy": "fcfs",
                "block_size": workload.block_size,
                "num_blocks": workload.num_blocks,
                "enable_prefix_caching": True,
            }
        )
        self.last_prefill_rows = -1

    def add(self, r: Any) -> None:
        p = r.sampling_params
        self.sched.add_request(
            request(
                {
                    "request_id": r.request_id,
                    "prompt_token_ids": r.prompt_token_ids,
                    "max_tokens": p.max_tokens,
                    "min_tokens": p.min_tokens,
                    "ignore_eos": p.ignore_eos,
                    "stop_token_ids": p.stop_token_ids,
                    "eos_token_id": r.eos_token_id,
                    "arrival_time": r.arrival_time,
                    "priority": r.priority,
                },
                self.bs,
            )
        )

    def step(self) -> float:
        t0 = time.perf_counter()
        so = self.sched.schedule()
        t1 = time.perf_counter()
        mro = runner_output(self.sched, so, 5)  # the model runner's part
        self.last_prefill_rows = int(
            np.count_nonzero(np.fromiter(so.num_scheduled_tokens.values(), dtype=np.int64) > 1)
        )
        t2 = time.perf_counter()
        self.sched.update_from_output(so, mro)
        t3 = time.perf_counter()
        return (t1 - t0) + (t3 - t2)

    def is_steady(self) -> bool:
        return self.last_prefill_rows == 0
