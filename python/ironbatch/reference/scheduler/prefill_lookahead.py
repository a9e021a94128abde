"""Multi-module MTP's prefill lookahead (docs/scheduling.md §4.13): at a
prefill chunk's end the drafter's modules read the next
``drafter_read_ahead`` prompt tokens as their inputs, so a chunk never ends
closer than that to the prompt's end: it either finishes the prompt or
leaves the modules their runway (vLLM's ``_reserve_prefill_lookahead``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ironbatch.reference.scheduler import Scheduler


def reserve_prefill_lookahead(s: Scheduler, slot: int, computed: int, n: int) -> int:
    """``n`` tokens for the request in ``slot`` from ``computed`` on, cut so
    the chunk does not end within the drafter's read-ahead of the known
    tokens' end; 0 when nothing is left to schedule. Only a read-ahead
    above 1 can cut (one token ahead always lies in the next chunk)."""
    read_ahead = s.config.drafter_read_ahead
    end = computed + n
    known = s.requests[slot].num_tokens
    if end < known and known - end < read_ahead:
        return max(n - (read_ahead - (known - end)), 0)
    return n
