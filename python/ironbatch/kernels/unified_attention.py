"""``unified_attention``: paged attention for a batch mixing chunked
prefills, prefix-hit continuations and decodes, in one kernel (docs/kernels.md §2.2).

A program owns one KV head and ``BLOCK_Q`` query tokens times the ``G`` query
heads that share that KV head (GQA packing), so each K/V tile is read once
for all of them: a decode step reads the cache once per KV head. Causality
is bottom-right: query ``i`` of a sequence sits at ``context_len + i``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ironbatch.kernels._common import check, check_cache, interpreting

#: Key segments per sequence on the split-KV decode path.
NUM_SEGMENTS = 16
#: Split when a decode batch has fewer (sequence, KV head) programs than this,
#: about the H200's 132 SMs: with fewer, the 2D grid leaves SMs idle.
SPLIT_KV_BELOW_PROGRAMS = 128


@dataclass(frozen=True)
class LaunchConfig:
    """How a kernel is launched on the GPU: keys per tile (the inner
    dimension of ``P V``, so at least 16), warps per program, software
    pipeline stages. ``benches/gpu/kernel_bench.py`` times alternatives
    (its decode sweep) so a GPU run can pick these (docs/kernels.md §4.3)."""

    tile: int
    num_warps: int
    num_stages: int


#: The 2D grid (prefill, mixed, and decode batches that fill the GPU).
LAUNCH_2D = LaunchConfig(tile=32, num_warps=4, num_stages=3)
#: The split-KV decode kernel.
LAUNCH_SPLIT_KV = LaunchConfig(tile=32, num_warps=4, num_stages=3)
#: The interpreter's cost is per program-tile, so bigger tiles test faster.
INTERPRETER_TILE = 64


def split_kv_scratch_numel(num_tokens: int, num_q_heads: int, head_dim: int) -> int:
    """fp32 elements of the split-KV scratch for ``num_tokens`` query rows:
    per (row, query head, segment) an accumulator of ``D_PAD`` plus its max
    and sum, and per (row, query head) how many segments hold keys.
    Preallocate this once and pass it as ``scratch`` so a decode step
    allocates nothing (docs/kernels.md §2.3)."""
    d_pad = max(16, triton.next_power_of_2(head_dim))
    return num_tokens * num_q_heads * (NUM_SEGMENTS * (d_pad + 2) + 1)


@triton.jit
def _find_seq(cu_seqlens_q_ptr, num_seqs, q_block, BLOCK_Q: tl.constexpr):
    """The sequence whose q-block range (starting at cu_q[s] // BLOCK_Q + s)
    holds ``q_block``: binary search, no host sync."""
    lo: tl.int32 = 0
    hi: tl.int32 = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        start = tl.load(cu_seqlens_q_ptr + mid) // BLOCK_Q + mid
        if start <= q_block:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def _load_query_rows(
    q_ptr,
    q_start,
    q_len,
    qb,
    context_len,
    kv_head,
    stride_q_t,
    stride_q_h,
    HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr,
    G: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """The program's BLOCK_M query rows (GQA packing): row m is query token
    qb*BLOCK_Q + m // G of the sequence, query head kv_head*G + m % G."""
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D_PAD)
    tok = qb * BLOCK_Q + offs_m // G
    head = kv_head * G + offs_m % G
    row_ok = (offs_m < BLOCK_Q * G) & (tok < q_len)
    d_ok = offs_d < HEAD_DIM
    q_row = (q_start + tok).to(tl.int64)
    q = tl.load(
        q_ptr
        + q_row[:, None] * stride_q_t
        + head[:, None].to(tl.int64) * stride_q_h
        + offs_d[None, :],
        mask=row_ok[:, None] & d_ok[None, :],
        other=0.0,
    )
    if UPCAST:
        q = q.to(tl.float32)
    q_pos = context_len + tok  # each row's absolute position
    return q, q_pos, row_ok, q_row, head, offs_d, d_ok


@triton.jit
def _attend_tiles(
    q,
    q_pos,
    row_ok,
    k_cache_ptr,
    v_cache_ptr,
    table_row,
    kv_head,
    t_begin,
    t_end,
    scale,
    stride_c_block,
    stride_c_slot,
    stride_c_head,
    offs_d,
    d_ok,
    BLOCK_M: tl.constexpr,
    D_PAD: tl.constexpr,
    TILE: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    UPCAST: tl.constexpr,
    IEEE: tl.constexpr,
):
    """Online softmax of the rows of ``q`` over keys ``[t_begin, t_end)``:
    returns the running max, sum and unnormalised accumulator (fp32)."""
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D_PAD], tl.float32)
    offs_t = tl.arange(0, TILE)
    for t0 in range(t_begin, t_end, TILE):
        pos = t0 + offs_t
        pos_ok = pos < t_end
        block = tl.load(table_row + pos // BLOCK_SIZE, mask=pos_ok, other=0).to(tl.int64)
        slot = block * stride_c_block + (pos % BLOCK_SIZE).to(tl.int64) * stride_c_slot
        base = slot + kv_head.to(tl.int64) * stride_c_head
        k = tl.load(
            k_cache_ptr + base[None, :] + offs_d[:, None],
            mask=pos_ok[None, :] & d_ok[:, None],
            other=0.0,
        )
        v = tl.load(
            v_cache_ptr + base[:, None] + offs_d[None, :],
            mask=pos_ok[:, None] & d_ok[None, :],
            other=0.0,
        )
        if UPCAST:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        if IEEE:
            scores = tl.dot(q, k, input_precision="ieee") * scale
        else:
            scores = tl.dot(q, k) * scale
        visible = (pos[None, :] <= q_pos[:, None]) & pos_ok[None, :] & row_ok[:, None]
        scores = tl.where(visible, scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # no exp(-inf - -inf)
        alpha = tl.exp(m_i - m_use)
        p = tl.exp(scores - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if IEEE:
            pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    return m_i, l_i, acc


@triton.jit
def _unified_attention_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    out_ptr,
    cu_seqlens_q_ptr,
    seq_lens_ptr,
    block_table_ptr,
    scale,
    num_seqs: tl.int32,
    stride_q_t: tl.int64,
    stride_q_h: tl.int64,
    stride_o_t: tl.int64,
    stride_o_h: tl.int64,
    stride_c_block: tl.int64,
    stride_c_slot: tl.int64,
    stride_c_head: tl.int64,
    stride_bt: tl.int64,
    HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr,
    G: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    TILE: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    UPCAST: tl.constexpr,  # cast loads to fp32 (the interpreter's bf16 is broken)
    IEEE: tl.constexpr,  # exact fp32 dots (fp32 inputs; TF32 otherwise)
):
    q_block = tl.program_id(0)
    kv_head = tl.program_id(1)
    s = _find_seq(cu_seqlens_q_ptr, num_seqs, q_block, BLOCK_Q)
    q_start = tl.load(cu_seqlens_q_ptr + s)
    q_len = tl.load(cu_seqlens_q_ptr + s + 1) - q_start
    qb = q_block - (q_start // BLOCK_Q + s)
    if qb * BLOCK_Q >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + s)
    context_len = seq_len - q_len

    q, q_pos, row_ok, q_row, head, offs_d, d_ok = _load_query_rows(
        q_ptr,
        q_start,
        q_len,
        qb,
        context_len,
        kv_head,
        stride_q_t,
        stride_q_h,
        HEAD_DIM,
        D_PAD,
        G,
        BLOCK_M,
        BLOCK_Q,
        UPCAST,
    )

    # The farthest key any row of this program may see.
    kv_end = tl.minimum(seq_len, context_len + qb * BLOCK_Q + (BLOCK_M - 1) // G + 1)
    m_i, l_i, acc = _attend_tiles(
        q,
        q_pos,
        row_ok,
        k_cache_ptr,
        v_cache_ptr,
        block_table_ptr + s.to(tl.int64) * stride_bt,
        kv_head,
        0,
        kv_end,
        scale,
        stride_c_block,
        stride_c_slot,
        stride_c_head,
        offs_d,
        d_ok,
        BLOCK_M,
        D_PAD,
        TILE,
        BLOCK_SIZE,
        UPCAST,
        IEEE,
    )
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    tl.store(
        out_ptr
        + q_row[:, None] * stride_o_t
        + head[:, None].to(tl.int64) * stride_o_h
        + offs_d[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=row_ok[:, None] & d_ok[None, :],
    )


@triton.jit
def _split_kv_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    acc_ptr,  # fp32 [T, Hq, NUM_SEGMENTS, D_PAD]
    ml_ptr,  # fp32 [2, T, Hq, NUM_SEGMENTS] maxima then sums, then [T, Hq] segments used
    cu_seqlens_q_ptr,
    seq_lens_ptr,
    block_table_ptr,
    scale,
    num_rows: tl.int64,  # T * Hq * NUM_SEGMENTS: where the sums start in ml_ptr
    stride_q_t: tl.int64,
    stride_q_h: tl.int64,
    stride_c_block: tl.int64,
    stride_c_slot: tl.int64,
    stride_c_head: tl.int64,
    stride_bt: tl.int64,
    NUM_Q_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr,
    G: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    TILE: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    NUM_SEGMENTS: tl.constexpr,
    UPCAST: tl.constexpr,
    IEEE: tl.constexpr,
):
    """Decode-only batches: segment g of sequence s's keys, for one KV head;
    stores the segment's unnormalised accumulator, max and sum (an empty
    segment returns at once, storing nothing), and segment 0 how many
    segments hold keys."""
    s = tl.program_id(0)
    kv_head = tl.program_id(1)
    g = tl.program_id(2)
    q_start = tl.load(cu_seqlens_q_ptr + s)
    q_len = tl.load(cu_seqlens_q_ptr + s + 1) - q_start
    if q_len == 0:
        return
    seq_len = tl.load(seq_lens_ptr + s)
    context_len = seq_len - q_len
    kv_end = tl.minimum(seq_len, context_len + (BLOCK_M - 1) // G + 1)
    tiles_per_segment = tl.cdiv(tl.cdiv(kv_end, TILE), NUM_SEGMENTS)
    t_begin = g * tiles_per_segment * TILE
    if t_begin >= kv_end:
        return  # an empty segment: the reduce reads only the segments with keys
    t_end = tl.minimum(t_begin + tiles_per_segment * TILE, kv_end)
    q, q_pos, row_ok, q_row, head, offs_d, d_ok = _load_query_rows(
        q_ptr,
        q_start,
        q_len,
        0,
        context_len,
        kv_head,
        stride_q_t,
        stride_q_h,
        HEAD_DIM,
        D_PAD,
        G,
        BLOCK_M,
        BLOCK_Q,
        UPCAST,
    )
    m_i, l_i, acc = _attend_tiles(
        q,
        q_pos,
        row_ok,
        k_cache_ptr,
        v_cache_ptr,
        block_table_ptr + s.to(tl.int64) * stride_bt,
        kv_head,
        t_begin,
        t_end,
        scale,
        stride_c_block,
        stride_c_slot,
        stride_c_head,
        offs_d,
        d_ok,
        BLOCK_M,
        D_PAD,
        TILE,
        BLOCK_SIZE,
        UPCAST,
        IEEE,
    )
    head_row = q_row * NUM_Q_HEADS + head
    row = head_row * NUM_SEGMENTS + g
    tl.store(acc_ptr + row[:, None] * D_PAD + offs_d[None, :], acc, mask=row_ok[:, None])
    tl.store(ml_ptr + row, m_i, mask=row_ok)
    tl.store(ml_ptr + num_rows + row, l_i, mask=row_ok)
    if g == 0:  # how many segments hold keys (segments 0 .. used - 1)
        used = tl.cdiv(tl.cdiv(kv_end, TILE), tiles_per_segment)
        tl.store(ml_ptr + 2 * num_rows + head_row, tl.zeros_like(m_i) + used, mask=row_ok)


@triton.jit
def _split_kv_reduce_kernel(
    acc_ptr,
    ml_ptr,
    out_ptr,
    cu_seqlens_q_ptr,
    num_seqs: tl.int32,
    num_rows: tl.int64,
    stride_o_t: tl.int64,
    stride_o_h: tl.int64,
    NUM_Q_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr,
    NUM_SEGMENTS: tl.constexpr,
):
    """out = sum_g w_g acc_g / sum_g w_g l_g with w_g = exp(m_g - max m)."""
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    if t >= tl.load(cu_seqlens_q_ptr + num_seqs):
        return  # a padding row
    offs_g = tl.arange(0, NUM_SEGMENTS)
    offs_d = tl.arange(0, D_PAD)
    head_row = t * NUM_Q_HEADS + h
    row = head_row * NUM_SEGMENTS + offs_g
    live = offs_g < tl.load(ml_ptr + 2 * num_rows + head_row)  # segments that hold keys
    m = tl.load(ml_ptr + row, mask=live, other=float("-inf"))
    sums = tl.load(ml_ptr + num_rows + row, mask=live, other=0.0)
    m_max = tl.max(m, 0)
    w = tl.exp(m - tl.where(m_max == float("-inf"), 0.0, m_max))
    den = tl.sum(w * sums, 0)
    acc = tl.load(acc_ptr + row[:, None] * D_PAD + offs_d[None, :], mask=live[:, None], other=0.0)
    num = tl.sum(w[:, None] * acc, 0)
    out = num / tl.where(den == 0.0, 1.0, den)
    tl.store(
        out_ptr + t * stride_o_t + h.to(tl.int64) * stride_o_h + offs_d,
        out.to(out_ptr.dtype.element_ty),
        mask=offs_d < HEAD_DIM,
    )


def unified_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    out: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    scale: float,
    max_seqlen_q: int,
    tile: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    split_kv: bool | None = None,
    scratch: torch.Tensor | None = None,
) -> None:
    """Attention of ``q`` (``[T, Hq, D]``) over the paged caches into ``out``.

    ``cu_seqlens_q`` (int32, S+1): query rows per sequence; ``seq_lens``
    (int32, S): each sequence's length after this step's tokens, whose K/V
    must already be in the cache; ``block_table`` (int32, ``[S, max_blocks]``).
    Rows past ``cu_seqlens_q[S]`` are padding: neither read nor written.
    ``max_seqlen_q`` only selects a variant: decode-only batches (1) with
    fewer than ``SPLIT_KV_BELOW_PROGRAMS`` (sequence, KV head) pairs split
    each sequence's keys into ``NUM_SEGMENTS`` programs and reduce (spec
    §2.3); ``split_kv`` forces either path. ``scratch`` (fp32, at least
    ``split_kv_scratch_numel`` elements) is used by the split path instead
    of allocating; ``tile``, ``num_warps`` and ``num_stages`` override the
    path's ``LaunchConfig``."""
    check_cache(k_cache, v_cache)
    _, block_size, num_kv_heads, head_dim = k_cache.shape
    check(
        q.dim() == 3 and q.shape[2] == head_dim,
        f"q must be [T, Hq, {head_dim}], got {tuple(q.shape)}",
    )
    check(q.stride(2) == 1, "q's last dimension must be contiguous")
    num_q_heads = q.shape[1]
    check(
        num_q_heads % num_kv_heads == 0,
        f"query heads ({num_q_heads}) must be a multiple of KV heads ({num_kv_heads})",
    )
    check(
        out.shape == q.shape and out.stride(2) == 1,
        f"out must be like q {tuple(q.shape)}, got {tuple(out.shape)}",
    )
    check(q.dtype == k_cache.dtype, f"q dtype {q.dtype} != cache dtype {k_cache.dtype}")
    num_seqs = seq_lens.shape[0]
    check(
        cu_seqlens_q.shape[0] == num_seqs + 1,
        f"cu_seqlens_q must have {num_seqs + 1} entries, got {cu_seqlens_q.shape[0]}",
    )
    check(
        block_table.dim() == 2 and block_table.shape[0] == num_seqs,
        f"block_table must be [{num_seqs}, max_blocks], got {tuple(block_table.shape)}",
    )
    for name, x in (
        ("cu_seqlens_q", cu_seqlens_q),
        ("seq_lens", seq_lens),
        ("block_table", block_table),
    ):
        check(x.dtype == torch.int32, f"{name} must be int32, got {x.dtype}")
    check(block_table.stride(1) == 1, "block_table rows must be contiguous")
    if num_seqs == 0 or q.shape[0] == 0:
        return
    g = num_q_heads // num_kv_heads
    block_m = 16 if g <= 16 else triton.next_power_of_2(g)
    block_q = block_m // g
    interp = interpreting()
    d_pad = max(16, triton.next_power_of_2(head_dim))
    upcast = interp and q.dtype != torch.float32
    ieee = q.dtype == torch.float32
    if split_kv is None:
        # From the batch shape alone (results stay batch-invariant): decode
        # batches too small to fill the GPU with one program per KV head.
        split_kv = max_seqlen_q == 1 and num_seqs * num_kv_heads < SPLIT_KV_BELOW_PROGRAMS
    launch = LAUNCH_SPLIT_KV if split_kv else LAUNCH_2D
    tile = tile or (INTERPRETER_TILE if interp else launch.tile)
    num_warps = num_warps or launch.num_warps
    num_stages = num_stages or launch.num_stages
    if split_kv:
        check(
            max_seqlen_q == 1,
            f"split-KV serves decode-only batches, got max_seqlen_q = {max_seqlen_q}",
        )
        rows = q.shape[0] * num_q_heads * NUM_SEGMENTS
        needed = split_kv_scratch_numel(q.shape[0], num_q_heads, head_dim)
        if scratch is None:
            scratch = torch.empty(needed, dtype=torch.float32, device=q.device)
        check(
            scratch.dtype == torch.float32
            and scratch.is_contiguous()
            and scratch.numel() >= needed,
            f"scratch must be contiguous float32 with at least {needed} elements, "
            f"got {scratch.dtype} with {scratch.numel()}",
        )
        acc = scratch[: rows * d_pad]
        ml = scratch[rows * d_pad : needed]  # maxima, sums, segments used
        _split_kv_kernel[(num_seqs, num_kv_heads, NUM_SEGMENTS)](
            q,
            k_cache,
            v_cache,
            acc,
            ml,
            cu_seqlens_q,
            seq_lens,
            block_table,
            scale,
            rows,
            q.stride(0),
            q.stride(1),
            k_cache.stride(0),
            k_cache.stride(1),
            k_cache.stride(2),
            block_table.stride(0),
            NUM_Q_HEADS=num_q_heads,
            HEAD_DIM=head_dim,
            D_PAD=d_pad,
            G=g,
            BLOCK_M=block_m,
            BLOCK_Q=block_q,
            TILE=tile,
            BLOCK_SIZE=block_size,
            NUM_SEGMENTS=NUM_SEGMENTS,
            UPCAST=upcast,
            IEEE=ieee,
            num_warps=num_warps,
            num_stages=num_stages,
        )
        _split_kv_reduce_kernel[(q.shape[0], num_q_heads)](
            acc,
            ml,
            out,
            cu_seqlens_q,
            num_seqs,
            rows,
            out.stride(0),
            out.stride(1),
            NUM_Q_HEADS=num_q_heads,
            HEAD_DIM=head_dim,
            D_PAD=d_pad,
            NUM_SEGMENTS=NUM_SEGMENTS,
        )
        return
    grid = (q.shape[0] // block_q + num_seqs, num_kv_heads)
    _unified_attention_kernel[grid](
        q,
        k_cache,
        v_cache,
        out,
        cu_seqlens_q,
        seq_lens,
        block_table,
        scale,
        num_seqs,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        block_table.stride(0),
        HEAD_DIM=head_dim,
        D_PAD=d_pad,
        G=g,
        BLOCK_M=block_m,
        BLOCK_Q=block_q,
        TILE=tile,
        BLOCK_SIZE=block_size,
        UPCAST=upcast,
        IEEE=ieee,
        num_warps=num_warps,
        num_stages=num_stages,
    )
