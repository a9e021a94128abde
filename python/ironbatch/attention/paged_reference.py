"""Paged attention in plain torch, one sequence at a time, in fp32 (spec
§3.2): the oracle the Triton kernels are tested against."""

from __future__ import annotations

import torch


def reference_reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write each token's K/V row to its slot; slot -1 is padding."""
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    _, _, heads, dim = k_cache.shape
    k_cache.view(-1, heads, dim)[slots] = key[keep]
    v_cache.view(-1, heads, dim)[slots] = value[keep]


def reference_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Attention of the rows of ``q`` over each sequence's cached keys, with
    bottom-right causality; rows past ``cu_seqlens_q[-1]`` stay zero."""
    _, block_size, heads_kv, dim = k_cache.shape
    group = q.shape[1] // heads_kv
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    for s in range(seq_lens.shape[0]):
        length = int(seq_lens[s])
        lo, hi = int(cu_seqlens_q[s]), int(cu_seqlens_q[s + 1])
        n = hi - lo
        if n == 0:
            continue
        ids = block_table[s, : -(-length // block_size)].long()
        k = k_cache[ids].reshape(-1, heads_kv, dim)[:length].float()
        v = v_cache[ids].reshape(-1, heads_kv, dim)[:length].float()
        k = k.repeat_interleave(group, dim=1)  # query head h uses KV head h // group
        v = v.repeat_interleave(group, dim=1)
        qs = q[lo:hi].float()
        scores = torch.einsum("ihd,jhd->hij", qs, k) * scale
        i = torch.arange(n, device=q.device)[:, None]
        j = torch.arange(length, device=q.device)[None, :]
        scores = scores.masked_fill(j > (length - n) + i, float("-inf"))
        out[lo:hi] = torch.einsum("hij,jhd->ihd", scores.softmax(-1), v)
    return out
