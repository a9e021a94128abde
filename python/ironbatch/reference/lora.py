"""LoRA adapters as the scheduler sees them (docs/scheduling.md §4.14): a
request's adapter, which keys its block hashes (two adapters never share a
prefix-cache hit), and the running batch's set of adapters, which caps
admissions at ``max_loras`` distinct ones."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class LoraAdapter:
    """A request's adapter (vLLM's ``LoRARequest``): ``id`` is what the batch
    counts (``lora_int_id``, at least 1), ``name`` and ``path`` what the
    hashes are keyed by, so a name pointed at another adapter never reuses
    its KV."""

    id: int
    name: str
    path: str


class LoraBatch:
    """The distinct adapters of one step's batch: those of every running
    request (scheduled this step or not: they can join a later batch), then
    those the waiting pass admits."""

    def __init__(self, max_loras: int, running: Iterable[int]) -> None:
        """The adapters of ``running``, under a cap of ``max_loras``."""
        self.max_loras = max_loras
        self.ids: set[int] = set(running)

    def admits(self, id: int) -> bool:
        """Whether a request with adapter ``id`` can join without a new
        adapter past the cap (one already in the batch always can)."""
        return len(self.ids) < self.max_loras or id in self.ids

    def add(self, id: int) -> None:
        """Count ``id`` in the batch (once)."""
        self.ids.add(id)

    def __len__(self) -> int:
        return len(self.ids)
