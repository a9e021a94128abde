"""Rotary position embeddings (rotate-half form), with llama3-style scaling."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ironbatch.model.config import RopeConfig


def inv_frequencies(head_dim: int, rope: RopeConfig) -> torch.Tensor:
    inv = 1.0 / (rope.theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    s = rope.scaling
    if s is None:
        return inv.float()
    # llama3: keep high frequencies, divide low ones by `factor`, blend between.
    factor = s["factor"]
    low, high = s.get("low_freq_factor", 1.0), s.get("high_freq_factor", 4.0)
    old_len = s["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv
    smooth = (old_len / wavelen - low) / (high - low)
    scaled = torch.where(wavelen > old_len / low, inv / factor, inv)
    mid = (wavelen <= old_len / low) & (wavelen >= old_len / high)
    return torch.where(mid, (1 - smooth) * inv / factor + smooth * inv, scaled).float()


class RotaryEmbedding(torch.nn.Module):
    """cos and sin per position, computed once per step and shared by every
    layer (``rotate`` applies them)."""

    def __init__(self, head_dim: int, rope: RopeConfig) -> None:
        super().__init__()
        self.register_buffer("inv_freq", inv_frequencies(head_dim, rope), persistent=False)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos()[:, None, :], emb.sin()[:, None, :]

    def cos_sin_table(self, max_positions: int) -> torch.Tensor:
        """fp32 ``[max_positions, head_dim]``: per position the cosines of the
        ``head_dim / 2`` frequencies, then their sines (what the fused kernel
        reads). The same fp32 products as ``forward``, so the same values."""
        positions = torch.arange(max_positions, device=self.inv_freq.device)
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        return torch.cat((freqs.cos(), freqs.sin()), dim=-1).contiguous()


@dataclass
class StepRope:
    """A step's rotary inputs, made once and shared by every layer: cos and
    sin per token in the model dtype (the torch path), or the positions and
    the precomputed fp32 table (the fused kernel)."""

    positions: torch.Tensor
    cos: torch.Tensor | None = None  # [T, 1, D]
    sin: torch.Tensor | None = None
    cos_sin_table: torch.Tensor | None = None  # [max_positions, D]


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` [T, H, D] to its positions (rotate-half form), in x's dtype."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
