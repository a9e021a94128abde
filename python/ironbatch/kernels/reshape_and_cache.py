"""``reshape_and_cache``: write a step's new keys and values into the paged
KV cache through the slot mapping (docs/kernels.md §2.1)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ironbatch.kernels._common import check, check_cache


@triton.jit
def _reshape_and_cache_kernel(
    key_ptr,
    value_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_mapping_ptr,
    stride_key_t,
    stride_value_t,
    stride_cache_block,
    stride_cache_slot,
    ROW: tl.constexpr,  # num_kv_heads * head_dim
    TILE: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + t)
    if slot < 0:
        return  # a padding token
    dst = (slot // BLOCK_SIZE) * stride_cache_block + (slot % BLOCK_SIZE) * stride_cache_slot
    for start in range(0, ROW, TILE):
        cols = start + tl.arange(0, TILE)
        mask = cols < ROW
        k = tl.load(key_ptr + t * stride_key_t + cols, mask=mask)
        v = tl.load(value_ptr + t * stride_value_t + cols, mask=mask)
        tl.store(k_cache_ptr + dst + cols, k, mask=mask)
        tl.store(v_cache_ptr + dst + cols, v, mask=mask)


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Copy ``key[t]`` and ``value[t]`` (``[T, num_kv_heads, head_dim]``, each
    token's row contiguous) to cache slot ``slot_mapping[t]`` (int64; -1 =
    padding). Slots in one call must be distinct."""
    check_cache(k_cache, v_cache)
    _, block_size, num_kv_heads, head_dim = k_cache.shape
    for name, x in (("key", key), ("value", value)):
        check(
            x.dim() == 3 and tuple(x.shape[1:]) == (num_kv_heads, head_dim),
            f"{name} must be [T, {num_kv_heads}, {head_dim}], got {tuple(x.shape)}",
        )
        check(x.dtype == k_cache.dtype, f"{name} dtype {x.dtype} != cache dtype {k_cache.dtype}")
        check(
            x.stride(2) == 1 and x.stride(1) == head_dim,
            f"{name}'s heads and dims must be contiguous within a token",
        )
    check(
        key.shape[0] == value.shape[0] == slot_mapping.shape[0],
        f"key, value and slot_mapping disagree on T: {key.shape[0]}, {value.shape[0]}, "
        f"{slot_mapping.shape[0]}",
    )
    check(
        slot_mapping.dtype == torch.int64, f"slot_mapping must be int64, got {slot_mapping.dtype}"
    )
    num_tokens = key.shape[0]
    if num_tokens == 0:
        return
    row = num_kv_heads * head_dim
    _reshape_and_cache_kernel[(num_tokens,)](
        key,
        value,
        k_cache,
        v_cache,
        slot_mapping,
        key.stride(0),
        value.stride(0),
        k_cache.stride(0),
        k_cache.stride(1),
        ROW=row,
        TILE=min(2048, triton.next_power_of_2(row)),
        BLOCK_SIZE=block_size,
    )
