"""Streaming-input sessions at the scheduler (docs/scheduling.md §4.12):
chunks arriving under a live session's id, the end of a turn, and a session
continuing with its next chunk."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from ironbatch.reference.error import debug_str, duplicate_request
from ironbatch.reference.multimodal import check_inputs
from ironbatch.reference.request import NewRequest, RequestStatus, check_turn
from ironbatch.reference.session import SessionUpdate
from ironbatch.reference.spec_decode import NO_DRAFTS

if TYPE_CHECKING:
    from ironbatch.reference.scheduler import Scheduler


def add_session_chunk(s: Scheduler, slot: int, new: NewRequest) -> None:
    """``new`` arrived under the id of the live request in ``slot``: the next
    chunk of a session (or, when not resumable itself, the end of its input).
    Applied at once to a session waiting for input, queued otherwise; the end
    of input ends a waiting session as aborted, as vLLM does. Refused
    (``ValueError``, nothing changed) for a request that was not added as a
    session, and for a chunk whose limits are wrong or that has no token."""
    r = s.requests[slot]
    if r.session is None:
        raise duplicate_request(new.request_id)
    check_turn(new)
    if new.prompt_embeds_digests is not None:
        # vLLM refuses prompt embeddings in a session too.
        raise ValueError(
            f"prompt_embeds_digests of session {debug_str(new.request_id)}'s next chunk: a "
            "streaming session with prompt embeddings is not supported"
        )
    if new.mm_inputs:
        if s.config.encoder is None:
            raise ValueError(
                f"mm_features of session {debug_str(new.request_id)}'s next chunk: this "
                "scheduler has no encoder (a text model); configure its encoder budget and "
                "cache size"
            )
        check_inputs(new.request_id, new.mm_inputs, s.input_placement(len(new.prompt_token_ids)))
    # vLLM asserts later when a turn would have nothing to compute.
    if new.resumable and not new.prompt_token_ids:
        rid = debug_str(new.request_id)
        raise ValueError(f"prompt_token_ids of session {rid}'s next chunk must not be empty")
    update = (
        SessionUpdate(list(new.prompt_token_ids), list(new.mm_inputs), new.stop, new.arrival_time)
        if new.resumable
        else None
    )
    if r.status != RequestStatus.WAITING_FOR_STREAMING_REQ:
        r.session.append(update)
    elif update is not None:
        if not fits(s, slot, update):
            raise ValueError(
                f"prompt_token_ids of session {debug_str(new.request_id)}'s next chunk "
                f"({len(update.prompt_token_ids)} tokens) would take it to max_model_len "
                f"({s.config.max_model_len}) or beyond"
            )
        continue_session(s, slot, update)  # it stays where it waits
    else:
        s.finish_requests([new.request_id], RequestStatus.FINISHED_ABORTED)


def end_turn(s: Scheduler, slot: int) -> bool:
    """A turn of the request in ``slot`` stopped: whether it goes on as a
    streaming session (vLLM's ``_handle_stopped_request``). A session drops
    its turn's work in flight and keeps what it computed; it takes its next
    chunk if one is queued (the end of input finishes it), or waits for one."""
    r = s.requests[slot]
    if not r.resumable:
        return False
    r.seq.num_computed_tokens -= min(r.num_output_placeholders, r.seq.num_computed_tokens)
    r.drop_stale = True
    r.stale_tokens = r.in_flight_tokens
    r.num_output_placeholders = 0
    r.drafts = NO_DRAFTS
    if r.session:
        update = r.session.popleft()
        if update is None:
            return False  # the input ended: finished with this turn
        if not fits(s, slot, update):
            # A chunk that would not fit max_model_len ends it too (vLLM would
            # schedule positions it has no room for).
            return False
        continue_session(s, slot, update)
        return True
    r.status = RequestStatus.WAITING_FOR_STREAMING_REQ
    s.num_waiting_for_input += 1
    return True


def fits(s: Scheduler, slot: int, update: SessionUpdate) -> bool:
    """Whether the session in ``slot`` continued with ``update`` stays
    shorter than ``max_model_len``, as every prompt must."""
    keep = s.requests[slot].num_tokens - 1
    return keep + len(update.prompt_token_ids) < s.config.max_model_len


def continue_session(s: Scheduler, slot: int, update: SessionUpdate) -> None:
    """Continue the session in ``slot`` with its next chunk (vLLM's
    ``_update_request_as_session``): everything but its last sampled token
    becomes prompt, the chunk is appended, and the chunk's rules and arrival
    time replace the turn's. It waits again, wherever it waits."""
    r = s.requests[slot]
    keep = r.num_tokens - 1
    # vLLM's base: the session's tokens, all prompt now.
    inputs = [replace(m, offset=m.offset + keep) for m in update.mm_inputs]
    r.seq.continue_session(keep, update.prompt_token_ids, inputs, s.kv.hasher, s.kv.hash_block_size)
    # After the earlier chunks' images: their indices stay theirs.
    r.mm_inputs += tuple(inputs)
    assert r.num_cached_blocks() <= len(r.seq.block_hashes)
    r.stop = update.stop
    # In place, as vLLM does, even while it sits in a priority heap.
    r.arrival_time = update.arrival_time + 0.0
    if r.status == RequestStatus.WAITING_FOR_STREAMING_REQ:
        s.num_waiting_for_input -= 1
    r.status = RequestStatus.WAITING
