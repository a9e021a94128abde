"""Graph-ready decode steps (docs/architecture.md, "The decode path").

A step whose every row computes exactly one token (and carries no drafts)
runs on ``DecodeBuffers``: padded to a fixed size, its inputs copied into
preallocated buffers, the model run on that size's fixed views, the hidden
states written into a preallocated output. Nothing in it allocates a buffer
it hands out, waits for the device or takes a host decision from values, so
on CUDA the forward of each padded size is captured once at start-up
(``cuda_graphs``) and replayed; on the CPU, or through a backend that cannot
be captured, the same body runs uncaptured. Prefill and mixed steps stay on
the eager path."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import torch

from ironbatch.model import cuda_graphs
from ironbatch.model.decode_buffers import DecodeBuffers, StepViews, padded_batch_sizes
from ironbatch.scheduler_output import SchedulerOutput


class StaticDecode:
    def __init__(
        self,
        model: Any,
        attn: Any,
        *,
        max_num_seqs: int,
        max_blocks: int,
        scratch_slots: np.ndarray,
        hidden_size: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.model, self.attn = model, attn
        sizes = padded_batch_sizes(max_num_seqs)
        self.max_rows = sizes[-1]
        self.buffers = DecodeBuffers(
            sizes, max_blocks=max_blocks, scratch_slots=scratch_slots, device=device
        )
        self.hidden = torch.zeros(self.max_rows, hidden_size, dtype=dtype, device=device)
        #: Steps served, by padded size.
        self.steps: Counter[int] = Counter()
        self.graphs: cuda_graphs.DecodeGraphs | None = None
        if cuda_graphs.capture_available(device, attn.graph_capturable):
            with torch.inference_mode():  # as the runner's steps run
                self.graphs = cuda_graphs.DecodeGraphs(
                    sizes, self._body, cuda_graphs.CudaCapturer(device), prepare=self._pad
                )

    def serves(self, out: SchedulerOutput) -> bool:
        """Whether ``out`` is a decode step: one token per row, no drafts."""
        n = len(out.req_ids)
        return (
            0 < n <= self.max_rows
            and int(out.query_start_loc[-1]) == n
            and len(out.spec_token_ids) == 0
        )

    def run(
        self,
        *,
        input_ids: np.ndarray,
        positions: np.ndarray,
        slot_mapping: np.ndarray,
        seq_lens: np.ndarray,
        block_table: np.ndarray,
    ) -> torch.Tensor:
        """The step's hidden states, ``[P, hidden]`` for its padded size
        ``P``: rows past ``len(input_ids)`` are padding."""
        size = self.buffers.padded_size(len(input_ids))
        views = self.buffers.fill(
            size,
            input_ids=input_ids,
            positions=positions,
            slot_mapping=slot_mapping,
            seq_lens=seq_lens,
            block_table=block_table,
        )
        if self.graphs is not None:
            self.graphs.replay(size)
        else:
            self._forward(views, seq_lens.tolist())
        self.steps[size] += 1
        return self.hidden[:size]

    def _pad(self, size: int) -> None:
        """Every row of ``size`` padding (before a capture's warm-up run)."""
        empty = np.zeros(0, dtype=np.int64)
        table = np.zeros((0, self.buffers.max_blocks), dtype=np.int32)
        self.buffers.fill(
            size,
            input_ids=empty,
            positions=empty,
            slot_mapping=empty,
            seq_lens=empty,
            block_table=table,
        )

    def _body(self, size: int) -> None:
        self._forward(self.buffers.views[size], [])

    def _forward(self, views: StepViews, seq_lens_host: list[int]) -> None:
        self.attn.begin_step(self.buffers.metadata(views, seq_lens_host))
        hidden = self.model(views.input_ids, views.positions, self.attn)
        self.hidden[: views.size].copy_(hidden)
