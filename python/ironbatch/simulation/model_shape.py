"""A dense transformer's shape, from a Hugging Face ``config.json`` or a
preset, and what the roofline needs of it: the bytes of weights read per
step, KV-cache bytes per token, FLOPs per token and per attention pair."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "fp8": 1, "float8": 1}


@dataclass(frozen=True)
class ModelShape:
    name: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    dtype_bytes: int = 2
    kv_dtype_bytes: int = 2

    @property
    def layer_params(self) -> int:
        """Parameters of one decoder layer (attention and a gated MLP)."""
        h, d = self.hidden_size, self.head_dim
        attention = h * d * (2 * self.num_heads + 2 * self.num_kv_heads)
        return attention + 3 * h * self.intermediate_size

    @property
    def weight_bytes(self) -> float:
        """Read once a step: the layers and the LM head (an embedding
        lookup reads only its rows)."""
        params = self.num_layers * self.layer_params + self.vocab_size * self.hidden_size
        return float(params * self.dtype_bytes)

    @property
    def kv_bytes_per_token(self) -> float:
        return float(2 * self.num_layers * self.num_kv_heads * self.head_dim * self.kv_dtype_bytes)

    @property
    def flops_per_token(self) -> float:
        return 2.0 * self.num_layers * self.layer_params

    @property
    def flops_per_attention_pair(self) -> float:
        """QKᵀ and PV: two multiply-adds per head dimension per pair."""
        return 4.0 * self.num_layers * self.num_heads * self.head_dim

    @property
    def flops_per_sampled(self) -> float:
        return 2.0 * self.hidden_size * self.vocab_size


def _preset(name: str, **shape: Any) -> ModelShape:
    return ModelShape(name=name, **shape)


# Public architectures' shapes (their config.json files).
MODELS = {
    "llama-3.1-8b": _preset(
        "Llama-3.1-8B", hidden_size=4096, intermediate_size=14336, num_layers=32,
        num_heads=32, num_kv_heads=8, head_dim=128, vocab_size=128256,
    ),
    "llama-3.1-70b": _preset(
        "Llama-3.1-70B", hidden_size=8192, intermediate_size=28672, num_layers=80,
        num_heads=64, num_kv_heads=8, head_dim=128, vocab_size=128256,
    ),
    "qwen3-8b": _preset(
        "Qwen3-8B", hidden_size=4096, intermediate_size=12288, num_layers=36,
        num_heads=32, num_kv_heads=8, head_dim=128, vocab_size=151936,
    ),
    "qwen3-0.6b": _preset(
        "Qwen3-0.6B", hidden_size=1024, intermediate_size=3072, num_layers=28,
        num_heads=16, num_kv_heads=8, head_dim=128, vocab_size=151936,
    ),
}  # fmt: skip

MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")


def shape_from_config(config: dict[str, Any], name: str) -> ModelShape:
    """A dense model's shape from its ``config.json`` contents."""
    moe = [k for k in MOE_KEYS if config.get(k)]
    if moe:
        raise ValueError(
            f"{name}: the roofline models dense transformers; this config has {moe[0]} "
            "(mixture of experts)"
        )
    try:
        hidden = int(config["hidden_size"])
        heads = int(config["num_attention_heads"])
        shape = ModelShape(
            name=name,
            hidden_size=hidden,
            intermediate_size=int(config["intermediate_size"]),
            num_layers=int(config["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or hidden // heads),
            vocab_size=int(config["vocab_size"]),
            dtype_bytes=DTYPE_BYTES.get(
                str(config.get("torch_dtype") or config.get("dtype") or "bfloat16"), 2
            ),
        )
    except KeyError as e:
        raise ValueError(f"{name}: config.json lacks {e.args[0]!r}") from None
    return shape


def model_shape(spec: str) -> ModelShape:
    """A preset's name, or a model directory (or its config.json)."""
    if spec.lower() in MODELS:
        return MODELS[spec.lower()]
    path = Path(spec)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ValueError(
            f"roofline: model {spec!r} is neither a preset ({sorted(MODELS)}) nor a model "
            "directory with a config.json"
        )
    with open(path, encoding="utf-8") as f:
        return shape_from_config(json.load(f), os.fspath(spec))
