"""Streaming-input sessions on vLLM's side (docs/scheduling.md §4.12): a
session's next input chunk, taken as vLLM takes it, and what the core does
to a session that takes one, written onto vLLM's ``Request`` as vLLM's own
``_update_request_as_session`` writes it.

The functions that take the drop-in ``Scheduler`` share its state (its
mirror of vLLM's requests, its core); its ``add_request`` and the step's
outputs call them."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING

from vllm.v1.engine import EngineCoreEventType
from vllm.v1.request import Request, RequestStatus, StreamingUpdate

from ironbatch import _core

if TYPE_CHECKING:
    from ironbatch.vllm.scheduler import Scheduler

logger = logging.getLogger("ironbatch.vllm")


def continue_session(r: Request, update: StreamingUpdate, hash_block_size: int) -> None:
    """All but the last sampled token become prompt, the chunk (and its
    images) is appended, its rules and arrival time replace the turn's, and
    the session waits to be scheduled again. Its hashes (one per hash
    block, docs/scheduling.md §7.16) past the kept tokens go."""
    keep = r.num_tokens - 1
    # vLLM hashes each token as it is appended, so a kept block's hash may
    # cover the dropped token (a drafter's lookahead): hash it first, as
    # vLLM did, before the token goes.
    r.update_block_hashes()
    r.prompt_token_ids.extend(r._all_token_ids[r.num_prompt_tokens : keep])
    del r._all_token_ids[keep:]
    del r.block_hashes[keep // hash_block_size :]
    r._output_token_ids.clear()
    if update.mm_features:
        # The chunk's images, placed after what the session keeps.
        for feature in update.mm_features:
            feature.mm_position = replace(
                feature.mm_position, offset=feature.mm_position.offset + keep
            )
        r.mm_features.extend(update.mm_features)
    r._all_token_ids.extend(update.prompt_token_ids or ())
    r.prompt_token_ids.extend(update.prompt_token_ids or ())
    r.update_block_hashes()
    r.num_prompt_tokens = len(r.prompt_token_ids)
    r.arrival_time = update.arrival_time
    r.sampling_params = update.sampling_params
    r.max_tokens = update.max_tokens
    r.status = RequestStatus.WAITING


def add_session_chunk(s: Scheduler, session: Request, chunk: Request) -> None:
    """The next input chunk of a streaming session (or, not resumable,
    the end of its input), as vLLM takes it: applied at once to a session
    waiting for input, queued otherwise; the end of input ends a waiting
    session as aborted, with no output of its own."""
    rid = session.request_id
    if session.streaming_queue is None:
        raise ValueError(f"request_id {rid!r} is already in the scheduler")
    update = StreamingUpdate.from_request(chunk)
    waiting_for_input = session.status == RequestStatus.WAITING_FOR_STREAMING_REQ
    if waiting_for_input and update is None:
        s.finish_requests(rid, RequestStatus.FINISHED_ABORTED)
        return
    if waiting_for_input:
        s._mirror.sync(session)  # the turn's tokens, before the chunk extends them
    s._core_add(chunk)  # checked there: a refused chunk changes nothing
    if waiting_for_input:
        next_chunk(s, session, update)
    else:
        session.streaming_queue.append(update)


def next_chunk(s: Scheduler, r: Request, update: StreamingUpdate) -> None:
    """The session takes its next chunk (``continue_session``); with stats
    on, it is queued again as vLLM logs it."""
    continue_session(r, update, s.hash_block_size)
    if s.log_stats:
        r.record_event(EngineCoreEventType.QUEUED)
        s._mirror.mark_full(r)


def end_turn(s: Scheduler, r: Request, slot: int) -> None:
    """A streaming session's turn ended and it goes on (the core decided):
    it takes its next chunk if one is queued, else waits for one."""
    if r.streaming_queue:
        next_chunk(s, r, r.streaming_queue.popleft())
    else:
        r.status = RequestStatus.WAITING_FOR_STREAMING_REQ
    if r.stop_reason is not None:
        s._mirror.full_output_slots.add(slot)  # every later output carries it
    if not s._core.has_request(r.request_id):
        return  # ended with an error in the same update: its state comes with that
    tokens, r.num_computed_tokens = _core.vllm_request_state(s._core.core, slot)
    if len(tokens) != r.num_tokens:  # never expected: the core's tokens rule
        logger.error("session %s: tokens out of step with the core", r.request_id)
        s._mirror.set_tokens(r, tokens)
