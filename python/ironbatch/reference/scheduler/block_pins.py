"""Blocks pinned from outside the scheduler (docs/scheduling.md §4.19): a KV
connector that manages vLLM's GPU block pool itself (SimpleCPUOffload,
Mooncake's store, UMBP) takes a reference on blocks while it copies them
and drops it when the copy is done (vLLM's ``BlockPool.touch`` and
``free_blocks``). A pinned block is held like any: it leaves the free
queue, its request's free does not return it, and a prefix-cache reset is
refused while it is pinned. The null block is passed over, as vLLM passes
it over."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from ironbatch.reference.args import u32_list
from ironbatch.reference.block import NULL_BLOCK

if TYPE_CHECKING:
    from ironbatch.reference.scheduler import Scheduler


class PinRequests:
    """A handle on which pins and unpins are asked for while the scheduler
    may be busy: a connector called from inside the scheduler's own work
    (where the core cannot be called back) queues its asks here, and the
    scheduler applies them, in order, right after that call returns (and
    before its next step or update, for asks made between its calls)."""

    def __init__(self) -> None:
        self.asks: list[tuple[bool, list[int]]] = []  # (pin, block ids)

    def pin(self, block_ids: list[int]) -> None:
        """Ask for each listed block to be pinned once."""
        self.asks.append((True, u32_list("block_ids", block_ids)))

    def unpin(self, block_ids: list[int]) -> None:
        """Ask for one pin per listed block to be dropped, in the order given."""
        self.asks.append((False, u32_list("block_ids", block_ids)))


def apply_pin_requests(s: Scheduler) -> None:
    """Apply the asks queued on ``s.pin_requests``, in order. One that is
    refused changes nothing and is kept for ``take_pin_errors``: a
    connector's bad ask never stops a step."""
    if not s.pin_requests.asks:
        return
    asks, s.pin_requests.asks = s.pin_requests.asks, []
    for pin, ids in asks:
        try:
            (pin_blocks if pin else unpin_blocks)(s, ids)
        except ValueError as e:
            s.pin_errors.append(str(e))


def pin_blocks(s: Scheduler, block_ids: list[int]) -> None:
    """Pin each listed block once (a block listed twice, twice). Checked
    first: an id outside the pool changes nothing."""
    ids = [b for b in u32_list("block_ids", block_ids) if b != NULL_BLOCK]
    s.kv.touch_blocks(ids)
    for b in ids:
        s.pins[b] = s.pins.get(b, 0) + 1


def unpin_blocks(s: Scheduler, block_ids: list[int]) -> None:
    """Drop one pin per listed block, in the order given: a block that holds
    no other reference goes back to the free queue (cached ones to its
    tail, in list order). Refused (``ValueError``), changing nothing, for a
    block listed more often than it is pinned."""
    given = u32_list("block_ids", block_ids)
    listed: Counter[int] = Counter()
    for i, b in enumerate(given):
        if b == NULL_BLOCK:
            continue
        listed[b] += 1
        pinned = s.pins.get(b, 0)
        if listed[b] > pinned:
            raise ValueError(
                f"unpin_blocks: block_ids[{i}] = {b} is pinned {pinned} time(s), "
                f"listed {listed[b]} time(s)"
            )
    s.kv.free_touched_blocks([b for b in given if b != NULL_BLOCK])
    for b, n in listed.items():
        s.pins[b] -= n
        if s.pins[b] == 0:
            del s.pins[b]


def pinned_blocks(s: Scheduler) -> list[tuple[int, int]]:
    """Each pinned block and its pins, by block id."""
    return sorted(s.pins.items())
