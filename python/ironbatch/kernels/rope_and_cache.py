"""``rope_and_cache``: one launch that takes a step's fused q/k/v projection
and applies Qwen3's per-head q/k RMSNorm (optional), rotates q and k to their
positions (RoPE, rotate-half form), leaves q in place for attention and
writes k and v into the paged KV cache through the slot mapping
(docs/kernels.md §2.6). Unfused, that is a norm, a rotation, a concatenation
and a cache write, several launches per layer.

The rounding follows the torch path step by step (the norm in fp32, rounded
to the model dtype, times its weight; then ``x·cos`` and ``rotated·sin``
each rounded, then their sum), so the two agree to the last bit except for
the norm's sum of squares."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ironbatch.kernels._common import check, check_cache

#: Heads one program handles (q, k and v heads of one token alike).
HEADS_PER_PROGRAM = 16
_TRITON_DTYPES = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


@triton.jit
def _rope_and_cache_kernel(
    qkv_ptr,
    positions_ptr,
    cos_sin_ptr,
    q_norm_ptr,
    k_norm_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_mapping_ptr,
    stride_qkv_t: tl.int64,
    stride_cos_sin: tl.int64,
    stride_cache_block: tl.int64,
    stride_cache_slot: tl.int64,
    eps,
    NUM_Q_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HALF_PAD: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    QK_NORM: tl.constexpr,
    RT: tl.constexpr,  # rounding type: the model dtype, or fp32 (no rounding)
):
    # x.to(RT).to(tl.float32) rounds x as the torch path rounds it; written
    # out rather than as a helper, which the interpreter calls slowly.
    t = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    half: tl.constexpr = HEAD_DIM // 2
    offs = tl.arange(0, HALF_PAD)
    d_ok = offs < half
    is_q = head < NUM_Q_HEADS
    is_k = (head >= NUM_Q_HEADS) & (head < NUM_Q_HEADS + NUM_KV_HEADS)
    is_v = (head >= NUM_Q_HEADS + NUM_KV_HEADS) & (head < NUM_Q_HEADS + 2 * NUM_KV_HEADS)
    mask = (is_q | is_k | is_v)[:, None] & d_ok[None, :]
    dtype = qkv_ptr.dtype.element_ty
    row = qkv_ptr + t * stride_qkv_t + head[:, None].to(tl.int64) * HEAD_DIM + offs[None, :]
    x1 = tl.load(row, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(row + half, mask=mask, other=0.0).to(tl.float32)
    y1, y2 = x1, x2
    if QK_NORM:  # per-head RMSNorm, q's weight on q heads and k's on k heads
        mean_square = (tl.sum(x1 * x1, 1) + tl.sum(x2 * x2, 1)) / HEAD_DIM
        inv = tl.rsqrt(mean_square + eps)[:, None]
        qw1 = tl.load(q_norm_ptr + offs, mask=d_ok, other=0.0).to(tl.float32)[None, :]
        qw2 = tl.load(q_norm_ptr + half + offs, mask=d_ok, other=0.0).to(tl.float32)[None, :]
        kw1 = tl.load(k_norm_ptr + offs, mask=d_ok, other=0.0).to(tl.float32)[None, :]
        kw2 = tl.load(k_norm_ptr + half + offs, mask=d_ok, other=0.0).to(tl.float32)[None, :]
        w1 = tl.where(is_q[:, None], qw1, kw1)
        w2 = tl.where(is_q[:, None], qw2, kw2)
        y1 = ((x1 * inv).to(RT).to(tl.float32) * w1).to(RT).to(tl.float32)
        y2 = ((x2 * inv).to(RT).to(tl.float32) * w2).to(RT).to(tl.float32)
    position = tl.load(positions_ptr + t)
    cs = cos_sin_ptr + position * stride_cos_sin
    cos = tl.load(cs + offs, mask=d_ok, other=0.0).to(RT).to(tl.float32)[None, :]
    sin = tl.load(cs + half + offs, mask=d_ok, other=0.0).to(RT).to(tl.float32)[None, :]
    a1, b1 = (y1 * cos).to(RT).to(tl.float32), (y2 * sin).to(RT).to(tl.float32)
    a2, b2 = (y2 * cos).to(RT).to(tl.float32), (y1 * sin).to(RT).to(tl.float32)
    r1 = (a1 - b1).to(RT).to(tl.float32)
    r2 = (a2 + b2).to(RT).to(tl.float32)
    # q stays in place for attention; k (rotated) and v go to the cache.
    q_mask = is_q[:, None] & d_ok[None, :]
    tl.store(row, r1.to(dtype), mask=q_mask)
    tl.store(row + half, r2.to(dtype), mask=q_mask)
    slot = tl.load(slot_mapping_ptr + t)
    if slot >= 0:  # slot -1: a token whose K/V is not kept
        dst = (slot // BLOCK_SIZE) * stride_cache_block + (slot % BLOCK_SIZE) * stride_cache_slot
        kv_head = tl.where(is_k, head - NUM_Q_HEADS, head - NUM_Q_HEADS - NUM_KV_HEADS)
        at = dst + kv_head[:, None].to(tl.int64) * HEAD_DIM + offs[None, :]
        k_mask = is_k[:, None] & d_ok[None, :]
        v_mask = is_v[:, None] & d_ok[None, :]
        tl.store(k_cache_ptr + at, r1.to(dtype), mask=k_mask)
        tl.store(k_cache_ptr + at + half, r2.to(dtype), mask=k_mask)
        tl.store(v_cache_ptr + at, x1.to(dtype), mask=v_mask)
        tl.store(v_cache_ptr + at + half, x2.to(dtype), mask=v_mask)


def rope_and_cache(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    cos_sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    num_q_heads: int,
    q_norm_weight: torch.Tensor | None = None,
    k_norm_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
) -> torch.Tensor:
    """``qkv`` is ``[T, Hq + 2·Hkv, D]`` (q heads, then k, then v; heads and
    dims contiguous within a token, tokens strided); ``positions`` int64
    ``[T]``; ``cos_sin`` fp32 ``[max_positions, D]``, each row the cosines
    of the ``D/2`` frequencies then their sines. With both norm weights
    (``[D]``), q and k heads are RMS-normalised first. q is rotated in place
    and returned as the view ``qkv[:, :Hq]``; rotated k and v are written to
    cache slot ``slot_mapping[t]`` (int64; a negative slot writes nothing)."""
    check_cache(k_cache, v_cache)
    _, block_size, num_kv_heads, head_dim = k_cache.shape
    heads = num_q_heads + 2 * num_kv_heads
    check(
        qkv.dim() == 3 and tuple(qkv.shape[1:]) == (heads, head_dim),
        f"qkv must be [T, {heads}, {head_dim}], got {tuple(qkv.shape)}",
    )
    check(
        qkv.stride(2) == 1 and qkv.stride(1) == head_dim,
        "qkv's heads and dims must be contiguous within a token",
    )
    check(qkv.dtype == k_cache.dtype, f"qkv dtype {qkv.dtype} != cache dtype {k_cache.dtype}")
    check(head_dim % 2 == 0, f"RoPE needs an even head size, got {head_dim}")
    num_tokens = qkv.shape[0]
    check(
        positions.shape == (num_tokens,) and positions.dtype == torch.int64,
        f"positions must be int64 [{num_tokens}], got {positions.dtype} {tuple(positions.shape)}",
    )
    check(
        slot_mapping.shape == (num_tokens,) and slot_mapping.dtype == torch.int64,
        f"slot_mapping must be int64 [{num_tokens}], got {slot_mapping.dtype} "
        f"{tuple(slot_mapping.shape)}",
    )
    check(
        cos_sin.dim() == 2 and cos_sin.shape[1] == head_dim and cos_sin.dtype == torch.float32,
        f"cos_sin must be float32 [max_positions, {head_dim}], got {cos_sin.dtype} "
        f"{tuple(cos_sin.shape)}",
    )
    check(cos_sin.stride(1) == 1, "cos_sin's rows must be contiguous")
    qk_norm = q_norm_weight is not None
    check(qk_norm == (k_norm_weight is not None), "q_norm_weight and k_norm_weight come together")
    if qk_norm:
        for name, w in (("q_norm_weight", q_norm_weight), ("k_norm_weight", k_norm_weight)):
            assert w is not None
            check(
                w.shape == (head_dim,) and w.is_contiguous(),
                f"{name} must be a contiguous [{head_dim}], got {tuple(w.shape)}",
            )
    q = qkv[:, :num_q_heads]
    if num_tokens == 0:
        return q
    block_h = min(HEADS_PER_PROGRAM, triton.next_power_of_2(heads))
    _rope_and_cache_kernel[(num_tokens, triton.cdiv(heads, block_h))](
        qkv,
        positions,
        cos_sin,
        q_norm_weight if qk_norm else cos_sin,  # unread without QK_NORM
        k_norm_weight if qk_norm else cos_sin,
        k_cache,
        v_cache,
        slot_mapping,
        qkv.stride(0),
        cos_sin.stride(0),
        k_cache.stride(0),
        k_cache.stride(1),
        eps,
        NUM_Q_HEADS=num_q_heads,
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        HALF_PAD=triton.next_power_of_2(head_dim // 2),
        BLOCK_H=block_h,
        BLOCK_SIZE=block_size,
        QK_NORM=qk_norm,
        RT=_TRITON_DTYPES[qkv.dtype],
    )
    return q
