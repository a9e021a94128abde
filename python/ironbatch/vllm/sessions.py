"""Streaming-input sessions on vLLM's side (docs/scheduling.md §4.12): what
the core does to a session that takes its next input chunk, written onto
vLLM's ``Request`` as vLLM's own ``_update_request_as_session`` writes it."""

from __future__ import annotations

from vllm.v1.request import Request, RequestStatus, StreamingUpdate


def continue_session(r: Request, update: StreamingUpdate, block_size: int) -> None:
    """All but the last sampled token become prompt, the chunk is appended,
    its rules and arrival time replace the turn's, and the session waits to
    be scheduled again."""
    keep = r.num_tokens - 1
    r.prompt_token_ids.extend(r._all_token_ids[r.num_prompt_tokens : keep])
    del r._all_token_ids[keep:]
    del r.block_hashes[keep // block_size :]
    r._output_token_ids.clear()
    r._all_token_ids.extend(update.prompt_token_ids or ())
    r.prompt_token_ids.extend(update.prompt_token_ids or ())
    r.update_block_hashes()
    r.num_prompt_tokens = len(r.prompt_token_ids)
    r.arrival_time = update.arrival_time
    r.sampling_params = update.sampling_params
    r.max_tokens = update.max_tokens
    r.status = RequestStatus.WAITING
