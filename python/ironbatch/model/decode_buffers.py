"""The preallocated inputs of a graph-ready decode step, and the padded batch
sizes they serve (docs/architecture.md, "The decode path").

A decode step of ``n`` sequences (one token each) is padded to the next of a
fixed set of sizes ``P``. For each size the buffers offer one fixed set of
views, so a CUDA graph captured with them reads a new step's inputs after
the buffers are refilled. Padding rows are complete but inert: input id 0 at
position 0, a K/V write into a scratch slot that no sequence reads, and a
query length of 0 (``query_start_loc`` stays flat after row ``n``), so
attention skips them and the sampler never sees them.

Two flat buffers hold everything, one int64 (input ids, positions, slot
mapping) and one int32 (``query_start_loc``, sequence lengths, block
table); each size lays its views out contiguously from the start of both,
so a step is two host-to-device copies from pinned memory, without a sync."""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np
import torch

from ironbatch.attention.backend import AttentionMetadata
from ironbatch.model.pinned_buffer import PinnedBuffer


def padded_batch_sizes(max_num_seqs: int) -> list[int]:
    """1, 2, 4, then every multiple of 8 up to 256 and of 16 beyond (vLLM's
    capture sizes), below ``max_num_seqs``, then ``max_num_seqs`` itself: no
    decode batch is larger."""
    if max_num_seqs < 1:
        raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
    candidates = [1, 2, 4, *range(8, 257, 8), *range(272, max_num_seqs, 16)]
    return [s for s in candidates if s < max_num_seqs] + [max_num_seqs]


@dataclass(frozen=True)
class StepViews:
    """One padded size's views of the buffers (device side)."""

    size: int
    input_ids: torch.Tensor  # int64 [P]
    positions: torch.Tensor  # int64 [P]
    slot_mapping: torch.Tensor  # int64 [P]
    query_start_loc: torch.Tensor  # int32 [P + 1]
    seq_lens: torch.Tensor  # int32 [P]
    block_table: torch.Tensor  # int32 [P, max_blocks]


class DecodeBuffers:
    """Static decode inputs for up to ``max(sizes)`` rows. Padding row ``i``
    writes its K/V to ``scratch_slots[i]``, in a block the scheduler never
    hands out and no sequence reads (two padding rows may share a slot:
    whichever write lands, nothing reads it)."""

    def __init__(
        self,
        sizes: list[int],
        *,
        max_blocks: int,
        scratch_slots: np.ndarray,
        device: torch.device,
    ) -> None:
        self.sizes = sorted(sizes)
        rows = self.sizes[-1]
        if len(scratch_slots) < rows:
            raise ValueError(f"{len(scratch_slots)} scratch slots for {rows} padded rows")
        self.max_blocks = max_blocks
        self.scratch_slots = scratch_slots.astype(np.int64)
        self.arange = np.arange(rows + 1, dtype=np.int32)
        self.longs = PinnedBuffer(3 * rows, torch.int64, device)
        self.ints = PinnedBuffer(2 * rows + 1 + rows * max_blocks, torch.int32, device)
        self.views = {
            size: self._views(size, self.longs.device_tensor, self.ints.device_tensor)
            for size in sizes
        }
        self._host = {
            size: self._views(size, self.longs.host_tensor, self.ints.host_tensor) for size in sizes
        }

    def _views(self, size: int, longs: torch.Tensor, ints: torch.Tensor) -> StepViews:
        return StepViews(
            size=size,
            input_ids=longs[:size],
            positions=longs[size : 2 * size],
            slot_mapping=longs[2 * size : 3 * size],
            query_start_loc=ints[: size + 1],
            seq_lens=ints[size + 1 : 2 * size + 1],
            block_table=ints[2 * size + 1 : 2 * size + 1 + size * self.max_blocks].view(
                size, self.max_blocks
            ),
        )

    def padded_size(self, n: int) -> int:
        """The smallest size that holds ``n`` rows."""
        return self.sizes[bisect.bisect_left(self.sizes, n)]

    def fill(
        self,
        size: int,
        *,
        input_ids: np.ndarray,
        positions: np.ndarray,
        slot_mapping: np.ndarray,
        seq_lens: np.ndarray,
        block_table: np.ndarray,
    ) -> StepViews:
        """Write a step of ``n = len(input_ids)`` rows, padded to ``size``,
        and start its copy to the device; returns the size's views."""
        n = len(input_ids)
        host = self._host[size]
        longs = self.longs.host()
        longs[:n] = input_ids
        longs[n:size] = 0
        longs[size : size + n] = positions
        longs[size + n : 2 * size] = 0
        longs[2 * size : 2 * size + n] = slot_mapping
        longs[2 * size + n : 3 * size] = self.scratch_slots[: size - n]
        self.ints.host()
        qsl = host.query_start_loc.numpy()
        qsl[: n + 1] = self.arange[: n + 1]
        qsl[n + 1 :] = n  # padding rows: no query tokens
        lens = host.seq_lens.numpy()
        lens[:n] = seq_lens
        lens[n:] = 0
        table = host.block_table.numpy()
        table[:n] = block_table
        table[n:] = 0
        self.longs.upload(3 * size)  # two copies, from pinned memory: no host sync
        self.ints.upload(2 * size + 1 + size * self.max_blocks)
        return self.views[size]

    def metadata(self, views: StepViews, seq_lens_host: list[int]) -> AttentionMetadata:
        """The step's attention metadata over the views. The host lists
        (for the torch backend, which is never captured) cover padding rows
        as length-0 queries."""
        n = len(seq_lens_host)
        pad = [0] * (views.size - n)
        return AttentionMetadata(
            slot_mapping=views.slot_mapping,
            query_start_loc=views.query_start_loc,
            seq_lens=views.seq_lens,
            block_table=views.block_table,
            max_seqlen_q=1,
            query_lens=[1] * n + pad,
            seq_lens_host=seq_lens_host + pad,
        )
