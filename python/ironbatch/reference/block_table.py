"""A request's block table (docs/scheduling.md §7.1): block ``k`` holds its
tokens ``[k*bs, (k+1)*bs)``; the first ``num_cached`` blocks are
hash-cached."""

from __future__ import annotations

from dataclasses import dataclass, field

from ironbatch.reference.block import Block


@dataclass
class StateSlots:
    """Where a recurrent group's table keeps its live states in cache mode
    "align" (docs/scheduling.md §7.15; vLLM's ``MambaManager`` bookkeeping):
    the table holds a state block at each position a chunk ended on, nulls
    between them, and the scratch states at its end."""

    #: The table has been through an allocation (its scratch states are
    #: taken): later growth is one state block per step.
    allocated: bool = False
    #: The position of the state the latest growth started from, freed once
    #: the step after it has read it; None before any.
    previous: int | None = None
    #: Positions below this one were given back already.
    retired: int = 0


@dataclass
class BlockTable:
    """The blocks one request holds, in token order."""

    blocks: list[Block] = field(default_factory=list)
    num_cached: int = 0
    #: Blocks the latest allocation appended (the step's new block ids of a
    #: running request).
    grown: int = 0
    #: A recurrent group's states in cache mode "align"; unused otherwise.
    states: StateSlots = field(default_factory=lambda: StateSlots())

    def block_ids(self) -> list[int]:
        return [b.block_id for b in self.blocks]

    def num_cached_blocks(self) -> int:
        """How many leading blocks are in the prefix-cache map."""
        return self.num_cached

    def last_block(self) -> int:
        """The last block id, or 0 for an empty table."""
        return self.blocks[-1].block_id if self.blocks else 0

    def __len__(self) -> int:
        return len(self.blocks)

    def is_empty(self) -> bool:
        return not self.blocks
