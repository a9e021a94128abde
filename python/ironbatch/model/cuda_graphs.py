"""CUDA graphs for decode steps: one per padded batch size, captured at
start-up and replayed (docs/architecture.md, "The decode path").

A graph records the kernels a body launches, with their arguments, and
replays them without Python. The body must therefore read its inputs only
from buffers that outlive it (``DecodeBuffers``), write its result into a
buffer that outlives it, allocate nothing that it hands out, and decide
nothing on the host from values, which is what the static decode step
guarantees. Graphs share one memory pool, captured largest first so the
smaller ones reuse its memory; only one runs at a time."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def capture_available(device: torch.device, graph_capturable: bool) -> bool:
    """Whether decode steps on ``device`` through a backend are captured:
    only on CUDA, and only for a backend that reads nothing but its
    metadata's tensors (``PagedAttention.graph_capturable``)."""
    return device.type == "cuda" and graph_capturable and torch.cuda.is_available()


class CudaCapturer:
    """torch's CUDA graph calls, kept apart so that what drives them can be
    tested on a machine without a GPU."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.pool = torch.cuda.graph_pool_handle()
        self.stream = torch.cuda.Stream(device)

    def warm_up(self, body: Callable[[], None]) -> None:
        """Run ``body`` once uncaptured (Triton compiles its kernels for
        this size, cuBLAS picks its algorithms), on a side stream as torch
        advises before a capture."""
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            body()
        torch.cuda.current_stream(self.device).wait_stream(self.stream)

    def capture(self, body: Callable[[], None]) -> Any:
        """A graph of ``body``'s launches; ``.replay()`` runs them again."""
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            body()
        return graph

    def done(self) -> None:
        torch.cuda.synchronize(self.device)


class DecodeGraphs:
    """One captured graph per padded size; ``body(size)`` runs the model on
    that size's static views and writes into the static output;
    ``prepare(size)`` fills the views with padding first, so the warm-up run
    reads valid inputs (and writes only the scratch slots)."""

    def __init__(
        self,
        sizes: list[int],
        body: Callable[[int], None],
        capturer: Any,
        *,
        prepare: Callable[[int], None],
    ) -> None:
        self.graphs: dict[int, Any] = {}
        for size in sorted(sizes, reverse=True):
            prepare(size)
            capturer.warm_up(lambda size=size: body(size))
            self.graphs[size] = capturer.capture(lambda size=size: body(size))
        capturer.done()

    def replay(self, size: int) -> None:
        self.graphs[size].replay()
