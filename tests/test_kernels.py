"""The Triton kernels under the CPU interpreter (TRITON_INTERPRET=1, set in
conftest.py before anything imports triton) against the plain-torch
reference: random shapes, GQA ratios 1/4/5/8, head sizes 64/96/128, block
sizes 16/32, decodes, prefill chunks and mixed batches, padding rows,
permuted block tables, and NaN in every cache slot no token wrote."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch", reason="the kernel tests need torch (pip install '.[test]')")

import ironbatch.kernels.unified_attention as attention  # noqa: E402
from ironbatch.attention.paged_reference import (  # noqa: E402
    reference_attention,
    reference_reshape_and_cache,
)
from ironbatch.kernels.reshape_and_cache import reshape_and_cache  # noqa: E402
from ironbatch.kernels.unified_attention import unified_attention  # noqa: E402

TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.5e-2, 1e-2)}


def make_batch(
    q_lens,
    seq_lens,
    *,
    heads_kv=2,
    group=4,
    dim=64,
    block_size=16,
    dtype=torch.float32,
    pad_rows=0,
    seed=0,
):
    """Caches filled with NaN except each sequence's context (written by
    indexing) and its new tokens (written by the Triton kernel); permuted
    block tables."""
    g = torch.Generator().manual_seed(seed)
    blocks_per_seq = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(blocks_per_seq) + 3
    perm = (torch.randperm(num_blocks - 1, generator=g) + 1).tolist()  # block 0 stays unused
    max_blocks = max(blocks_per_seq)
    table = torch.zeros(len(seq_lens), max_blocks, dtype=torch.int32)
    k_cache = torch.full((num_blocks, block_size, heads_kv, dim), float("nan"), dtype=dtype)
    v_cache = torch.full_like(k_cache, float("nan"))
    new_k, new_v, slots = [], [], []
    for s, (n, length) in enumerate(zip(q_lens, seq_lens, strict=True)):
        ids = [perm.pop() for _ in range(blocks_per_seq[s])]
        table[s, : len(ids)] = torch.tensor(ids, dtype=torch.int32)
        for p in range(length):
            slot = ids[p // block_size] * block_size + p % block_size
            k = torch.randn(heads_kv, dim, generator=g).to(dtype)
            v = torch.randn(heads_kv, dim, generator=g).to(dtype)
            if p < length - n:  # context: already in the cache
                k_cache.view(-1, heads_kv, dim)[slot] = k
                v_cache.view(-1, heads_kv, dim)[slot] = v
            else:  # this step's tokens: through the kernel
                new_k.append(k)
                new_v.append(v)
                slots.append(slot)
    slots += [-1] * pad_rows
    pad = [torch.zeros(heads_kv, dim, dtype=dtype)] * pad_rows
    key = torch.stack(new_k + pad)
    value = torch.stack(new_v + pad)
    slot_mapping = torch.tensor(slots, dtype=torch.int64)
    total = sum(q_lens)
    q = torch.randn(total + pad_rows, heads_kv * group, dim, generator=g).to(dtype)
    cu = torch.zeros(len(q_lens) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(torch.tensor(q_lens), 0)
    return dict(
        q=q,
        key=key,
        value=value,
        k_cache=k_cache,
        v_cache=v_cache,
        slot_mapping=slot_mapping,
        cu=cu,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        table=table,
    )


class LaunchSpy:
    """Stands in for a Triton kernel and records each launch by name."""

    def __init__(self, kernel, name: str, log: list[str]) -> None:
        self.kernel, self.name, self.log = kernel, name, log

    def __getitem__(self, grid):  # type: ignore[no-untyped-def]
        self.log.append(self.name)
        return self.kernel[grid]


@pytest.fixture
def launches(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The attention kernels launched during the test, in order."""
    log: list[str] = []
    for name in ("_unified_attention_kernel", "_split_kv_kernel"):
        monkeypatch.setattr(attention, name, LaunchSpy(getattr(attention, name), name, log))
    return log


def run_and_check(b, dim, split_kv=None, scratch=None):
    reshape_and_cache(b["key"], b["value"], b["k_cache"], b["v_cache"], b["slot_mapping"])
    out = torch.full_like(b["q"], float("nan"))  # poisoned: an unwritten element fails
    scale = 1 / math.sqrt(dim)
    unified_attention(
        b["q"],
        b["k_cache"],
        b["v_cache"],
        out,
        b["cu"],
        b["seq_lens"],
        b["table"],
        scale,
        max_seqlen_q=int((b["cu"][1:] - b["cu"][:-1]).max()),
        split_kv=split_kv,
        scratch=scratch,
    )
    want = reference_attention(
        b["q"], b["k_cache"], b["v_cache"], b["cu"], b["seq_lens"], b["table"], scale
    )
    total = int(b["cu"][-1])
    atol, rtol = TOL[b["q"].dtype]
    torch.testing.assert_close(out[:total].float(), want[:total], atol=atol, rtol=rtol)
    assert torch.isnan(out[total:]).all(), "padding rows must not be written"


@pytest.mark.parametrize("length", [1, 15, 16, 17, 64, 100, 513])
def test_decode_lengths(length: int, launches: list[str]) -> None:
    # Small decode batches take the split-KV path by default.
    b = make_batch([1, 1], [length, max(1, length // 3)], seed=length)
    run_and_check(b, 64)
    assert launches == ["_split_kv_kernel"]


@pytest.mark.parametrize("split_kv", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_split_and_2d_both_match(
    split_kv: bool, dtype: torch.dtype, launches: list[str]
) -> None:
    # Lengths from 1 (15 of 16 segments empty) to past 16 tiles; padding rows.
    b = make_batch(
        [1, 1, 1, 1], [1, 40, 700, 1100], group=5, dim=96, dtype=dtype, pad_rows=2, seed=11
    )
    run_and_check(b, 96, split_kv=split_kv)
    assert launches == ["_split_kv_kernel" if split_kv else "_unified_attention_kernel"]


def test_split_kv_uses_the_scratch_it_is_given(launches: list[str]) -> None:
    # A decode step that allocates nothing: the scratch, NaN-filled, is all
    # the split path writes its partial results to (and sized to the byte).
    b = make_batch([1, 1, 1], [3, 90, 260], group=4, dim=96, pad_rows=1, seed=17)
    tokens, heads = b["q"].shape[:2]
    scratch = torch.full((attention.split_kv_scratch_numel(tokens, heads, 96),), float("nan"))
    run_and_check(b, 96, scratch=scratch)
    assert launches == ["_split_kv_kernel"]
    assert not torch.isnan(scratch[: 3 * heads * attention.NUM_SEGMENTS]).all()  # it was used
    with pytest.raises(ValueError, match="scratch must be contiguous float32"):
        run_and_check(b, 96, scratch=scratch[:-1])


def test_decode_batches_that_fill_the_gpu_take_the_2d_kernel(launches: list[str]) -> None:
    # 16 decoding sequences x 8 KV heads = 128 programs: the production
    # decode path once a batch is that large.
    lengths = [1, 2, 15, 16, 17, 31, 33, 40, 47, 64, 65, 70, 80, 90, 99, 129]
    b = make_batch([1] * 16, lengths, heads_kv=8, group=2, dim=64, pad_rows=1, seed=13)
    assert len(lengths) * 8 >= attention.SPLIT_KV_BELOW_PROGRAMS
    run_and_check(b, 64)
    assert launches == ["_unified_attention_kernel"]


def test_split_kv_refuses_chunks() -> None:
    b = make_batch([3], [10])
    with pytest.raises(ValueError, match="decode-only"):
        unified_attention(
            b["q"],
            b["k_cache"],
            b["v_cache"],
            torch.empty_like(b["q"]),
            b["cu"],
            b["seq_lens"],
            b["table"],
            1.0,
            3,
            split_kv=True,
        )


@pytest.mark.parametrize(
    ("group", "dim", "block_size", "dtype"),
    [
        (1, 64, 16, torch.float32),
        (4, 128, 32, torch.float16),
        (5, 96, 16, torch.float32),
        (8, 128, 16, torch.bfloat16),
        (4, 64, 32, torch.bfloat16),
    ],
)
def test_mixed_batch(group: int, dim: int, block_size: int, dtype: torch.dtype) -> None:
    # A decode, a short chunk with a prefix hit, a longer chunk, and padding rows.
    b = make_batch(
        [1, 5, 33],
        [200, 18, 97],
        group=group,
        dim=dim,
        block_size=block_size,
        dtype=dtype,
        pad_rows=3,
        seed=group * dim,
    )
    run_and_check(b, dim)


def test_prefill_chunk_over_a_long_context() -> None:
    b = make_batch([64], [256], heads_kv=1, group=4, seed=7)
    run_and_check(b, 64)


def test_whole_prompts_and_a_single_token_batch() -> None:
    run_and_check(make_batch([7, 20], [7, 20], seed=3), 64)  # prefills from position 0
    run_and_check(make_batch([1], [1], seed=4), 64)  # one token in total


def test_group_above_16_packs_more_rows() -> None:
    run_and_check(make_batch([1, 3], [40, 9], heads_kv=1, group=20, dim=64, seed=5), 64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_reshape_and_cache_is_exact_from_strided_views(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(1)
    tokens, heads_q, heads_kv, dim, block_size, num_blocks = 40, 4, 2, 64, 16, 9
    qkv = torch.randn(tokens, heads_q + 2 * heads_kv, dim, generator=g).to(dtype)
    _, key, value = qkv.split([heads_q, heads_kv, heads_kv], dim=1)  # strided per token
    slots = torch.randperm((num_blocks - 1) * block_size, generator=g)[:tokens] + block_size
    slots[::7] = -1  # padding tokens write nothing
    k_cache = torch.full((num_blocks, block_size, heads_kv, dim), 7.0, dtype=dtype)
    v_cache = torch.full_like(k_cache, 9.0)
    want_k, want_v = k_cache.clone(), v_cache.clone()
    reference_reshape_and_cache(key, value, want_k, want_v, slots)
    reshape_and_cache(key, value, k_cache, v_cache, slots)
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)
    assert (k_cache[0] == 7.0).all()  # the null block is never written


def test_bad_arguments_are_named() -> None:
    b = make_batch([1], [5])
    out = torch.empty_like(b["q"])
    with pytest.raises(ValueError, match="int32"):
        unified_attention(
            b["q"],
            b["k_cache"],
            b["v_cache"],
            out,
            b["cu"].long(),
            b["seq_lens"],
            b["table"],
            1.0,
            1,
        )
    with pytest.raises(ValueError, match="multiple of KV heads"):
        unified_attention(
            b["q"][:, :3],
            b["k_cache"],
            b["v_cache"],
            out[:, :3],
            b["cu"],
            b["seq_lens"],
            b["table"],
            1.0,
            1,
        )
    with pytest.raises(ValueError, match="slot_mapping must be int64"):
        reshape_and_cache(b["key"], b["value"], b["k_cache"], b["v_cache"], b["slot_mapping"].int())
