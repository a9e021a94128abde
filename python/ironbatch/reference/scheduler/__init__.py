"""The scheduler: vLLM 0.33's V1 continuous batching (docs/scheduling.md
§4–6).

There is no prefill phase and no decode phase. Every request is behind by
``num_tokens - num_computed_tokens`` tokens, and each step hands out a token
budget to close those gaps: first to running requests, in order
(``running_pass``), then to waiting ones (``waiting_pass``). A running
request that cannot get a block preempts a victim (``preemption``): its
blocks are freed and its tokens recomputed later. ``step_columns`` turns a
step's decisions into the model runner's columns; ``update`` applies the
tokens that come back.

Requests live in a ``Slab``; a slot's generation changes when it is freed,
so a step's output applied late never touches a request that reused the
slot.

The module functions take the ``Scheduler`` as their first argument and
share its state attributes (``requests``, ``ids``, ``waiting_queue``,
``running``, ...); callers outside this package use the methods."""

from __future__ import annotations

import enum
import itertools
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ironbatch.reference.aux_output_retention import AuxOutputRetention
from ironbatch.reference.ec_connector import SafeEcConnector
from ironbatch.reference.encoder_cache import EncoderCache
from ironbatch.reference.encoder_decoder_cache import EncoderDecoderCache
from ironbatch.reference.error import debug_str, duplicate_request
from ironbatch.reference.kv_cache_manager import KvCacheManager
from ironbatch.reference.kv_cache_manager.boundary_states import BoundaryState
from ironbatch.reference.kv_connector import (
    KvConnectorSetup,
    KvTransferReport,
    SafeConnector,
)
from ironbatch.reference.kv_events import KvEvent, Released
from ironbatch.reference.multimodal import ENCODER, InPrompt, InputPlacement, check_inputs
from ironbatch.reference.prefill_cadence import PrefillCadence
from ironbatch.reference.prefix_cache_stats import PrefixCacheStats
from ironbatch.reference.request import (
    NewRequest,
    Request,
    RequestStatus,
    check_turn,
    hash_keys,
)
from ironbatch.reference.request_queue import WaitingQueue
from ironbatch.reference.scheduler import (
    aux_outputs,
    block_pins,
    drafts,
    ec_transfer,
    encoder_inputs,
    kv_transfer,
    pooler_output,
    preemption,
    request_errors,
    running_pass,
    session,
    update,
    waiting_pass,
)
from ironbatch.reference.scheduler.encoder_inputs import ScheduledEncoderInputs
from ironbatch.reference.scheduler.step_columns import finish_step
from ironbatch.reference.scheduler_config import Runner, SchedulerSettings, settings, validate
from ironbatch.reference.sequence import Sequence
from ironbatch.reference.slab import Slab
from ironbatch.reference.spec_decode import Drafts
from ironbatch.reference.step import StepEntry, StepOutput, UpdateOutput

__all__ = ["Pause", "ScheduledEncoderInputs", "Scheduler", "SchedulerStats", "StepDraft"]

# Tells one scheduler's steps from another's (the core's global counter).
_NEXT_SCHEDULER_ID = itertools.count(1)


#: The encoder's outputs as the scheduler tracks them: a cache shared by
#: identifier (§4.15), or an encoder-decoder's slot count (§4.17).
EncoderStore = EncoderCache | EncoderDecoderCache


def new_encoder_store(c: SchedulerSettings) -> EncoderStore:
    """The store ``c`` asks for: an encoder-decoder's when a KV-cache group
    is cross-attention."""
    size = 0 if c.encoder is None else c.encoder.cache_size
    if any(g.kind.is_cross() for g in c.kv_cache_groups):
        return EncoderDecoderCache(size)
    return EncoderCache(size)


@dataclass
class DeferredFree:
    """Blocks a freed request left while a step in flight may still write
    them: they go back to the pool once step ``fence`` has come back."""

    fence: int
    #: In allocation order.
    blocks: list[int]


@dataclass
class SchedulerStats:
    """What ``make_stats`` reports (docs/scheduling.md §7.10)."""

    num_running_reqs: int
    #: Waiting and not skipped by a waiting pass since.
    num_waiting_reqs: int
    #: Waiting, skipped by a waiting pass (output in flight) and not
    #: admitted since.
    num_skipped_waiting_reqs: int
    kv_cache_usage: float
    prefix_cache_stats: PrefixCacheStats
    #: Preemptions since the stats were last taken.
    num_preempted_reqs: int


class Pause(enum.IntEnum):
    """vLLM's pause states (docs/scheduling.md §4.8)."""

    #: Schedules as usual.
    UNPAUSED = 0
    #: Admits nobody; running requests go on.
    NEW = 1
    #: Schedules nothing (steps still report finished and preempted ids).
    ALL = 2


@dataclass
class StepDraft:
    """A step being decided: what is left of the budget and what is
    scheduled so far, handed from the running pass to the waiting pass."""

    #: Tokens the scheduler may still hand out (``max_num_scheduled_tokens``).
    token_budget: int
    #: Tokens the model runner may still take (``max_num_batched_tokens``);
    #: both shrink alike until speculative decoding tells them apart.
    input_budget: int
    #: ``long_prefill_token_threshold`` as it applies this step; 0 is off.
    threshold: int
    entries: list[StepEntry] = field(default_factory=list)
    #: Someone was preempted this step: no admissions (Q5).
    preempted_any: bool = False
    #: Structured-output requests the waiting pass released or found failed
    #: (§4.10).
    grammar_released: list[int] = field(default_factory=list)
    grammar_failed: list[int] = field(default_factory=list)
    #: This step holds prefill work back (§4.11): running prefill chunks are
    #: skipped and admissions with prompt left stop the waiting pass.
    hold_prefills: bool = False
    #: It carried prefill work: a running prefill chunk, or an admission with
    #: prompt left to compute.
    carried_prefill: bool = False
    #: The running pass scheduled a prefill chunk (which keeps admissions
    #: from being padded with drafts, §4.13) ...
    running_prefill: bool = False
    #: ... or scheduled anyone at all.
    running_scheduled: bool = False
    #: Some request scheduled this step (even if preempted later in it) may
    #: verify the drafts proposed after it (§4.13).
    drafts_needed: bool = False
    #: Embeddings the encoder may still compute this step (§4.15).
    encoder_budget: int = 0
    #: The encoder inputs scheduled so far, by request.
    encoder_inputs: list[ScheduledEncoderInputs] = field(default_factory=list)
    #: Requests whose encoder inputs disagree with the cache (the caller
    #: ends them).
    encoder_mismatch: list[int] = field(default_factory=list)
    #: An admission took external tokens loaded in this step (§4.19).
    sync_kv_loads: bool = False


class Scheduler:
    """vLLM 0.33's V1 scheduler, over the API's ``SchedulerConfig`` and
    ``CacheConfig`` (read by attribute)."""

    def __init__(self, scheduler_config: Any, cache_config: Any) -> None:
        """A scheduler over a fresh KV cache."""
        c = settings(scheduler_config, cache_config)
        validate(c)
        self.config: SchedulerSettings = c
        self.policy = c.policy
        self.kv = KvCacheManager(
            c.num_blocks,
            c.block_size,
            c.max_model_len,
            c.enable_prefix_caching,
            num_lookahead_tokens=c.num_lookahead_tokens,
            num_hash_lookahead_tokens=c.num_hash_lookahead_tokens,
            drop_eagle_block=c.drop_eagle_block,
            groups=c.kv_cache_groups,
            sparse_retention=c.sparse_retention,
            retention_interval=c.retention_interval,
            eagle_groups=c.eagle_groups,
            mixed_precision=c.mixed_precision,
        ).with_reprefillable_tokens(max(c.drafter_read_ahead - 1, 0))
        self.requests: Slab[Request] = Slab()
        self.ids: dict[str, int] = {}
        self.waiting_queue = WaitingQueue(self.policy)
        #: Waiting requests that hold KV blocks (streaming sessions between
        #: turns): admitted before any in ``waiting_queue`` (§4.12).
        self.kv_holding_queue = WaitingQueue(self.policy)
        #: Sessions waiting for their next chunk: they keep a runner slot, so
        #: they count against ``max_num_active_seqs``.
        self.num_waiting_for_input = 0
        #: Running requests' slots, in order.
        self.running: list[int] = []
        # Since the last step: reported (sorted) by the next one.
        self.finished_ids: list[str] = []
        self.preempted_ids: list[str] = []
        # Preemptions since the stats were last taken.
        self.num_preempted = 0
        # Waiting requests skipped by a waiting pass (their output in flight).
        self.num_deferred = 0
        self._pause = Pause.UNPAUSED
        self.id = next(_NEXT_SCHEDULER_ID)
        self.next_step = 0
        # Steps scheduled whose output has not been applied.
        self.pending_steps: deque[int] = deque()
        #: ``schedule()`` calls so far, this one included (the decode
        #: stagger's clock).
        self.current_step = 0
        #: When prefills wait (docs/scheduling.md §4.11).
        self.cadence = PrefillCadence(c.prefill_schedule_interval)
        #: Which encoder outputs the model runner holds.
        self.encoder: EncoderStore = new_encoder_store(c)
        #: The scheduler's side of an encoder-cache connector, if any (§4.20).
        self.ec_connector: SafeEcConnector | None = None
        #: The scheduler's side of a KV connector, if any (§4.19).
        self.connector: SafeConnector | None = None
        #: How the scheduler works with its KV connector (§4.19).
        self.kv_setup = KvConnectorSetup()
        #: Fenced frees (§4.19): steps scheduled with tokens, and those whose
        #: output came back, counted while ``kv_setup.defer_block_free``.
        self.sched_step_seq = 0
        self.processed_step_seq = 0
        #: Blocks waiting for a step in flight to come back, oldest first.
        self.deferred_frees: deque[DeferredFree] = deque()
        #: Which blocks' auxiliary outputs the workers hold, when followed
        #: (§7.12).
        self.aux_retention: AuxOutputRetention | None = None
        # References taken on blocks from outside any request, per block
        # (``block_pins``).
        self.pins: dict[int, int] = {}
        # Pins asked for by whoever holds the handle, applied at the next
        # point the scheduler takes them; those refused, for the caller.
        self.pin_requests = block_pins.PinRequests()
        self.pin_errors: list[str] = []

    # -- inspection -----------------------------------------------------------

    @property
    def encoder_cache(self) -> EncoderCache | None:
        """The shared encoder cache's bookkeeping, for inspection (None for
        an encoder-decoder model)."""
        return self.encoder if isinstance(self.encoder, EncoderCache) else None

    @property
    def encoder_decoder_cache(self) -> EncoderDecoderCache | None:
        """An encoder-decoder model's encoder slots, for inspection."""
        return self.encoder if isinstance(self.encoder, EncoderDecoderCache) else None

    def input_placement(self, num_prompt_tokens: int) -> InputPlacement:
        """Where requests' multimodal inputs sit, for a prompt of
        ``num_prompt_tokens``: an encoder-decoder's are the encoder's."""
        if isinstance(self.encoder, EncoderDecoderCache):
            return ENCODER
        return InPrompt(num_prompt_tokens)

    def reset_encoder_cache(self) -> None:
        """Forget every encoder output (vLLM's ``reset_encoder_cache``, after a
        weight update): the cache starts empty, running requests hold no
        references, and no eviction is reported for the entries dropped."""
        self.encoder = new_encoder_store(self.config)

    def request(self, slot: int) -> Request | None:
        """The live request in ``slot``."""
        return self.requests.get(slot)

    def is_live(self, entry: StepEntry) -> bool:
        """Whether the request a step entry scheduled is still live (not
        finished, its slot not reused). A finished request whose blocks a KV
        connector holds stays in its slot; its rows are skipped as vLLM
        skips them (§4.19)."""
        return (
            self.requests.holds(entry.slot, entry.generation)
            and not self.requests[entry.slot].status.is_finished
        )

    def has_request(self, request_id: str) -> bool:
        """Whether ``request_id`` is a live request."""
        return request_id in self.ids

    def slot_of(self, request_id: str) -> int | None:
        """The slot of the live request ``request_id``."""
        return self.ids.get(request_id)

    def waiting(self) -> Iterator[int]:
        """Waiting requests that hold no KV blocks, in admission order."""
        return self.waiting_queue.iter(self.requests)

    def kv_holding(self) -> Iterator[int]:
        """Waiting requests that hold KV blocks (sessions between turns), in
        admission order; admitted before those in ``waiting``."""
        return self.kv_holding_queue.iter(self.requests)

    def set_pause(self, pause: Pause) -> None:
        """Pause or resume scheduling (vLLM's ``set_pause_state``)."""
        self._pause = Pause(pause)

    @property
    def pause(self) -> Pause:
        return self._pause

    def request_counts(self) -> tuple[int, int]:
        """(running, waiting) request counts; sessions between turns count as
        waiting."""
        return len(self.running), len(self.waiting_queue) + len(self.kv_holding_queue)

    def num_unfinished_requests(self) -> int:
        """Unfinished requests, sessions between turns included."""
        return len(self.running) + len(self.waiting_queue) + len(self.kv_holding_queue)

    #: The binding's (and vLLM's) name.
    get_num_unfinished_requests = num_unfinished_requests

    # -- requests in and out --------------------------------------------------

    def add_request(self, new: NewRequest) -> int:
        """Queue a request; returns its slot. A request whose id is a live
        streaming session is that session's next chunk (docs/scheduling.md
        §4.12). Refused (``ValueError``, nothing changed): a live duplicate
        id, an empty prompt, a prompt of ``max_model_len`` or more tokens,
        ``max_tokens`` outside ``[1, MAX_TOKENS]``, ``min_tokens >
        max_tokens``, a NaN arrival time, multimodal inputs without an encoder
        (or in a session, or breaking ``check_inputs``)."""
        slot = self.ids.get(new.request_id)
        if slot is not None:
            if self.requests[slot].status.is_finished:
                # Finished, its blocks held for a KV connector's send.
                raise duplicate_request(new.request_id)
            session.add_session_chunk(self, slot, new)
            return slot
        self.check_new_request(new)
        seq = Sequence(
            new.prompt_token_ids, hash_keys(new), self.kv.hasher, self.kv.hash_block_size
        )
        if new.mm_inputs:
            seq.key_by_mm(new.mm_inputs, self.kv.hasher, self.kv.hash_block_size)
        if new.prompt_embeds_digests is not None:
            seq.key_by_embeds(new.prompt_embeds_digests, self.kv.hasher, self.kv.hash_block_size)
        r = Request.waiting(new, seq, len(self.kv.groups))
        slot = self.requests.insert(r)
        self.ids[r.request_id] = slot
        self.enqueue_waiting(slot)
        return slot

    def enqueue_waiting(self, slot: int) -> None:
        """Queue a request that waits (vLLM's ``_enqueue_waiting_request``):
        one that holds KV blocks apart, one that is blocked (a grammar, a
        session waiting for input) counted as skipped from the start."""
        r = self.requests[slot]
        if r.is_blocked:
            waiting_pass.defer(self, slot)
        queue = self.kv_holding_queue if r.holds_kv else self.waiting_queue
        queue.add(slot, self.requests)

    def enable_kv_events(self) -> None:
        """Log KV-cache events from now on (docs/scheduling.md §7.12)."""
        self.kv.enable_events()

    def enable_block_lifecycle_events(self) -> None:
        """Log blocks' lives (handed out, hit) from now on, for residency
        metrics (docs/scheduling.md §7.12)."""
        self.kv.enable_lifecycle_events()

    def enable_request_events(self) -> None:
        """Log each request's prefix lookups and block releases from now on,
        among the KV-cache events: what vLLM's auxiliary-output connector
        hears of (docs/scheduling.md §7.12)."""
        self.kv.enable_request_events()

    def enable_aux_outputs(self) -> None:
        """Follow auxiliary outputs (vLLM's ``--enable-return-routed-experts``)
        from now on: prefix hits reach only over blocks whose routing the
        workers hold (§7.12)."""
        aux_outputs.enable_aux_outputs(self)

    def take_boundary_states(self) -> list[BoundaryState]:
        """The cached states offered to the KV connector since last taken,
        oldest first (§4.19.2): what vLLM drains at the end of each step."""
        return self.kv.take_boundary_states()

    def take_kv_events(self) -> list[KvEvent]:
        """The KV-cache events since last taken, oldest first."""
        return self.kv.take_events()

    def update_draft_token_ids(
        self, request_ids: list[str], tokens: list[int], offsets: list[int]
    ) -> None:
        """Draft tokens for the requests' next steps (docs/scheduling.md
        §4.13): ``request_ids[i]`` gets ``tokens[offsets[i]:offsets[i + 1]]``."""
        drafts.update_draft_token_ids(self, request_ids, tokens, offsets)

    def report_grammar(self, request_id: str, compiled: bool) -> None:
        """The caller's news of a structured-output request's grammar:
        compiled (True) or failed (False). It counts when a waiting pass next
        reaches the request (docs/scheduling.md §4.10). Refused
        (``ValueError``) for an id without a live request, for a request
        without a grammar, and once it is released."""
        slot = self.ids.get(request_id)
        if slot is None:
            raise ValueError(f"request_id {debug_str(request_id)} is not a live request")
        r = self.requests[slot]
        rid = debug_str(r.request_id)
        if r.grammar is None:
            raise ValueError(f"request {rid} has no grammar (structured_output=False)")
        try:
            r.grammar = r.grammar.report(compiled)
        except ValueError as why:
            raise ValueError(f"request {rid}: {why}") from None

    def check_new_request(self, new: NewRequest) -> None:
        rid = new.request_id
        if rid in self.ids:
            raise duplicate_request(rid)
        n, max_len = len(new.prompt_token_ids), self.config.max_model_len
        if n == 0:
            raise ValueError(f"prompt_token_ids of request {debug_str(rid)} must not be empty")
        # A sampled token needs a position after the prompt; a pooled
        # prompt may fill max_model_len (vLLM's input check, §4.16).
        room = self.config.runner.sampled_tokens_per_step()
        if n + room > max_len:
            bound = "at most" if room == 0 else "shorter than"
            raise ValueError(
                f"prompt_token_ids of request {debug_str(rid)} has {n} tokens; it must be "
                f"{bound} max_model_len ({max_len})"
            )
        if new.resumable and self.config.runner is not Runner.GENERATE:
            raise ValueError(
                f"resumable of request {debug_str(rid)}: runner '{self.config.runner.value}' "
                "takes no streaming sessions (it finishes each request after its prompt)"
            )
        if new.mm_inputs:
            if self.config.encoder is None:
                raise ValueError(
                    f"mm_features of request {debug_str(rid)}: this scheduler has no encoder "
                    "(a text model); configure its encoder budget and cache size"
                )
            check_inputs(rid, new.mm_inputs, self.input_placement(n))
        if new.prompt_embeds_digests is not None:
            blocks = -(-n // self.kv.hash_block_size)
            if len(new.prompt_embeds_digests) != blocks:
                raise ValueError(
                    f"prompt_embeds_digests of request {debug_str(rid)} has "
                    f"{len(new.prompt_embeds_digests)} digests; its {n}-token prompt spans "
                    f"{blocks} blocks"
                )
            if new.resumable:
                raise ValueError(
                    f"prompt_embeds_digests of request {debug_str(rid)}: a streaming session "
                    "with prompt embeddings is not supported"
                )
        if new.lora is not None and new.lora.id == 0:
            raise ValueError(
                f"lora_request.lora_int_id of request {debug_str(rid)} must be >= 1, got 0"
            )
        check_turn(new)

    def finish_requests(self, request_ids: list[str], status: RequestStatus) -> list[int]:
        """End requests from outside (docs/scheduling.md §6): unknown and
        repeated ids are ignored; the rest are freed in the order given
        (vLLM frees in hash-set order; the drop-in passes that order).
        Returns their slots."""
        block_pins.apply_pin_requests(self)
        found: list[int] = []
        for rid in request_ids:
            slot = self.ids.get(rid)
            if slot is None or slot in found:
                continue
            # A finished request held for a send is finished already.
            if not self.requests[slot].status.is_finished:
                found.append(slot)
        # Out of their queues at once, as vLLM removes them (one heapify).
        running = [s for s in found if self.requests[s].status == RequestStatus.RUNNING]
        waiting = [s for s in found if self.requests[s].status != RequestStatus.RUNNING]
        for slot in waiting:
            if self.requests[slot].status == RequestStatus.WAITING_FOR_STREAMING_REQ:
                self.num_waiting_for_input -= 1
        if running:
            self.running[:] = [s for s in self.running if s not in running]
        self.unqueue_waiting(waiting)
        for slot in found:
            r = self.requests[slot]
            # A load still on its way may write the blocks: they stay until
            # the worker reports it (§4.19).
            loading = r.status == RequestStatus.WAITING_FOR_REMOTE_KVS and not r.kv_loaded
            r.status = status
            self.free_request(slot, loading)
        return found

    def unqueue_waiting(self, slots: list[int]) -> None:
        """Take waiting requests out of both waiting queues (vLLM's
        ``remove_requests`` on each, which also heapifies them)."""
        if slots:
            gone = set(slots).__contains__
            self.waiting_queue.remove_all(gone, self.requests)
            self.kv_holding_queue.remove_all(gone, self.requests)

    def free_request(self, slot: int, loading: bool) -> None:
        """Free a finished request's blocks and slot; the next step reports
        it. Its blocks stay (and so does its slot, finished) while
        ``loading``, or when the KV connector holds them for a send
        (§4.19)."""
        self.log_released(slot)
        # vLLM asks the KV connector, then the encoder-cache connector
        # (before the request's encoder inputs go), and ORs their holds.
        kv_held = kv_transfer.connector_finished(self, slot)
        held = ec_transfer.ec_finished(self, slot) or kv_held or loading
        encoder_inputs.release_all_encoded(self, slot)
        r = self.requests[slot]
        self.num_deferred -= r.deferred
        r.deferred = False
        r.inflight_prefill = False
        r.kv_loaded = False
        r.kv_load_failed = False
        self.finished_ids.append(r.request_id)
        if not held:
            self.release_request(slot)

    def log_released(self, slot: int) -> None:
        """Log that the request in ``slot`` gives its blocks back (finished
        or preempted), before they go (§7.12)."""
        aux_outputs.aux_request_finished(self, slot)
        computed = self.requests[slot].seq.num_computed_tokens
        self.kv.log_event(Released(owner=slot, num_computed_tokens=computed))

    def release_request(self, slot: int) -> None:
        """Return a finished request's blocks (fenced, §4.19) and slot."""
        self.free_blocks_of(slot)
        r = self.requests.remove(slot)
        del self.ids[r.request_id]

    def free_blocks_of(self, slot: int) -> None:
        """Return the blocks of the request in ``slot`` to the pool, or,
        while a step in flight may still write them (fenced frees, §4.19),
        set them aside until that step comes back."""
        # (Its states not yet offered would name blocks another may get.)
        self.kv.withdraw_boundary_states(slot)
        r = self.requests[slot]
        if not self.kv_setup.defer_block_free or r.last_sched_seq <= self.processed_step_seq:
            self.kv.free(r.tables)
            return
        blocks = self.kv.take_blocks(r.tables)
        if blocks:
            self.deferred_frees.append(DeferredFree(self.sched_step_seq, blocks))

    def blocks_can_be_freed(self, slot: int) -> bool:
        """Whether the request in ``slot`` may be preempted now: its blocks
        are not fenced by a step in flight (vLLM's
        ``_request_blocks_can_be_freed``)."""
        return (
            not self.kv_setup.defer_block_free
            or self.requests[slot].last_sched_seq <= self.processed_step_seq
        )

    def drain_deferred_frees(self) -> None:
        """A step with tokens came back: fenced blocks whose step is done go
        back to the pool, each set last block first (stopping at the first
        still fenced, as vLLM does)."""
        while self.deferred_frees and self.deferred_frees[0].fence <= self.processed_step_seq:
            self.kv.release_blocks_last_first(self.deferred_frees.popleft().blocks)

    def set_ec_connector(self, connector: Any) -> None:
        """Attach an encoder-cache connector's scheduler side
        (docs/scheduling.md §4.20), before any request."""
        ec_transfer.set_ec_connector(self, connector)

    def set_kv_connector(self, connector: Any, setup: KvConnectorSetup) -> None:
        """Attach a KV connector's scheduler side (docs/scheduling.md §4.19),
        before any request."""
        kv_transfer.set_kv_connector(self, connector, setup)

    # -- the step -------------------------------------------------------------

    def schedule(self) -> StepOutput:
        """One scheduling decision (docs/scheduling.md §4)."""
        return self.schedule_throttled(False)

    def schedule_throttled(self, throttle_prefills: bool) -> StepOutput:
        """``schedule``, holding prefill work back when a data-parallel engine
        asks (``throttle_prefills``, vLLM's DP prefill balancing) or the local
        cadence says so (docs/scheduling.md §4.11)."""
        block_pins.apply_pin_requests(self)
        self.current_step += 1
        self.kv.new_step_starts()
        hold_prefills = self.cadence.holds(
            throttle_prefills,
            lambda: any(not self.requests[s].prefill_chunk for s in self.running),
        )
        c = self.config
        draft = StepDraft(
            token_budget=0 if self._pause == Pause.ALL else c.max_num_scheduled_tokens,
            input_budget=c.max_num_batched_tokens,
            threshold=self.long_prefill_threshold(),
            hold_prefills=hold_prefills,
            encoder_budget=0 if c.encoder is None else c.encoder.compute_budget,
        )
        running_pass.schedule_running(self, draft)
        draft.running_scheduled = bool(draft.entries)
        # Any preemption cancels this step's admissions (Q5). Paused for new
        # requests, only those holding KV blocks are admitted.
        if not draft.preempted_any and self._pause != Pause.ALL:
            waiting_pass.schedule_waiting(self, draft, self._pause == Pause.UNPAUSED)
            if not hold_prefills:
                # vLLM notes this after every waiting pass that did not hold.
                _, num_waiting = self.request_counts()
                self.cadence.note_release(num_waiting, self.num_deferred)
        aux_outputs.aux_scheduled(self, (e.slot for e in draft.entries))
        self.cadence.note_step(bool(draft.entries), draft.carried_prefill)
        out = finish_step(self, draft.entries)
        out.scheduled_encoder_inputs = draft.encoder_inputs
        out.encoder_mismatch = draft.encoder_mismatch
        out.free_encoder_mm_hashes = self.encoder.take_freed()
        out.drafts_needed = draft.drafts_needed
        out.grammar_released = draft.grammar_released
        out.grammar_failed = draft.grammar_failed
        out.has_sync_kv_loads = draft.sync_kv_loads
        return out

    def long_prefill_threshold(self) -> int:
        """This step's ``long_prefill_token_threshold``: off (0) with a single
        request, which has nobody to starve (Q1); with the adaptive option,
        never below a fair share of the input budget."""
        c = self.config
        eligible = self.num_unfinished_requests()
        if eligible <= 1 or c.long_prefill_token_threshold == 0:
            return 0
        if c.long_prefill_token_threshold_adaptive:
            return max(c.long_prefill_token_threshold, c.max_num_batched_tokens // eligible)
        return c.long_prefill_token_threshold

    def update_from_output(
        self, step: StepOutput, tokens: list[int], offsets: list[int]
    ) -> UpdateOutput:
        """Apply a step's sampled tokens: entry ``i`` of ``step`` gets
        ``tokens[offsets[i]:offsets[i + 1]]`` (docs/scheduling.md §5).
        Checked first, so a ``ValueError`` changes nothing."""
        return update.update_from_output(self, step, tokens, offsets)

    def update_from_pooler_output(self, step: StepOutput, pooled: list[bool]) -> UpdateOutput:
        """Apply a pooling runner's output: ``pooled[i]`` says whether entry
        ``i`` of ``step`` got a pooled result, which finishes its request.
        Checked first, so a ``ValueError`` changes nothing."""
        return pooler_output.update_from_pooler_output(self, step, pooled)

    def update_pooled_with_kv_report(
        self,
        step: StepOutput,
        pooled: list[bool],
        report: KvTransferReport,
        errors: request_errors.RequestErrors = request_errors.NO_ERRORS,
    ) -> UpdateOutput:
        """``update_from_pooler_output`` with the worker's report of the
        step's KV transfers and the caller's errors, taken as
        ``update_with_kv_report`` takes them."""
        return pooler_output.update_pooled_with_kv_report(self, step, pooled, report, errors)

    def update_from_output_checked(
        self, step: StepOutput, tokens: list[int], offsets: list[int], accept: update.AcceptKept
    ) -> UpdateOutput:
        """``update_from_output``, asking ``accept(slot, request, kept)``
        about each structured-output request's kept tokens; False ends the
        request with an error (docs/scheduling.md §5.2)."""
        return update.update_from_output_checked(self, step, tokens, offsets, accept)

    def update_with_kv_report(
        self,
        step: StepOutput,
        tokens: list[int],
        offsets: list[int],
        accept: update.AcceptKept,
        report: KvTransferReport,
        errors: request_errors.RequestErrors = request_errors.NO_ERRORS,
    ) -> UpdateOutput:
        """``update_from_output_checked`` with the worker's report of the
        step's KV transfers (§4.19); ``errors`` names requests to end with
        an error with those the "fail" policy ends, and orders them all."""
        return update.update_with_kv_report(self, step, tokens, offsets, accept, report, errors)

    def pin_blocks(self, block_ids: list[int]) -> None:
        """Pin each listed block once, from outside any request (see
        ``block_pins``); checked first."""
        block_pins.pin_blocks(self, block_ids)

    def take_pin_errors(self) -> list[str]:
        """The asks on ``pin_requests`` refused since the last call, as
        messages, oldest first."""
        errors, self.pin_errors = self.pin_errors, []
        return errors

    def unpin_blocks(self, block_ids: list[int]) -> None:
        """Drop one pin per listed block, in the order given; refused
        (``ValueError``, nothing changed) past a block's pins."""
        block_pins.unpin_blocks(self, block_ids)

    def reset_prefix_cache(self, reset_running_requests: bool) -> bool:
        """Forget every cached block hash (docs/scheduling.md §7.10); refused
        (False) while a block is held. With ``reset_running_requests``, every
        running request is preempted first (from the back) and its output in
        flight dropped, so the reset succeeds unless streaming sessions between
        turns hold blocks (vLLM then raises, its running requests preempted all
        the same)."""
        block_pins.apply_pin_requests(self)
        if reset_running_requests:
            while self.running:
                preemption.preempt(self, self.running.pop(), True)
        reset = self.kv.reset_prefix_cache()
        if reset:
            aux_outputs.aux_reset(self)
        return reset

    def make_stats(self) -> SchedulerStats:
        """Counts and usage; takes (and zeroes) the prefix-cache and
        preemption counters."""
        stats = SchedulerStats(
            num_running_reqs=len(self.running),
            num_waiting_reqs=len(self.waiting_queue)
            + len(self.kv_holding_queue)
            - self.num_deferred,
            num_skipped_waiting_reqs=self.num_deferred,
            kv_cache_usage=self.kv.usage,
            prefix_cache_stats=self.kv.make_prefix_cache_stats(),
            num_preempted_reqs=self.num_preempted,
        )
        self.num_preempted = 0
        return stats

    def debug_state(self) -> dict[str, Any]:
        """Everything the two backends must agree on, for differential tests:
        the queues, each live request's state by name, and the pool (the
        Rust binding's ``debug_state`` format)."""
        name = {slot: self.requests[slot].request_id for slot in self.ids.values()}
        requests: dict[str, dict[str, Any]] = {}
        for slot in [*self.running, *self.kv_holding(), *self.waiting()]:
            r = self.requests[slot]
            requests[r.request_id] = {
                "status": r.status.name,
                "slot": slot,
                "num_tokens": r.num_tokens,
                "num_computed_tokens": r.seq.num_computed_tokens,
                # Group 0's table (none without a KV cache).
                "block_ids": r.tables[0].block_ids() if r.tables else [],
                "num_cached_blocks": r.num_cached_blocks(),
                "tables": [t.block_ids() for t in r.tables],
                "num_cached_per_group": [t.num_cached_blocks() for t in r.tables],
                "shared_prefix_boundary": r.seq.shared_prefix_boundary,
                "num_preemptions": r.num_preemptions,
                "num_output_placeholders": r.num_output_placeholders,
                "in_flight_tokens": r.in_flight_tokens,
                "stale_tokens": r.stale_tokens,
                "drop_stale": r.drop_stale,
                "deferred": r.deferred,
                "grammar": None if r.grammar is None else r.grammar.name,
                "prefill_chunk": r.prefill_chunk,
                "next_decode_step": r.next_decode_step,
                "kv_loaded": r.kv_loaded,
                "inflight_prefill": r.inflight_prefill,
                "drafts": drafts_column(r.drafts),
            }
        pool = self.kv.pool
        return {
            "running": [name[s] for s in self.running],
            "waiting": [name[s] for s in self.waiting()],
            "kv_holding": [name[s] for s in self.kv_holding()],
            "num_waiting_for_input": self.num_waiting_for_input,
            "requests": requests,
            # Finished requests holding blocks for a KV connector: their tables.
            "kv_held": {
                self.requests[slot].request_id: [t.block_ids() for t in self.requests[slot].tables]
                for slot in self.ids.values()
                if self.requests[slot].status.is_finished
            },
            # Blocks of freed requests fenced by a step in flight.
            "deferred_frees": [(d.fence, list(d.blocks)) for d in self.deferred_frees],
            # Blocks pinned from outside any request: (block, pins).
            "pinned_blocks": block_pins.pinned_blocks(self),
            "free_block_ids": pool.free_block_ids(),
            "block_ref_cnts": pool.block_ref_cnts(),
            "cached_blocks": sorted(ids for _, ids in pool.cached_blocks()),
            # Routed experts followed: the retained blocks' hashes, least
            # recently used first, and per loading request's slot the blocks
            # its load reads.
            **(
                {}
                if self.aux_retention is None
                else {
                    "aux_retained": list(self.aux_retention.retained),
                    "aux_loading": {
                        slot: list(keys) for slot, keys in self.aux_retention.loading.items()
                    },
                }
            ),
        }

    def __repr__(self) -> str:
        running, waiting = self.request_counts()
        return f"Scheduler(running={running}, waiting={waiting}, pause={self._pause.name})"


def drafts_column(drafts: Drafts) -> list[int]:
    """A request's drafts as the step's column holds them (-1: a placeholder)."""
    column: list[int] = []
    drafts.write_to(column)
    return column
