"""Load a local Hugging Face model directory: config, single or sharded
safetensors, tokenizer.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from ironbatch.model.config import ModelConfig, load_model_config
from ironbatch.model.llama import LlamaForCausalLM

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def resolve_dtype(dtype: str | torch.dtype, config: ModelConfig) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return DTYPES.get(config.torch_dtype or "float32", torch.float32)
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be 'auto' or one of {sorted(DTYPES)}, got {dtype!r}")
    return DTYPES[dtype]


def weight_files(model_dir: Path) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (json.JSONDecodeError, KeyError) as e:
            raise ValueError(f"{index} is not a valid safetensors index: {e}") from None
        return [model_dir / n for n in names]
    single = model_dir / "model.safetensors"
    if single.exists():
        return [single]
    raise ValueError(f"model directory {str(model_dir)!r} has no *.safetensors weights")


def load_model(
    model_dir: str | Path, dtype: str | torch.dtype = "auto", device: str | torch.device = "cpu"
) -> tuple[LlamaForCausalLM, ModelConfig]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(model_dir)
    config = load_model_config(path)
    torch_dtype = resolve_dtype(dtype, config)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    state: dict[str, torch.Tensor] = {}
    for f in weight_files(path):
        try:
            state.update(load_file(str(f)))
        except (SafetensorError, OSError) as e:
            raise ValueError(f"cannot read weights {str(f)!r}: {e}") from None
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    state = fuse_projections(state, config)
    expected = set(model.state_dict())
    if config.tie_word_embeddings:
        expected.discard("lm_head.weight")
    missing = sorted(expected - state.keys())
    if missing:
        raise ValueError(
            f"weights missing from {str(path)!r}: {missing[:5]}{' ...' if len(missing) > 5 else ''}"
        )
    state = {k: v.to(torch_dtype) for k, v in state.items() if k in expected}
    model.load_state_dict(state, strict=False, assign=True)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    for mod in model.modules():  # rotary buffers were made on the meta device
        if hasattr(mod, "inv_freq"):
            from ironbatch.model.rope import inv_frequencies

            mod.inv_freq = inv_frequencies(config.head_dim, config.rope)
    return model.to(device).eval(), config


def fuse_projections(
    state: dict[str, torch.Tensor], config: ModelConfig
) -> dict[str, torch.Tensor]:
    """HF's separate q/k/v and gate/up tensors, concatenated into the fused
    ``qkv_proj`` and ``gate_up_proj`` (missing pieces are left for the
    missing-weights check to report)."""
    for i in range(config.num_layers):
        for fused, parts in (
            ("self_attn.qkv_proj", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
            ("mlp.gate_up_proj", ("mlp.gate_proj", "mlp.up_proj")),
        ):
            for kind in ("weight", "bias"):
                names = [f"model.layers.{i}.{p}.{kind}" for p in parts]
                if all(n in state for n in names):
                    state[f"model.layers.{i}.{fused}.{kind}"] = torch.cat(
                        [state.pop(n) for n in names]
                    )
    return state


def load_tokenizer(model_dir: str | Path) -> Any | None:
    """The model's ``tokenizers`` tokenizer, or None if it ships none."""
    path = Path(model_dir) / "tokenizer.json"
    if not path.exists():
        return None
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(path))
