"""What the kernels' host wrappers share."""

from __future__ import annotations

import os

import torch


def interpreting() -> bool:
    """Whether Triton runs in its CPU interpreter (read at call time; the
    kernels' decorators read it at import)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def check(cond: bool, message: str) -> None:
    if not cond:
        raise ValueError(message)


def check_cache(k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    """Both caches ``[num_blocks, block_size, num_kv_heads, head_dim]``, one
    dtype, one device, the same strides, the last one 1."""
    check(
        k_cache.dim() == 4,
        f"k_cache must be 4-D [blocks, block_size, heads, dim], got {tuple(k_cache.shape)}",
    )
    check(
        k_cache.shape == v_cache.shape,
        f"v_cache shape {tuple(v_cache.shape)} != k_cache shape {tuple(k_cache.shape)}",
    )
    check(
        k_cache.dtype == v_cache.dtype,
        f"v_cache dtype {v_cache.dtype} != k_cache dtype {k_cache.dtype}",
    )
    check(k_cache.stride() == v_cache.stride(), "k_cache and v_cache must share strides")
    check(k_cache.stride(3) == 1, "the caches' last dimension must be contiguous")
    check(k_cache.stride(2) == k_cache.shape[3], "the caches' heads must be contiguous rows")
