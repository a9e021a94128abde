"""The fused Triton kernels under the CPU interpreter (TRITON_INTERPRET=1, set
in conftest.py) against the model's own torch path: RMSNorm with the residual
add, and q/k norm + RoPE + the KV-cache write in one launch. fp32, fp16 and
bf16 (the interpreter's bf16 is computed in fp32 after loading), head sizes
that are not powers of two, GQA ratios 1 to 5, programs that hold q, k and v
heads together, caches poisoned with NaN so a stray write shows."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the kernel tests need torch (pip install '.[test]')")
pytest.importorskip("triton", reason="the kernel tests need triton (pip install '.[test]')")

import torch.nn.functional as F  # noqa: E402

from ironbatch.attention.paged_reference import reference_reshape_and_cache  # noqa: E402
from ironbatch.kernels.rms_norm import rms_norm  # noqa: E402
from ironbatch.kernels.rope_and_cache import rope_and_cache  # noqa: E402
from ironbatch.model.config import RopeConfig  # noqa: E402
from ironbatch.model.llama import RMSNorm  # noqa: E402
from ironbatch.model.rope import RotaryEmbedding, rotate  # noqa: E402

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
#: (atol, rtol) against the torch path: fp32 differs by the order of the sum
#: of squares; fp16 by a rounding step where that order tips it; bf16 also
#: because the interpreter's conversion to bf16 truncates, one ulp (2^-8
#: relative) at each of up to three rounding points.
TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (2e-2, 2.4e-2)}
#: RoPE's x·cos − y·sin can cancel, so its error is absolute, the size of the
#: terms' (|x| up to about 4 here): two truncated bf16 ulps of 4.
ROPE_TOL = {**TOL, torch.bfloat16: (4e-2, 2.4e-2)}


def torch_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual=None):
    """The model's RMSNorm, plain torch (the CPU default path)."""
    norm = RMSNorm(x.shape[-1], eps).to(x.dtype)
    with torch.no_grad():
        norm.weight.copy_(weight)
        return norm(x, residual)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [64, 96, 1000])
def test_rms_norm_with_the_residual_add(dtype: torch.dtype, hidden: int) -> None:
    g = torch.Generator().manual_seed(hidden)
    tokens = 7
    wide = torch.randn(tokens, hidden + 8, generator=g).to(dtype)
    x = wide[:, :hidden]  # rows strided: the kernel must use the row stride
    residual = torch.randn(tokens, hidden, generator=g).to(dtype)
    weight = (1 + 0.1 * torch.randn(hidden, generator=g)).to(dtype)
    want_out, want_residual = torch_norm(x.clone(), weight, 1e-6, residual.clone())
    x_in, r_in = x.clone(), residual.clone()
    out, new_residual = rms_norm(x_in, weight, 1e-6, r_in)
    assert out.data_ptr() == x_in.data_ptr() and new_residual.data_ptr() == r_in.data_ptr()
    atol, rtol = TOL[dtype]
    # The add rounds once to the dtype, as torch's does (the interpreter's
    # bf16 conversion truncates: one ulp).
    torch.testing.assert_close(new_residual.float(), want_residual.float(), atol=atol, rtol=rtol)
    torch.testing.assert_close(out.float(), want_out.float(), atol=atol, rtol=rtol)
    if dtype != torch.bfloat16:
        assert torch.equal(new_residual, want_residual)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_without_a_residual_returns_its_input_as_the_stream(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(5, 96, generator=g).to(dtype)
    weight = (1 + 0.1 * torch.randn(96, generator=g)).to(dtype)
    before = x.clone()
    out, stream = rms_norm(x, weight, 1e-5)
    want, _ = torch_norm(x, weight, 1e-5)
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(out.float(), want.float(), atol=atol, rtol=rtol)
    assert stream is x and torch.equal(x, before)  # the input is the residual, untouched


def test_rms_norm_names_bad_arguments() -> None:
    x = torch.randn(3, 8)
    with pytest.raises(ValueError, match="weight must be"):
        rms_norm(x, torch.ones(9), 1e-6)
    with pytest.raises(ValueError, match="residual must be like x"):
        rms_norm(x, torch.ones(8), 1e-6, torch.zeros(3, 8, dtype=torch.float16))


def torch_rope_and_cache(qkv, positions, rope, hq, hkv, q_norm, k_norm, eps, kc, vc, slots):
    """The model's torch path: q/k norm, rotation in the model dtype, then
    the cache write."""
    d = qkv.shape[-1]
    qk = qkv[:, : hq + hkv]
    if q_norm is not None:
        normed = F.rms_norm(qk.float(), (d,), eps=eps).to(qkv.dtype)
        qk = torch.cat([q_norm.expand(hq, -1), k_norm.expand(hkv, -1)]) * normed
    cos, sin = rope(positions)
    qk = rotate(qk, cos.to(qkv.dtype), sin.to(qkv.dtype))
    reference_reshape_and_cache(qk[:, hq:], qkv[:, hq + hkv :], kc, vc, slots)
    return qk[:, :hq]


CASES = [
    # (query heads, KV heads, head size, q/k norm, dtype, RoPE scaling)
    (4, 4, 64, False, torch.float32, None),
    (8, 2, 128, True, torch.float32, None),
    (10, 2, 96, True, torch.float16, None),
    (4, 1, 80, False, torch.bfloat16, None),
    (16, 8, 128, True, torch.bfloat16, None),  # 32 heads: two programs a token
    (20, 4, 64, False, torch.float32, "llama3"),  # 28 heads: the second program part-full
]


@pytest.mark.parametrize(("hq", "hkv", "dim", "qk_norm", "dtype", "scaling"), CASES)
def test_rope_and_cache_matches_the_torch_path(
    hq: int, hkv: int, dim: int, qk_norm: bool, dtype: torch.dtype, scaling: str | None
) -> None:
    g = torch.Generator().manual_seed(hq * dim)
    tokens, block_size, num_blocks = 9, 16, 6
    config = RopeConfig(
        theta=500000.0,
        scaling=None
        if scaling is None
        else {
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    )
    rope = RotaryEmbedding(dim, config)
    table = rope.cos_sin_table(700)
    qkv = torch.randn(tokens, hq + 2 * hkv, dim, generator=g).to(dtype)
    positions = torch.randint(0, 700, (tokens,), generator=g)
    q_norm = (1 + 0.1 * torch.randn(dim, generator=g)).to(dtype) if qk_norm else None
    k_norm = (1 + 0.1 * torch.randn(dim, generator=g)).to(dtype) if qk_norm else None
    slots = torch.randperm((num_blocks - 1) * block_size, generator=g)[:tokens] + block_size
    slots[3] = -1  # a token whose K/V is not kept
    shape = (num_blocks, block_size, hkv, dim)
    kc = torch.full(shape, float("nan"), dtype=dtype)
    vc = torch.full_like(kc, float("nan"))
    want_k, want_v = kc.clone(), vc.clone()
    want_q = torch_rope_and_cache(
        qkv, positions, rope, hq, hkv, q_norm, k_norm, 1e-6, want_k, want_v, slots
    )
    got_qkv = qkv.clone()
    q = rope_and_cache(got_qkv, positions, table, kc, vc, slots, hq, q_norm, k_norm, 1e-6)
    assert q.data_ptr() == got_qkv.data_ptr() and q.shape == (tokens, hq, dim)  # in place
    atol, rtol = ROPE_TOL[dtype]
    torch.testing.assert_close(q.float(), want_q.float(), atol=atol, rtol=rtol)
    assert torch.equal(got_qkv[:, hq:], qkv[:, hq:])  # k and v left as they were
    written = torch.zeros(num_blocks * block_size, dtype=torch.bool)
    written[slots[slots >= 0]] = True
    for got, want in ((kc, want_k), (vc, want_v)):
        flat, flat_want = got.view(-1, hkv, dim), want.view(-1, hkv, dim)
        torch.testing.assert_close(
            flat[written].float(), flat_want[written].float(), atol=atol, rtol=rtol
        )
        assert torch.isnan(flat[~written]).all(), "a slot no token owns was written"
    assert torch.equal(vc.view(-1, hkv, dim)[slots[:3]], qkv[:3, hq + hkv :])  # v: a copy


def test_rope_and_cache_names_bad_arguments() -> None:
    qkv = torch.randn(2, 8, 16)
    kc = torch.zeros(2, 4, 2, 16)
    table = torch.zeros(8, 16)
    slots = torch.tensor([4, 5])
    int32_positions = torch.tensor([0, 1], dtype=torch.int32)
    with pytest.raises(ValueError, match="positions must be int64"):
        rope_and_cache(qkv, int32_positions, table, kc, kc.clone(), slots, 4)
    with pytest.raises(ValueError, match="qkv must be"):
        rope_and_cache(qkv, torch.tensor([0, 1]), table, kc, kc.clone(), slots, 3)
    with pytest.raises(ValueError, match="come together"):
        rope_and_cache(
            qkv, torch.tensor([0, 1]), table, kc, kc.clone(), slots, 4, torch.ones(16), None
        )
