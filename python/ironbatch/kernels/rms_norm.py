"""``rms_norm``: RMSNorm of each row, optionally after adding the residual
stream, in one launch (docs/kernels.md §2.5).

With a residual it works in place, as a decoder layer needs it: ``residual
+= x`` (rounded to the model dtype, as the unfused add rounds), then ``x =
weight * norm(residual)``. The norm is computed in fp32 and rounded to the
model dtype before the weight multiplies it, which is what the torch path
(and Hugging Face's Llama) does, so the two differ only by the order of the
sum of squares."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ironbatch.kernels._common import check


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    residual_ptr,
    weight_ptr,
    out_ptr,
    stride_x: tl.int64,
    stride_residual: tl.int64,
    stride_out: tl.int64,
    eps,
    HIDDEN: tl.constexpr,
    BLOCK: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    ROUND: tl.constexpr,  # round intermediates to the model dtype (not for fp32)
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < HIDDEN
    dtype = x_ptr.dtype.element_ty
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * stride_residual + cols, mask=mask, other=0.0)
        x = x + r.to(tl.float32)
        if ROUND:
            x = x.to(dtype).to(tl.float32)
        tl.store(residual_ptr + row * stride_residual + cols, x.to(dtype), mask=mask)
    mean_square = tl.sum(x * x, 0) / HIDDEN
    normed = x * tl.rsqrt(mean_square + eps)
    if ROUND:
        normed = normed.to(dtype).to(tl.float32)
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, (normed * w).to(dtype), mask=mask)


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm over the last dimension of ``x`` (``[T, hidden]``, rows
    contiguous). Without ``residual``: returns ``(weight * norm(x), x)`` (a
    new tensor, and ``x`` as the residual stream). With it: ``residual +=
    x``, then ``x`` is overwritten by ``weight * norm(residual)``; returns
    ``(x, residual)``. Nothing is allocated in that case, so a decode step
    built from it can be captured in a CUDA graph."""
    check(x.dim() == 2, f"x must be [T, hidden], got {tuple(x.shape)}")
    num_tokens, hidden = x.shape
    check(x.stride(1) == 1, "x's rows must be contiguous")
    check(
        weight.shape == (hidden,) and weight.dtype == x.dtype,
        f"weight must be [{hidden}] of {x.dtype}, got {tuple(weight.shape)} of {weight.dtype}",
    )
    if residual is not None:
        check(
            residual.shape == x.shape and residual.dtype == x.dtype and residual.stride(1) == 1,
            f"residual must be like x {tuple(x.shape)} {x.dtype}, got "
            f"{tuple(residual.shape)} {residual.dtype}",
        )
    out = x if residual is not None else torch.empty_like(x)
    if num_tokens == 0:
        return out, x if residual is None else residual
    block = triton.next_power_of_2(hidden)
    _rms_norm_kernel[(num_tokens,)](
        x,
        x if residual is None else residual,
        weight,
        out,
        x.stride(0),
        x.stride(0) if residual is None else residual.stride(0),
        out.stride(0),
        eps,
        HIDDEN=hidden,
        BLOCK=block,
        HAS_RESIDUAL=residual is not None,
        ROUND=x.dtype != torch.float32,
        num_warps=4 if block <= 2048 else 8 if block <= 8192 else 16,
    )
    return out, x if residual is None else residual
