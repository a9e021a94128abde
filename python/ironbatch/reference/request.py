"""A request as the scheduler tracks it (spec §3): its tokens and KV state,
its stopping rules, and where it is in its life."""

from __future__ import annotations

import enum
from typing import Any

from ironbatch.reference.block_hash import BlockHasher
from ironbatch.reference.block_table import BlockTable
from ironbatch.reference.sequence import Sequence


class RequestStatus(enum.IntEnum):
    """vLLM's order; every status after PREEMPTED is finished."""

    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2
    FINISHED_STOPPED = 3
    FINISHED_LENGTH_CAPPED = 4
    FINISHED_ABORTED = 5
    FINISHED_IGNORED = 6
    FINISHED_ERROR = 7

    @property
    def is_finished(self) -> bool:
        return self > RequestStatus.PREEMPTED

    @property
    def finish_reason(self) -> str | None:
        return _FINISH_REASONS.get(self)


_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH_CAPPED: "length",
    RequestStatus.FINISHED_IGNORED: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
    RequestStatus.FINISHED_ERROR: "error",
}


class Request:
    """The scheduler's copy of a request. ``seq`` holds its tokens,
    ``num_computed_tokens`` and block hashes; ``table`` its blocks."""

    def __init__(self, source: Any, hasher: BlockHasher, block_size: int) -> None:
        params = source.sampling_params
        self.request_id: str = source.request_id
        self.priority: int = source.priority
        self.arrival_time: float = source.arrival_time
        self.max_tokens: int = params.max_tokens
        self.min_tokens: int = params.min_tokens
        # ignore_eos turns EOS into an ordinary token; stop tokens still stop.
        self.eos_token_id: int | None = None if params.ignore_eos else source.eos_token_id
        self.stop_token_ids: frozenset[int] = frozenset(params.stop_token_ids)
        self.seq = Sequence(list(source.prompt_token_ids), source.cache_salt, hasher, block_size)
        self.table = BlockTable()
        self.slot = -1  # set by the scheduler
        self.status = RequestStatus.WAITING
        self.stop_reason: int | None = None
        self.num_preemptions = 0
        # Tokens scheduled whose output has not arrived (spec §5.4) ...
        self.in_flight_tokens = 0
        # ... and, after a preemption, how many of those are stale ...
        self.stale_tokens = 0
        # ... and whether that stale share is dropped instead (a reset preempted
        # it); kept through a later preemption until the share has drained.
        self.drop_stale = False
        # Async scheduling: tokens sampled in flight whose positions were
        # already scheduled (vLLM's num_output_placeholders).
        self.num_output_placeholders = 0
        # Skipped by a waiting pass and not admitted since (stats only).
        self.deferred = False

    @property
    def num_tokens(self) -> int:
        return self.seq.num_tokens

    @property
    def num_prompt_tokens(self) -> int:
        return self.seq.num_prompt_tokens

    @property
    def num_output_tokens(self) -> int:
        return self.seq.num_tokens - self.seq.num_prompt_tokens

    @property
    def num_computed_tokens(self) -> int:
        return self.seq.num_computed_tokens

    @num_computed_tokens.setter
    def num_computed_tokens(self, n: int) -> None:
        self.seq.num_computed_tokens = n

    @property
    def is_prefill_chunk(self) -> bool:
        """The last step left prompt (or resumed) tokens to compute: it
        samples nothing, so it gets no placeholder."""
        return self.num_computed_tokens < self.num_tokens + self.num_output_placeholders

    @property
    def output_token_ids(self) -> list[int]:
        return self.seq.tokens[self.seq.num_prompt_tokens :]

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, {self.status.name}, tokens={self.num_tokens}, "
            f"computed={self.num_computed_tokens})"
        )
