"""One KV-cache block's bookkeeping (docs/scheduling.md §7.1), and ceiling
division."""

from __future__ import annotations

from dataclasses import dataclass, field

#: Block 0 is reserved: taken out of the free queue when the pool is built,
#: never handed to a request, never hashed, never freed.
NULL_BLOCK = 0


@dataclass(eq=False)
class Block:
    """A block: its id, how many request tables hold it, and the hash of the
    full block it holds while that is in the prefix-cache map (kept after
    the block is freed, until it is reused: lazy eviction).

    The Rust core keeps blocks in one array and threads the free queue
    through index arrays; here ``prev``/``next`` thread it through the
    blocks themselves (``None`` while the block is out of the queue)."""

    block_id: int
    ref_cnt: int = 0
    hash: int | None = None
    #: The tokens its key covers when the key is the hash at fewer tokens
    #: than the block holds (a partial key, docs/scheduling.md §7.16: a
    #: full-attention prompt tail, a recurrent prefill checkpoint; vLLM's
    #: ``block_hash_num_tokens``); 0 when the key covers the whole block.
    partial_tokens: int = 0
    prev: Block | None = field(default=None, repr=False)
    next: Block | None = field(default=None, repr=False)


def cdiv(a: int, b: int) -> int:
    """Ceiling division."""
    return -(-a // b)
