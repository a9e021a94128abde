"""Prefill checkpoints of recurrent states (docs/scheduling.md §7.15): the
state a chunk writes from inside itself at the prompt's checkpoint, and each
request's latest plan for one, which its caching keys until its next
allocation (vLLM's ``MambaManager._checkpoints``; the twin of
``rust/src/kv_cache_manager/prefill_checkpoints.rs``)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class StateCheckpoint:
    """A prefill checkpoint a step writes from inside its chunk: the state
    after ``position`` tokens, into every recurrent group's block ``block``,
    the one before the block the chunk ends in. The two agree (``block`` ends
    at ``position``) when the groups' block sizes do; else ``position`` is on
    the scheduler block and ``block`` where the chunk ends (§7.16)."""

    position: int
    block: int


@dataclass
class StateCheckpoints:
    """Per request (by slot), the checkpoint its latest allocation planned.
    vLLM records it as it counts an allocation's blocks (before it knows they
    are free) and forgets it at the next count without one; caching between
    the two (a step's output) keys it. A slot's entry is replaced at its
    request's first allocation, before any caching, so one left by a request
    that ended is never read."""

    by_slot: dict[int, StateCheckpoint] = field(default_factory=dict)

    def set(self, slot: int, checkpoint: StateCheckpoint | None) -> None:
        """Record the plan of the request in ``slot`` (None: no checkpoint)."""
        if checkpoint is None:
            self.by_slot.pop(slot, None)
        else:
            self.by_slot[slot] = checkpoint

    def get(self, slot: int) -> StateCheckpoint | None:
        """The latest plan of the request in ``slot``."""
        return self.by_slot.get(slot)
