"""The Llama family (Llama, Mistral, Qwen2, Qwen3): GQA attention with RoPE
(Qwen3: per-head RMSNorm on q and k; Qwen2: qkv bias), RMSNorm, SwiGLU,
tied or untied embeddings. Parameter names follow the Hugging Face
checkpoints, so a state dict loads as it is. Forward runs on the flattened
tokens of a step; attention goes through a paged backend.

Checkpoint names are HF's; the loader fuses q/k/v into ``qkv_proj`` and
gate/up into ``gate_up_proj`` (fewer, larger matmuls: fewer kernel launches
per layer on a GPU). The layers pass the residual stream beside the hidden
states, so that with ``use_triton_kernels`` each norm adds the residual in
the same launch, and q/k norm, RoPE and the KV-cache write are one launch
(``ironbatch.kernels``); without it everything is plain torch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ironbatch.model.config import ModelConfig
from ironbatch.model.rope import RotaryEmbedding, StepRope, rotate


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        # ironbatch.kernels.rms_norm.rms_norm once the model uses the kernels.
        self.kernel: Callable[..., tuple[torch.Tensor, torch.Tensor]] | None = None

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``weight * norm(x + residual)`` and the residual stream after the
        add (``x`` itself without a residual). The kernel works in place."""
        if self.kernel is not None:
            return self.kernel(x, self.weight, self.eps, residual)
        if residual is not None:
            x = x + residual
        return self.normed(x), x

    def normed(self, x: torch.Tensor) -> torch.Tensor:
        # Normalised in fp32, scaled in the model dtype (as HF's Llama does).
        normed = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps)
        return self.weight * normed.to(x.dtype)


class Attention(nn.Module):
    """GQA attention with one fused q/k/v projection. q and k are normalised
    (Qwen3) and rotated together as one [T, Hq + Hkv, D] view; k and v reach
    the KV-cache write as strided views, without copies."""

    def __init__(self, c: ModelConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.num_heads, self.num_kv_heads, self.head_dim = c.num_heads, c.num_kv_heads, c.head_dim
        qkv = (c.num_heads + 2 * c.num_kv_heads) * c.head_dim
        self.qkv_proj = nn.Linear(c.hidden_size, qkv, bias=c.qkv_bias)
        self.o_proj = nn.Linear(c.num_heads * c.head_dim, c.hidden_size, bias=False)
        if c.qk_norm:
            self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps)
            self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps)
        self.qk_norm = c.qk_norm

    def forward(self, x: torch.Tensor, rope: StepRope, attn: Any) -> torch.Tensor:
        t, hq, hkv = x.shape[0], self.num_heads, self.num_kv_heads
        qkv = self.qkv_proj(x).view(t, hq + 2 * hkv, self.head_dim)
        if rope.cos_sin_table is not None:  # one kernel: q/k norm, RoPE, K/V into the cache
            q_norm, k_norm = (self.q_norm, self.k_norm) if self.qk_norm else (None, None)
            out = attn.forward_qkv(
                self.layer,
                qkv,
                num_q_heads=hq,
                positions=rope.positions,
                cos_sin_table=rope.cos_sin_table,
                q_norm_weight=None if q_norm is None else q_norm.weight,
                k_norm_weight=None if k_norm is None else k_norm.weight,
                eps=0.0 if q_norm is None else q_norm.eps,
            )
        else:
            qk = self.norm_and_rotate(qkv, rope)
            out = attn.forward(self.layer, qk[:, :hq], qk[:, hq:], qkv[:, hq + hkv :])
        return self.o_proj(out.reshape(t, hq * self.head_dim))

    def norm_and_rotate(self, qkv: torch.Tensor, rope: StepRope) -> torch.Tensor:
        """q and k of ``qkv``, normalised (Qwen3) and rotated, in plain torch."""
        hq, hkv = self.num_heads, self.num_kv_heads
        qk = qkv[:, : hq + hkv]
        if self.qk_norm:  # per-head RMSNorm, q's and k's weights side by side
            normed = F.rms_norm(qk.float(), (self.head_dim,), eps=self.q_norm.eps).to(qkv.dtype)
            weight = torch.cat(
                [self.q_norm.weight.expand(hq, -1), self.k_norm.weight.expand(hkv, -1)]
            )
            qk = weight * normed
        assert rope.cos is not None and rope.sin is not None
        return rotate(qk, rope.cos, rope.sin)


class MLP(nn.Module):
    """SwiGLU with one fused gate/up projection."""

    def __init__(self, c: ModelConfig) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(c.hidden_size, 2 * c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, c: ModelConfig, layer: int) -> None:
        super().__init__()
        self.self_attn = Attention(c, layer)
        self.mlp = MLP(c)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None, rope: StepRope, attn: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """This layer's output and the residual stream before it is added
        (the next norm adds it)."""
        x, residual = self.input_layernorm(x, residual)
        x = self.self_attn(x, rope, attn)
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x), residual


class LlamaModel(nn.Module):
    def __init__(self, c: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(c, i) for i in range(c.num_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(c.head_dim, c.rope)


class LlamaForCausalLM(nn.Module):
    def __init__(self, c: ModelConfig) -> None:
        super().__init__()
        self.config = c
        self.model = LlamaModel(c)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        if c.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        # With the Triton kernels: RoPE's fp32 cos/sin for every position.
        self.cos_sin_table: torch.Tensor | None = None

    def use_triton_kernels(self, max_positions: int) -> None:
        """Run the norms (with the residual add) and q/k norm + RoPE + the
        KV-cache write as ``ironbatch.kernels`` (the attention backend must
        be ``triton``); positions stay below ``max_positions``."""
        from ironbatch.kernels.rms_norm import rms_norm

        self.cos_sin_table = self.model.rotary_emb.cos_sin_table(max_positions)
        self.model.norm.kernel = rms_norm
        for layer in self.model.layers:
            layer.input_layernorm.kernel = rms_norm
            layer.post_attention_layernorm.kernel = rms_norm

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: Any) -> torch.Tensor:
        """Hidden states [T, hidden] for a step's flattened tokens."""
        x = self.model.embed_tokens(input_ids)
        if self.cos_sin_table is not None:
            rope = StepRope(positions, cos_sin_table=self.cos_sin_table)
        else:
            cos, sin = self.model.rotary_emb(positions)  # once per step, for every layer
            # applied in the model dtype, as HF does
            rope = StepRope(positions, cos=cos.to(x.dtype), sin=sin.to(x.dtype))
        residual = None
        for layer in self.model.layers:
            x, residual = layer(x, residual, rope, attn)
        return self.model.norm(x, residual)[0]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()
