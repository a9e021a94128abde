"""A small random-weight Llama, written as a Hugging Face model directory
(config.json + model.safetensors) so the demo loads it through the real
loader. No network, no transformers."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ironbatch.model.config import ModelConfig

DEMO_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 2048,
    "hidden_size": 128,
    "intermediate_size": 384,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "dtype": "float32",
}


def write_random_llama(
    directory: str | Path,
    seed: int = 0,
    config: dict | None = None,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
) -> Path:
    """``device`` draws the weights there (a GPU draws a 1B model in a
    moment; the values differ from the CPU's for the same seed)."""
    from safetensors.torch import save_file

    from ironbatch.model.config import load_model_config

    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config or DEMO_CONFIG, indent=2))
    if device == "cpu":
        torch.manual_seed(seed)
        gen = None
    else:
        gen = torch.Generator(device=device).manual_seed(seed)
    state = {
        name: torch.ones(shape, dtype=dtype)
        if name.endswith("norm.weight")
        else (torch.randn(shape, generator=gen, device=device) * 0.05).to(dtype).cpu()
        for name, shape in hf_tensor_shapes(load_model_config(path)).items()
    }
    save_file(state, str(path / "model.safetensors"))
    return path


def hf_tensor_shapes(c: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The tensors of a Hugging Face Llama-family checkpoint, by name."""
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (c.vocab_size, c.hidden_size),
        "model.norm.weight": (c.hidden_size,),
    }
    if not c.tie_word_embeddings:
        shapes["lm_head.weight"] = (c.vocab_size, c.hidden_size)
    q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    for i in range(c.num_layers):
        p = f"model.layers.{i}."
        shapes |= {
            p + "self_attn.q_proj.weight": (q, c.hidden_size),
            p + "self_attn.k_proj.weight": (kv, c.hidden_size),
            p + "self_attn.v_proj.weight": (kv, c.hidden_size),
            p + "self_attn.o_proj.weight": (c.hidden_size, q),
            p + "mlp.gate_proj.weight": (c.intermediate_size, c.hidden_size),
            p + "mlp.up_proj.weight": (c.intermediate_size, c.hidden_size),
            p + "mlp.down_proj.weight": (c.hidden_size, c.intermediate_size),
            p + "input_layernorm.weight": (c.hidden_size,),
            p + "post_attention_layernorm.weight": (c.hidden_size,),
        }
        if c.qkv_bias:
            shapes |= {
                p + "self_attn.q_proj.bias": (q,),
                p + "self_attn.k_proj.bias": (kv,),
                p + "self_attn.v_proj.bias": (kv,),
            }
        if c.qk_norm:
            shapes |= {
                p + "self_attn.q_norm.weight": (c.head_dim,),
                p + "self_attn.k_norm.weight": (c.head_dim,),
            }
    return shapes
