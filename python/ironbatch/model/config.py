"""ModelConfig: what ironbatch reads from a Hugging Face ``config.json``."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Architectures this runner implements, and what sets them apart.
ARCHITECTURES = {
    "LlamaForCausalLM": {"qk_norm": False},
    "MistralForCausalLM": {"qk_norm": False},
    "Qwen2ForCausalLM": {"qk_norm": False, "qkv_bias": True},
    "Qwen3ForCausalLM": {"qk_norm": True},
}


@dataclass(frozen=True)
class RopeConfig:
    theta: float = 10000.0
    # llama3-style scaling (None: plain RoPE)
    scaling: dict[str, Any] | None = None


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    qk_norm: bool
    rope: RopeConfig = field(default_factory=RopeConfig)
    eos_token_ids: tuple[int, ...] = ()
    torch_dtype: str | None = None


def _rope(cfg: dict[str, Any]) -> RopeConfig:
    # transformers >= 5 writes "rope_parameters"; older releases "rope_theta"
    # and "rope_scaling".
    params = cfg.get("rope_parameters") or {}
    theta = params.get("rope_theta", cfg.get("rope_theta", 10000.0))
    scaling = cfg.get("rope_scaling") or (
        params if params.get("rope_type") not in (None, "default") else None
    )
    if scaling is not None:
        kind = scaling.get("rope_type", scaling.get("type"))
        if kind in (None, "default"):
            scaling = None
        elif kind != "llama3":
            raise ValueError(f"rope scaling {kind!r} is not supported (only llama3)")
    return RopeConfig(theta=float(theta), scaling=scaling)


def load_model_config(model_dir: str | Path) -> ModelConfig:
    """Read ``config.json`` (and ``generation_config.json`` for EOS ids)."""
    path = Path(model_dir)
    if not path.is_dir():
        raise ValueError(f"model directory {str(path)!r} does not exist")
    try:
        cfg = json.loads((path / "config.json").read_text())
    except FileNotFoundError:
        raise ValueError(f"model directory {str(path)!r} has no config.json") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path / 'config.json'} is not valid JSON: {e}") from None
    archs = cfg.get("architectures") or []
    arch = next((a for a in archs if a in ARCHITECTURES), None)
    if arch is None:
        raise ValueError(
            f"architecture {archs!r} is not supported; supported: {sorted(ARCHITECTURES)}"
        )
    if cfg.get("use_sliding_window") and cfg.get("sliding_window"):
        raise ValueError("sliding-window attention is not supported yet")
    traits = ARCHITECTURES[arch]
    heads = cfg["num_attention_heads"]
    eos: list[int] = []
    for source in (cfg, _generation_config(path)):
        ids = source.get("eos_token_id")
        for i in ids if isinstance(ids, list) else [ids]:
            if isinstance(i, int) and i not in eos:
                eos.append(i)
    return ModelConfig(
        architecture=arch,
        vocab_size=cfg["vocab_size"],
        hidden_size=cfg["hidden_size"],
        intermediate_size=cfg["intermediate_size"],
        num_layers=cfg["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=cfg.get("num_key_value_heads") or heads,
        head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
        rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
        max_position_embeddings=cfg.get("max_position_embeddings", 2048),
        tie_word_embeddings=cfg.get("tie_word_embeddings", False),
        qkv_bias=traits.get("qkv_bias", False) or cfg.get("attention_bias", False),
        qk_norm=traits["qk_norm"],
        rope=_rope(cfg),
        eos_token_ids=tuple(eos),
        torch_dtype=cfg.get("dtype") or cfg.get("torch_dtype"),
    )


def _generation_config(path: Path) -> dict[str, Any]:
    try:
        return json.loads((path / "generation_config.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
