"""A small random-weight Llama, written as a Hugging Face model directory
(config.json + model.safetensors) so the demo loads it through the real
loader. No network, no transformers."""

from __future__ import annotations

import json
from pathlib import Path

import torch

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
) -> Path:
    from safetensors.torch import save_file

    from ironbatch.model.config import load_model_config
    from ironbatch.model.llama import LlamaForCausalLM

    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config or DEMO_CONFIG, indent=2))
    torch.manual_seed(seed)
    with torch.device("meta"):  # shapes only; the weights are drawn below
        model = LlamaForCausalLM(load_model_config(path))
    state = {}
    for name, p in model.state_dict().items():
        if (
            name == "lm_head.weight"
            and "model.embed_tokens.weight" in state
            and ((config or DEMO_CONFIG).get("tie_word_embeddings"))
        ):
            continue  # tied: the checkpoint holds the embedding only
        if name.endswith("norm.weight"):
            state[name] = torch.ones(p.shape, dtype=dtype)
        else:
            state[name] = (torch.randn(p.shape) * 0.05).to(dtype)
    save_file(state, str(path / "model.safetensors"))
    return path
