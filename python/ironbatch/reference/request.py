"""A request as the scheduler tracks it (docs/scheduling.md §3): its tokens
and KV state, its stopping rules, and where it is in its life."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

from ironbatch.reference.block_hash import CacheSalt, ExtraKey, LoraKey
from ironbatch.reference.block_table import BlockTable
from ironbatch.reference.grammar import Grammar
from ironbatch.reference.limits import MAX_TOKENS, check_range
from ironbatch.reference.lora import LoraAdapter
from ironbatch.reference.multimodal import MultimodalInput
from ironbatch.reference.sequence import Sequence
from ironbatch.reference.session import SessionQueue
from ironbatch.reference.spec_decode import NO_DRAFTS, Drafts


class RequestStatus(enum.IntEnum):
    """vLLM's statuses, in vLLM's order; every one after PREEMPTED is finished."""

    WAITING = 0
    #: Its KV cache is being loaded by a KV connector; it holds the blocks
    #: and waits for the load to be reported (docs/scheduling.md §4.19).
    WAITING_FOR_REMOTE_KVS = 1
    #: A streaming session between turns: it holds its KV cache and waits
    #: for its next input chunk (docs/scheduling.md §4.12).
    WAITING_FOR_STREAMING_REQ = 2
    RUNNING = 3
    PREEMPTED = 4
    FINISHED_STOPPED = 5
    FINISHED_LENGTH_CAPPED = 6
    FINISHED_ABORTED = 7
    FINISHED_IGNORED = 8
    FINISHED_ERROR = 9
    FINISHED_REPETITION = 10

    @property
    def is_finished(self) -> bool:
        """Whether the request has ended."""
        return self > RequestStatus.PREEMPTED

    @property
    def finish_reason(self) -> str | None:
        """The finish reason vLLM reports for a finished status."""
        return _FINISH_REASONS.get(self)


_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH_CAPPED: "length",
    RequestStatus.FINISHED_IGNORED: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
    RequestStatus.FINISHED_ERROR: "error",
    RequestStatus.FINISHED_REPETITION: "repetition",
}

#: The stop reason vLLM reports for a repetition.
REPETITION_DETECTED = "repetition_detected"

#: The finished statuses' names, in enum order: what ``finish_requests``
#: accepts by name.
FINISHED_STATUS_NAMES: tuple[str, ...] = tuple(s.name for s in RequestStatus if s.is_finished)


@dataclass(frozen=True)
class Repetition:
    """vLLM's ``repetition_detection``: stop once the output ends in a
    pattern of ``min_pattern_size..max_pattern_size`` tokens (0 means 1)
    repeated ``min_count`` times."""

    min_pattern_size: int
    max_pattern_size: int
    min_count: int


@dataclass
class StopRules:
    """When a request stops (docs/scheduling.md §5.2)."""

    #: Most output tokens (>= 1).
    max_tokens: int
    #: Kept for the sampler; the scheduler's checks ignore it (Q3).
    min_tokens: int
    #: None when there is none or ``ignore_eos`` is set.
    eos_token_id: int | None
    #: Tokens that stop the request (honoured even with ``ignore_eos``).
    stop_token_ids: list[int] = field(default_factory=list)
    #: Stop on a repeating output pattern, once ``min_tokens`` are out.
    repetition: Repetition | None = None


@dataclass
class NewRequest:
    """What a client submits, as the core stores it."""

    request_id: str
    prompt_token_ids: list[int]
    stop: StopRules
    #: Lower runs first.
    priority: int = 0
    #: Seconds; ties in priority go to the earlier arrival.
    arrival_time: float = 0.0
    cache_salt: str | None = None
    #: Its LoRA adapter; None for the base model.
    lora: LoraAdapter | None = None
    #: Its images (audio, video), sorted by position (§4.15).
    mm_inputs: list[MultimodalInput] = field(default_factory=list)
    #: A prompt given as embeddings (vLLM's ``prompt_embeds``): the digest of
    #: each block's embeddings, one per block the prompt overlaps (covering the
    #: hash lookahead's tokens too); they key its block hashes (§7.4).
    prompt_embeds_digests: list[bytes] | None = None
    #: Never read prefix-cache hits (vLLM sets it for requests that want
    #: prompt logprobs, which a hit would leave uncomputed); its blocks are
    #: still cached for others.
    skip_reading_prefix_cache: bool = False
    #: Its output follows a grammar (vLLM's structured outputs): it waits
    #: for the grammar to compile, and the caller checks its tokens.
    structured_output: bool = False
    #: Report its prefix hits as KV-cache events at every lookup (vLLM's
    #: ``kv_cache_report_mode="full"``).
    report_hits: bool = False
    #: One chunk of a streaming-input session (vLLM's ``resumable``): later
    #: chunks come as requests with the same id.
    resumable: bool = False


def hash_keys(new: NewRequest) -> list[ExtraKey]:
    """What its block hashes are keyed by besides its tokens: its adapter
    and its ``cache_salt``."""
    keys: list[ExtraKey] = []
    if new.lora is not None:
        keys.append(LoraKey(new.lora.name, new.lora.path))
    if new.cache_salt is not None:
        keys.append(CacheSalt(new.cache_salt))
    return keys


def check_turn(new: NewRequest) -> None:
    """The rules of one turn (a request, or a session's chunk): ``max_tokens``
    in ``[1, MAX_TOKENS]``, ``min_tokens <= max_tokens``, an arrival time that
    is a number."""
    check_range("max_tokens", new.stop.max_tokens, 1, MAX_TOKENS)
    if not 0 <= new.stop.min_tokens <= new.stop.max_tokens:
        raise ValueError(
            f"min_tokens must be in [0, max_tokens={new.stop.max_tokens}], "
            f"got {new.stop.min_tokens}"
        )
    if math.isnan(new.arrival_time):
        raise ValueError("arrival_time must not be NaN")


@dataclass(eq=False)
class Request:
    """The scheduler's state for one live request."""

    request_id: str
    stop: StopRules
    priority: int
    arrival_time: float
    #: Tokens, ``num_computed_tokens`` and block hashes.
    seq: Sequence
    #: The blocks it holds, one table per KV-cache group (all of one length;
    #: a window group's past positions hold the null block).
    tables: list[BlockTable] = field(default_factory=lambda: [BlockTable()])
    status: RequestStatus = RequestStatus.WAITING
    #: The stop token that ended it.
    stop_reason: int | str | None = None
    num_preemptions: int = 0
    #: Tokens scheduled whose output has not arrived (docs/scheduling.md §5.4) ...
    in_flight_tokens: int = 0
    #: ... after a preemption, how many of those are stale (their tokens
    #: still arrive) ...
    stale_tokens: int = 0
    #: ... and whether the stale share is dropped instead (a reset preempted
    #: it and may resample those positions); kept through a later preemption
    #: until that share has drained.
    drop_stale: bool = False
    #: Async scheduling: tokens sampled in flight that positions were
    #: already scheduled for (vLLM's ``num_output_placeholders``).
    num_output_placeholders: int = 0
    #: Skipped by a waiting pass and not admitted since (vLLM's
    #: ``deferred_waiting``; only counted in the stats).
    deferred: bool = False
    #: A KV connector reported its load (WAITING_FOR_REMOTE_KVS only): the
    #: next waiting pass that reaches it settles the load (§4.19).
    kv_loaded: bool = False
    #: Part or all of its load failed and it computes what did not arrive
    #: (vLLM's ``failed_recving_kv_req_ids``; WAITING_FOR_REMOTE_KVS only).
    kv_load_failed: bool = False
    #: The last step (of ``sched_step_seq``) that scheduled it, while frees
    #: are fenced (§4.19).
    last_sched_seq: int = 0
    #: Admitted with prompt left to compute, or loading (vLLM's
    #: ``_inflight_prefills``): an async load keeps room for what it still
    #: needs (§4.19).
    inflight_prefill: bool = False
    #: Admitted without prefix-cache hits, and not counted in the
    #: prefix-cache stats.
    skip_reading_prefix_cache: bool = False
    #: A structured-output request's grammar; None for the others.
    grammar: Grammar | None = None
    #: Report its prefix hits as KV-cache events.
    report_hits: bool = False
    #: Whether its last scheduled step left tokens to compute, as of that
    #: step (vLLM's ``is_prefill_chunk`` attribute, which prefill holds read).
    prefill_chunk: bool = False
    #: The first ``schedule()`` call at which it may decode again (the decode
    #: stagger, docs/scheduling.md §4.9).
    next_decode_step: int = 0
    #: A streaming session continues after a turn stops (cleared when its
    #: grammar rejects a token).
    resumable: bool = False
    #: A streaming session's chunks not applied yet; None for a request that
    #: was not added as one.
    session: SessionQueue | None = None
    #: Draft tokens for its next step (vLLM's ``spec_token_ids``, §4.13).
    drafts: Drafts = NO_DRAFTS
    #: Its LoRA adapter's id (what ``max_loras`` counts); None for the base model.
    lora_id: int | None = None
    #: Its multimodal inputs, sorted by position (empty for text).
    mm_inputs: tuple[MultimodalInput, ...] = ()

    @classmethod
    def waiting(cls, new: NewRequest, seq: Sequence, num_groups: int) -> Request:
        """A request as ``add_request`` queues it: waiting, nothing computed,
        its tokens (and their hashes) in ``seq``, an empty table per KV-cache
        group."""
        return cls(
            request_id=new.request_id,
            stop=new.stop,
            priority=new.priority,
            # + 0.0 turns -0.0 into 0.0, as the core does so its order matches.
            arrival_time=new.arrival_time + 0.0,
            seq=seq,
            tables=[BlockTable() for _ in range(num_groups)],
            skip_reading_prefix_cache=new.skip_reading_prefix_cache,
            grammar=Grammar.COMPILING if new.structured_output else None,
            report_hits=new.report_hits,
            resumable=new.resumable,
            session=SessionQueue() if new.resumable else None,
            lora_id=None if new.lora is None else new.lora.id,
            mm_inputs=tuple(new.mm_inputs),
        )

    @property
    def num_blocks(self) -> int:
        """Blocks in its first KV-cache group's table (the one a step's
        block ranges are read off); 0 for a model without a KV cache."""
        return len(self.tables[0]) if self.tables else 0

    def num_cached_blocks(self) -> int:
        """Hash-cached blocks in its first group's table (what a
        ``BlockStored`` event reports); 0 for a model without a KV cache."""
        return self.tables[0].num_cached_blocks() if self.tables else 0

    @property
    def num_tokens(self) -> int:
        """Prompt plus output tokens."""
        return self.seq.num_tokens

    @property
    def num_output_tokens(self) -> int:
        """Output tokens so far."""
        return self.seq.num_tokens - self.seq.num_prompt_tokens

    @property
    def holds_kv(self) -> bool:
        """Whether it holds KV blocks while waiting (a streaming session
        between turns): such requests wait apart and are admitted first."""
        # A load that failed whole leaves 0 computed tokens, blocks still
        # held until the load is settled (§4.19).
        return (
            self.seq.num_computed_tokens > 0 or self.status == RequestStatus.WAITING_FOR_REMOTE_KVS
        )

    @property
    def is_blocked(self) -> bool:
        """Whether a waiting pass skips it: a session waiting for input, a
        load on its way, or a grammar not ready (vLLM's blocked statuses)."""
        return self.status in (
            RequestStatus.WAITING_FOR_STREAMING_REQ,
            RequestStatus.WAITING_FOR_REMOTE_KVS,
        ) or (self.grammar is not None and self.grammar.holds)

    @property
    def is_prefill_chunk(self) -> bool:
        """Whether the last step left prompt (or resumed) tokens to compute:
        such a step samples nothing, so gets no placeholder."""
        return self.seq.num_computed_tokens < self.num_tokens + self.num_output_placeholders
