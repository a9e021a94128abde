"""Prefill chunks that end where a recurrent state can be cached (the twin of
``rust/src/scheduler/state_aligned_split.rs``; docs/scheduling.md §7.15;
vLLM's ``_mamba_block_aligned_split``). In cache mode "align" a Mamba group
keeps the state a chunk ends with, in the block the chunk ends in; for that
state to be a block's, the chunk must end on a block boundary. So a prefill
chunk is cut back to one, and never runs past the last boundary a later
request could resume from or a prefix another request shares. The prompt's
last chunk is exempt: the decode steps after it carry its state on to the
next boundary."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ironbatch.reference.attention_group import checkpoint_in_chunk

if TYPE_CHECKING:
    from ironbatch.reference.scheduler import Scheduler


def state_aligned_split(s: Scheduler, slot: int, n: int, start: int) -> int:
    """``n`` tokens for the request in ``slot`` from ``start`` on (its
    computed tokens and hits), cut to end where a state can be cached; 0 when
    no such end fits. Unchanged past the prefill or outside cache mode
    "align"."""
    if not s.kv.caches_states():
        return n
    r = s.requests[slot]
    num_tokens = r.num_tokens
    # A resumed request replays its output as prefill too.
    prefill_end = max(r.seq.num_prompt_tokens, num_tokens - 1)
    if start >= prefill_end:
        return n
    # vLLM cuts at its cache's block size, the least group's: the recurrent
    # groups', which is the hash block (validated).
    bs = s.kv.hash_block_size
    end = start + n
    # A backend that writes the prompt's checkpoint from inside the chunk
    # that ends the prefill needs no stop there. That checkpoint lies where
    # hits land, on the scheduler block.
    checkpoint = s.kv.state_checkpoint(prefill_end, s.kv.scheduler_block_size)
    alignment = s.kv.checkpoint_alignment()
    inside = (
        alignment is not None
        and end >= prefill_end
        and checkpoint_in_chunk(start, end, checkpoint, bs, alignment)
    )
    last_cacheable = 0 if inside else s.kv.state_checkpoint(num_tokens, bs)
    if end < prefill_end:
        c = s.config
        most = c.max_num_scheduled_tokens
        if c.long_prefill_token_threshold > 0:
            most = min(most, c.long_prefill_token_threshold)
        # Back to a boundary, unless none lies past the start and a block is
        # more than a chunk may ever be (then the chunk runs on privately to
        # the next boundary).
        aligned = end // bs * bs
        if aligned > start or bs <= most:
            end = aligned
    # A chunk that starts inside a block stops at its end.
    block_end = (start // bs + 1) * bs if start % bs and not inside else 0
    # A shared prefix's end, rounded down by whole blocks from the start.
    junction = r.seq.shared_prefix_boundary
    junction_stop = start + (junction - start) // bs * bs if start < junction < end else 0
    stops = [x for x in (block_end, last_cacheable, junction_stop) if start < x < end]
    end = min(stops, default=end)
    return max(end - start, 0)
