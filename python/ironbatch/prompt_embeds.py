"""A prompt given as embeddings (vLLM's ``prompt_embeds``) as the scheduler
sees it: a digest of each block's rows, which keys that block's hash, so
that two prompts share prefix-cache blocks only where their embeddings are
equal (docs/scheduling.md §7.4). The scheduler never reads the values."""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np


def _rows_as_bytes(embeds: Any) -> tuple[memoryview, int]:
    """The embeddings' bytes, row after row, and their row count (a torch
    tensor of any dtype, or a NumPy array)."""
    if hasattr(embeds, "detach"):  # a torch tensor: torch is loaded already
        import torch

        t = embeds.detach().cpu().contiguous()
        return memoryview(t.view(-1).view(torch.uint8).numpy()), int(t.shape[0])
    a = np.ascontiguousarray(embeds)
    return memoryview(a.view(np.uint8).reshape(-1)), int(a.shape[0])


def check_prompt_embeds(embeds: Any, num_prompt_tokens: int) -> None:
    """Refuse embeddings that are not a 2-D tensor or array of one row per
    prompt position, or that hold NaN or infinity."""
    shape = getattr(embeds, "shape", None)
    if shape is None or len(shape) != 2:
        raise TypeError(
            "prompt_embeds must be a 2-D tensor or array (one row per prompt position), got "
            f"{type(embeds).__name__}{'' if shape is None else f' of shape {tuple(shape)}'}"
        )
    if int(shape[0]) != num_prompt_tokens:
        raise ValueError(
            f"prompt_embeds has {int(shape[0])} rows; the prompt has {num_prompt_tokens} positions"
        )
    values = embeds.detach().cpu().float().numpy() if hasattr(embeds, "detach") else embeds
    if not np.isfinite(np.asarray(values, dtype=np.float64)).all():
        raise ValueError("prompt_embeds must be finite (no NaN or infinity)")


def embeds_digests(embeds: Any, block_size: int, lookahead: int = 0) -> list[bytes]:
    """The digest of each block's rows, one per block the prompt overlaps:
    block ``k`` covers rows ``k·block_size`` up to ``(k+1)·block_size +
    lookahead`` (the hash lookahead's rows too), cut at the prompt's end."""
    data, n = _rows_as_bytes(embeds)
    row = len(data) // n if n else 0
    out = []
    for start in range(0, n, block_size):
        end = min(start + block_size + lookahead, n)
        out.append(hashlib.sha256(data[start * row : end * row]).digest())
    return out
