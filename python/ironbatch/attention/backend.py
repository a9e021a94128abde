"""The attention interface the model calls, and its two backends.

Per step the runner hands the backend the step's metadata once
(``begin_step``); each layer then calls ``forward(layer, q, k, v)``, which
writes the new K/V into that layer's paged cache through ``slot_mapping`` and
attends over the cache. ``torch`` is the exact, simple reference (the CPU
default); ``triton`` runs ``ironbatch.kernels``, and also offers
``forward_qkv``: q/k norm, RoPE and the cache write fused in one kernel.

A decode step of the runner's static path (``model/static_decode.py``)
hands ``begin_step`` views of preallocated buffers. A backend whose
``graph_capturable`` is true reads nothing else in ``forward`` and makes no
host-side decision from values, so such a step can be captured in a CUDA
graph and replayed with new buffer contents."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # int64 [T]
    query_start_loc: torch.Tensor  # int32 [S + 1]
    seq_lens: torch.Tensor  # int32 [S]
    block_table: torch.Tensor  # int32 [S, max_blocks]
    max_seqlen_q: int
    query_lens: list[int]  # host copies, for the torch backend's grouping
    seq_lens_host: list[int]


class PagedAttention:
    """KV caches (per layer, ``[num_blocks, block_size, num_kv_heads,
    head_dim]``) and a backend to attend over them."""

    #: Whether a decode step through this backend may be captured in a CUDA graph.
    graph_capturable = False

    def __init__(
        self,
        k_caches: list[torch.Tensor],
        v_caches: list[torch.Tensor],
        scale: float,
        *,
        num_q_heads: int,
        max_num_tokens: int,
    ) -> None:
        self.k_caches, self.v_caches, self.scale = k_caches, v_caches, scale
        self.num_q_heads, self.max_num_tokens = num_q_heads, max_num_tokens
        self.meta: AttentionMetadata | None = None

    def begin_step(self, meta: AttentionMetadata) -> None:
        self.meta = meta

    def forward(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        raise NotImplementedError


class TorchPagedAttention(PagedAttention):
    """Gather each sequence's keys from the cache and run SDPA with an
    explicit bottom-right causal mask; decodes are batched together."""

    def begin_step(self, meta: AttentionMetadata) -> None:
        super().begin_step(meta)
        bs = self.k_caches[0].shape[1]
        dev = meta.slot_mapping.device
        self.written = meta.slot_mapping >= 0
        decode = [s for s, n in enumerate(meta.query_lens) if n == 1]
        self.decode_rows = meta.query_start_loc[:-1][decode].long() if decode else None
        if decode:
            lens = meta.seq_lens[decode].long()
            longest = max(meta.seq_lens_host[s] for s in decode)
            pos = torch.arange(longest, device=dev)
            blocks = meta.block_table[decode][:, pos // bs].long()
            self.decode_slots = blocks * bs + pos % bs  # [nd, L]
            self.decode_mask = (pos[None, :] < lens[:, None])[:, None, None, :]
        self.chunks = []  # (first row, rows, key slots) of every non-decode sequence
        starts = meta.query_start_loc.tolist()
        for s, n in enumerate(meta.query_lens):
            if n > 1:
                length = meta.seq_lens_host[s]
                pos = torch.arange(length, device=dev)
                slots = meta.block_table[s, pos // bs].long() * bs + pos % bs
                self.chunks.append((starts[s], n, slots))

    def forward(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        meta = self.meta
        assert meta is not None
        kc, vc = self.k_caches[layer], self.v_caches[layer]
        heads_kv, dim = kc.shape[2], kc.shape[3]
        k_flat, v_flat = kc.view(-1, heads_kv, dim), vc.view(-1, heads_kv, dim)
        k_flat[meta.slot_mapping[self.written]] = k[self.written]
        v_flat[meta.slot_mapping[self.written]] = v[self.written]
        group = q.shape[1] // heads_kv
        out = torch.zeros_like(q)
        if self.decode_rows is not None:
            qd = q[self.decode_rows][:, :, None, :]  # [nd, Hq, 1, D]
            kd = k_flat[self.decode_slots].transpose(1, 2).repeat_interleave(group, 1)
            vd = v_flat[self.decode_slots].transpose(1, 2).repeat_interleave(group, 1)
            od = F.scaled_dot_product_attention(
                qd, kd, vd, attn_mask=self.decode_mask, scale=self.scale
            )
            out[self.decode_rows] = od[:, :, 0, :]
        for first, n, slots in self.chunks:
            length = slots.shape[0]
            qs = q[first : first + n].transpose(0, 1)[None]  # [1, Hq, n, D]
            ks = k_flat[slots].transpose(0, 1).repeat_interleave(group, 0)[None]
            vs = v_flat[slots].transpose(0, 1).repeat_interleave(group, 0)[None]
            i = torch.arange(n, device=q.device)[:, None]
            j = torch.arange(length, device=q.device)[None, :]
            mask = j <= (length - n) + i  # bottom-right causal
            o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, scale=self.scale)
            out[first : first + n] = o[0].transpose(0, 1)
        return out


class TritonPagedAttention(PagedAttention):
    """``ironbatch.kernels``: reshape_and_cache (or the fused rope_and_cache)
    then unified_attention. The split-KV scratch is allocated once, for the
    largest decode batch that takes that path, and so is the attention
    output, for the step's most tokens (shared by the layers: each output is
    read by its o_proj before the next layer writes); the 2D or split-KV
    choice is the kernel's, from the batch shape alone (no host sync). A
    padding row's output is never written: it keeps an earlier row's finite
    values."""

    graph_capturable = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.k_caches[0].device.type == "cpu":
            _use_triton_interpreter()
        from ironbatch.kernels import unified_attention as attention
        from ironbatch.kernels.reshape_and_cache import reshape_and_cache
        from ironbatch.kernels.rope_and_cache import rope_and_cache

        self.reshape_and_cache = reshape_and_cache
        self.rope_and_cache = rope_and_cache
        self.unified_attention = attention.unified_attention
        kc = self.k_caches[0]
        heads_kv, dim = kc.shape[2], kc.shape[3]
        # The split path serves decode batches of fewer sequences than this.
        self.scratch_tokens = -(-attention.SPLIT_KV_BELOW_PROGRAMS // heads_kv)
        self.scratch = torch.empty(
            attention.split_kv_scratch_numel(self.scratch_tokens, self.num_q_heads, dim),
            dtype=torch.float32,
            device=kc.device,
        )
        self.out = torch.zeros(
            self.max_num_tokens, self.num_q_heads, dim, dtype=kc.dtype, device=kc.device
        )

    def forward(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        meta = self.meta
        assert meta is not None
        self.reshape_and_cache(k, v, self.k_caches[layer], self.v_caches[layer], meta.slot_mapping)
        return self._attend(layer, q.contiguous())

    def forward_qkv(
        self,
        layer: int,
        qkv: torch.Tensor,
        *,
        num_q_heads: int,
        positions: torch.Tensor,
        cos_sin_table: torch.Tensor,
        q_norm_weight: torch.Tensor | None,
        k_norm_weight: torch.Tensor | None,
        eps: float,
    ) -> torch.Tensor:
        """Attention from the fused projection ``qkv`` ``[T, Hq + 2·Hkv, D]``:
        one kernel normalises (Qwen3) and rotates q and k and writes k and v
        into the cache, then attention reads q in place."""
        meta = self.meta
        assert meta is not None
        q = self.rope_and_cache(
            qkv,
            positions,
            cos_sin_table,
            self.k_caches[layer],
            self.v_caches[layer],
            meta.slot_mapping,
            num_q_heads,
            q_norm_weight,
            k_norm_weight,
            eps,
        )
        return self._attend(layer, q)

    def _attend(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        meta = self.meta
        assert meta is not None
        tokens = q.shape[0]
        if tokens <= len(self.out):
            out = self.out[:tokens]
        else:  # more than the step budget it was made for: a caller of its own
            out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        self.unified_attention(
            q,
            self.k_caches[layer],
            self.v_caches[layer],
            out,
            meta.query_start_loc,
            meta.seq_lens,
            meta.block_table,
            self.scale,
            meta.max_seqlen_q,
            scratch=self.scratch if q.shape[0] <= self.scratch_tokens else None,
        )
        return out


def _use_triton_interpreter() -> None:
    """On the CPU the Triton kernels run only in Triton's interpreter (for
    tests, not speed), which must be switched on before anything imports
    triton; say so rather than fail inside a launch."""
    import os

    if os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(
            "attention_backend='triton' on the CPU runs Triton's interpreter: set "
            "TRITON_INTERPRET=1 before starting Python, or use attention_backend='torch'"
        )


BACKENDS = {"torch": TorchPagedAttention, "triton": TritonPagedAttention}
