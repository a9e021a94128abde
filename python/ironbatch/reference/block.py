"""One KV-cache block's bookkeeping (spec §7.1)."""

from __future__ import annotations

from dataclasses import dataclass, field

#: Block 0 is reserved: never handed out, hashed or freed.
NULL_BLOCK = 0


@dataclass(eq=False)
class Block:
    """A block: its id, how many request tables hold it, and the hash of the
    full block it holds while cached. ``prev``/``next`` thread it into the
    free queue (``None`` while it is out of the queue)."""

    block_id: int
    ref_cnt: int = 0
    hash: int | None = None
    prev: Block | None = field(default=None, repr=False)
    next: Block | None = field(default=None, repr=False)
