"""The scheduler's side of a KV connector (docs/scheduling.md §4.19): the
question at admission, loads that arrive over later steps
(WAITING_FOR_REMOTE_KVS), blocks a finished request keeps while the
connector sends them, and the transfers the worker reports back."""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Any

from ironbatch.reference.block import cdiv
from ironbatch.reference.error import debug_str
from ironbatch.reference.kv_connector import (
    NO_HIT,
    ExternalHit,
    KvConnectorSetup,
    RequestState,
    SafeConnector,
)
from ironbatch.reference.request import Request, RequestStatus
from ironbatch.reference.scheduler import block_pins
from ironbatch.reference.scheduler_config import Runner

if TYPE_CHECKING:
    from ironbatch.reference.scheduler import Scheduler


class Ask(enum.Enum):
    """The connector's answer for an admission, where it is no hit."""

    #: There is no connector to ask.
    NO_CONNECTOR = enum.auto()
    #: "Ask again later" (or an answer that breaks the contract): the
    #: request is skipped this step.
    LATER = enum.auto()


def set_kv_connector(s: Scheduler, connector: Any, setup: KvConnectorSetup) -> None:
    """Attach a KV connector; before any request, and only where the core
    follows vLLM with one: KV-cache groups of attention with per-token
    blocks (no cross-attention) and recurrent states, a generating or
    pooling runner."""
    c = s.config
    groups = c.kv_cache_groups
    why = None
    if s.ids:
        why = "it must be set before the first request"
    elif not groups or any(g.kind.is_cross() for g in groups):
        # Full attention, windows and chunked local attention (vLLM gives a
        # connector without hybrid support one group of them).
        why = "kv_cache_groups must be attention or recurrent-state groups"
    elif c.runner not in (Runner.GENERATE, Runner.POOLING):
        why = "runner must be 'generate' or 'pooling'"
    if why is not None:
        raise ValueError(f"kv_connector: {why}")
    s.connector = SafeConnector(connector)
    s.kv_setup = setup
    # Cached states (cache mode "align") are offered to it (§4.19.2).
    s.kv.enable_boundary_states()


def ask_connector(s: Scheduler, slot: int, num_local: int) -> ExternalHit | Ask:
    """Ask the connector about the request in ``slot``, ``num_local`` of
    whose tokens were hit locally (whole blocks)."""
    if s.connector is None:
        return Ask.NO_CONNECTOR
    r = s.requests[slot]
    s.connector.observe_request(state_of(s, r, r.seq.num_computed_tokens, r.status))
    answer = s.connector.get_num_new_matched_tokens(r.request_id, r.num_tokens, num_local)
    # A request that reads no cache takes no external hit either (the
    # connector was still asked, as vLLM asks it).
    if r.skip_reading_prefix_cache:
        return NO_HIT
    if answer is not None and answer.fits(r.num_tokens, num_local):
        return answer
    return Ask.LATER


def connector_loaded_groups(s: Scheduler, slot: int) -> int:
    """The groups an asynchronous load of the request in ``slot`` writes,
    as the connector names them, as a bit set (bit ``g``: group ``g``)."""
    if s.connector is None:
        return 0
    num_groups = len(s.config.kv_cache_groups)
    groups = s.connector.loaded_groups(s.requests[slot].request_id, num_groups)
    bits = 0
    for g in groups:
        if g < num_groups:
            bits |= 1 << g
    return bits


def notify_after_alloc(
    s: Scheduler, slot: int, num_external_tokens: int, before: tuple[int, RequestStatus]
) -> None:
    """Tell the connector the request's blocks after an admission; vLLM
    calls before it sets the request's computed count and status, so the
    connector sees ``before`` (computed tokens, status)."""
    if s.connector is not None:
        r = s.requests[slot]
        s.connector.observe_request(state_of(s, r, *before))
        block_ids = [t.block_ids() for t in r.tables]
        s.connector.update_state_after_alloc(r.request_id, block_ids, num_external_tokens)
        block_pins.apply_pin_requests(s)  # the connector's pins, at once, as vLLM's


def reserved_for_inflight_prefills(s: Scheduler) -> int:
    """Blocks an async load must leave free: what every in-flight prefill
    still needs for its whole sequence (and a draft step), plus one draft
    step's blocks of its own (vLLM's reservation)."""
    c = s.config
    k = c.num_speculative_tokens
    spec = 1 + k + c.num_lookahead_tokens if k > 0 else 0
    reserved = 0
    for slot in s.ids.values():
        r = s.requests[slot]
        if r.inflight_prefill:
            tokens = min(r.num_tokens, c.max_model_len) + spec
            reserved += s.kv.blocks_to_hold(r.tables, tokens, r.seq)
    return reserved + s.kv.draft_step_blocks(spec)


def settle_load(s: Scheduler, slot: int) -> None:
    """A loading request the waiting pass reached after its load was
    reported: its loaded blocks are cached (after a failure, those before
    the cut; with nothing left, its blocks go and it asks again), a load of
    every token gives the last back (to compute and sample from), and it
    waits as before."""
    r = s.requests[slot]
    computed = r.seq.num_computed_tokens
    if r.kv_load_failed and computed == 0:
        # There may be a local hit when it asks again.
        s.kv.free(r.tables)
    else:
        s.kv.cache_full_blocks(r.tables, r.seq, computed, slot)
        if r.kv_load_failed:
            # What the load left unwritten is computed here: zeroed first,
            # where zeroing applies.
            s.kv.record_blocks_for_zeroing(r.tables, computed)
    r.kv_load_failed = False
    if computed == r.num_tokens:
        r.seq.num_computed_tokens -= 1
    r.kv_loaded = False
    r.status = RequestStatus.PREEMPTED if r.num_preemptions > 0 else RequestStatus.WAITING


def connector_finished(s: Scheduler, slot: int) -> bool:
    """Tell the connector a request finished (its status set); True holds
    its blocks until the connector reports its send done."""
    if s.connector is None:
        return False
    r = s.requests[slot]
    # A window's blocks out of reach go first (as far as the steps that
    # came back computed), then each attention group's blocks up to the
    # computed tokens are named, and a recurrent group's all (its state
    # blocks are no token range: vLLM clips attention only).
    s.kv.remove_blocks_out_of_window(
        r.tables, max(r.seq.num_computed_tokens - r.in_flight_tokens, 0)
    )
    computed = r.seq.num_computed_tokens
    block_ids = [
        t.block_ids()
        if s.kv.groups[g].kind.is_recurrent()
        else t.block_ids()[: cdiv(computed, s.kv.group_block_size(g))]
        for g, t in enumerate(r.tables)
    ]
    s.connector.observe_request(state_of(s, r, r.seq.num_computed_tokens, r.status))
    held = s.connector.request_finished(r.request_id, block_ids, r.status.name)
    block_pins.apply_pin_requests(s)  # before the request's own blocks go, as vLLM's
    return held


def connector_frees_pending(s: Scheduler) -> bool:
    """Whether the connector says blocks are about to come back."""
    return s.connector is not None and s.connector.has_pending_block_frees()


def check_kv_transfers(
    s: Scheduler, finished_recving: tuple[str, ...], finished_sending: tuple[str, ...]
) -> None:
    """The transfers a report names, checked: a load done must be of a
    request loading (or finished meanwhile), a send done of a finished one.
    Unknown ids, and ids in no such state, are refused (``ValueError``)
    with nothing changed."""

    def slot_of(rid: str, what: str) -> int:
        slot = s.ids.get(rid)
        if slot is None:
            raise ValueError(f"{what}: request {debug_str(rid)} is not a live request")
        return slot

    for rid in finished_recving:
        r = s.requests[slot_of(rid, "finished_recving")]
        if not (r.status == RequestStatus.WAITING_FOR_REMOTE_KVS or r.status.is_finished):
            raise ValueError(
                f"finished_recving: request {debug_str(rid)} is not loading "
                f"(status {r.status.name})"
            )
    for rid in finished_sending:
        if not s.requests[slot_of(rid, "finished_sending")].status.is_finished:
            raise ValueError(f"finished_sending: request {debug_str(rid)} has not finished")


def settle_kv_transfers(
    s: Scheduler, finished_recving: tuple[str, ...], finished_sending: tuple[str, ...]
) -> None:
    """The worker's report of finished transfers (vLLM's
    ``finished_recving``, then ``finished_sending``), checked by
    ``check_kv_transfers`` before the update began: a loading request is
    ready for the next waiting pass, one that finished while loading lets
    its blocks go; a sent request lets its blocks go. (An id the update
    itself let go meanwhile is passed over.)"""
    for rid in finished_recving:
        slot = s.ids.get(rid)
        if slot is None:
            continue
        r = s.requests[slot]
        if r.status.is_finished:
            s.release_request(slot)
        elif r.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
            r.kv_loaded = True
    for rid in finished_sending:
        slot = s.ids.get(rid)
        if slot is not None and s.requests[slot].status.is_finished:
            s.release_request(slot)


def state_of(
    s: Scheduler, r: Request, num_computed_tokens: int, status: RequestStatus
) -> RequestState:
    """``r`` as a connector call shows it, with ``num_computed_tokens`` and
    ``status`` as vLLM's scheduler has them at that call."""
    return RequestState(
        request_id=r.request_id,
        token_ids=r.seq.tokens,
        num_computed_tokens=num_computed_tokens,
        status=status.name,
        cached_blocks=s.kv.cached_positions(r.tables),
    )
