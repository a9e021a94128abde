"""The WAITING pass (docs/scheduling.md §4.5): admit waiting requests from
the head of the queue while the budgets, ``max_num_active_seqs`` and the KV cache
allow, each with its longest cached prefix. Requests that hold KV blocks
(streaming sessions between turns, §4.12) are admitted first."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ironbatch.reference.encoder_decoder_cache import EncoderDecoderCache
from ironbatch.reference.kv_cache_manager import Admission
from ironbatch.reference.kv_connector import NO_HIT
from ironbatch.reference.kv_events import Hit, Loading, Lookup
from ironbatch.reference.lora import LoraBatch
from ironbatch.reference.prefix_hit import GroupHits, PrefixHit
from ironbatch.reference.request import RequestStatus
from ironbatch.reference.scheduler.aux_outputs import (
    aux_cap_external_hit,
    aux_max_cache_hit,
    aux_request_loading,
)
from ironbatch.reference.scheduler.drafts import drafts_unused
from ironbatch.reference.scheduler.ec_transfer import ec_transfer_pending
from ironbatch.reference.scheduler.encoder_inputs import (
    commit_encoder_plan,
    plan_encoder_inputs,
    release_all_encoded,
)
from ironbatch.reference.scheduler.kv_transfer import (
    Ask,
    ask_connector,
    connector_loaded_groups,
    notify_after_alloc,
    reserved_for_inflight_prefills,
    settle_load,
)
from ironbatch.reference.scheduler.prefill_lookahead import reserve_prefill_lookahead
from ironbatch.reference.scheduler.running_pass import entry
from ironbatch.reference.scheduler.state_aligned_split import state_aligned_split
from ironbatch.reference.scheduler_config import Runner
from ironbatch.reference.spec_decode import Drafts
from ironbatch.reference.step import Kind

if TYPE_CHECKING:
    from ironbatch.reference.block import Block
    from ironbatch.reference.scheduler import Scheduler, StepDraft


class Admit(enum.Enum):
    """What became of the request at the head of its queue."""

    ADMITTED = enum.auto()
    #: It cannot be admitted now; the pass ends with it at the head.
    BLOCKED = enum.auto()
    #: Nothing of it fits this step, or it waits for its KV cache to be
    #: loaded (§4.19); the pass goes on without it.
    SKIPPED = enum.auto()


@dataclass
class Skipped:
    """The requests a pass skipped, by the queue they go back to."""

    kv_holding: list[int] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)


def schedule_waiting(s: Scheduler, draft: StepDraft, admit_new: bool) -> None:
    """Admit waiting requests into ``draft`` (only when nobody was preempted
    this step and not everything is paused). ``admit_new`` is False when
    admissions are paused: then only requests holding KV blocks are."""
    skipped = Skipped()
    # The adapters of every running request, scheduled this step or not (they
    # can join a later batch), before any admission (§4.14).
    loras = None
    if s.config.max_loras is not None:
        running = (s.requests[r].lora_id for r in s.running)
        loras = LoraBatch(s.config.max_loras, (i for i in running if i is not None))
    while draft.token_budget > 0:
        from_kv = not s.kv_holding_queue.is_empty()
        if from_kv:
            queue = s.kv_holding_queue
        elif admit_new:
            queue = s.waiting_queue
        else:
            break
        slot = queue.peek()
        if slot is None:
            break
        # Sessions waiting for input keep a runner slot (§4.12).
        active = len(s.running) + s.num_waiting_for_input
        no_input_room = draft.input_budget <= s.config.num_draft_slots
        if no_input_room or active >= s.config.max_num_active_seqs:
            break
        r = s.requests[slot]
        if r.status == RequestStatus.WAITING_FOR_STREAMING_REQ:
            skip(s, slot, from_kv, skipped)
            continue
        # Its KV cache is being loaded: skipped until the load is reported,
        # then settled and admitted like any holder (§4.19).
        if r.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
            if not r.kv_loaded:
                skip(s, slot, from_kv, skipped)
                continue
            settle_load(s, slot)
        # Held for its grammar (§4.10); the compile result counts now.
        if r.grammar is not None:
            r.grammar, reached = r.grammar.reach()
            if reached.failed:
                draft.grammar_failed.append(slot)
            if not reached.go:
                skip(s, slot, from_kv, skipped)
                continue
            if reached.released:
                draft.grammar_released.append(slot)
        if output_in_flight(s, slot):
            skip(s, slot, from_kv, skipped)
            continue
        # A new adapter past max_loras waits for a step with room for it.
        lora = r.lora_id
        if loras is not None and lora is not None and not loras.admits(lora):
            skip(s, slot, from_kv, skipped)
            continue
        admitted = admit(s, slot, from_kv, draft)
        if admitted is Admit.BLOCKED:
            break  # it stays at the head
        if admitted is Admit.SKIPPED:
            # Its encoder input does not fit this step (§4.15), or its KV
            # cache is to be loaded first (§4.19).
            skip(s, slot, from_kv, skipped)
            continue
        if loras is not None and lora is not None:
            loras.add(lora)
    # Skipped requests go back to the head of their queue, in their order (Q11).
    for slot in reversed(skipped.kv_holding):
        s.kv_holding_queue.prepend(slot, s.requests)
    for slot in reversed(skipped.waiting):
        s.waiting_queue.prepend(slot, s.requests)


def output_in_flight(s: Scheduler, slot: int) -> bool:
    """Whether a preempted request's earlier output is still on its way
    (docs/scheduling.md §5.4): it waits until that drains, unless a reset
    dropped it."""
    r = s.requests[slot]
    return r.stale_tokens > 0 and not r.drop_stale


def skip(s: Scheduler, slot: int, from_kv: bool, skipped: Skipped) -> None:
    """Take the head of its queue out of this pass; it goes back at the end
    (to the queue that fits it then)."""
    defer(s, slot)
    pop_waiting(s, from_kv)
    if s.requests[slot].holds_kv:
        skipped.kv_holding.append(slot)
    else:
        skipped.waiting.append(slot)


def pop_waiting(s: Scheduler, from_kv: bool) -> None:
    """Take the head of one of the waiting queues."""
    (s.kv_holding_queue if from_kv else s.waiting_queue).pop(s.requests)


def undefer(s: Scheduler, slot: int) -> None:
    """No longer count a request as skipped."""
    r = s.requests[slot]
    if r.deferred:
        r.deferred = False
        s.num_deferred -= 1


def defer(s: Scheduler, slot: int) -> None:
    """Count a request as skipped by the waiting pass (vLLM's
    ``deferred_waiting``, reported in the stats) until it is admitted."""
    r = s.requests[slot]
    if not r.deferred:
        r.deferred = True
        s.num_deferred += 1


def admit(s: Scheduler, slot: int, from_kv: bool, draft: StepDraft) -> Admit:
    """Admit the request at the head of its queue (``from_kv``: the KV
    holders'), after its prefix hits; BLOCKED when it cannot be admitted now
    (the pass ends there), SKIPPED when its encoder inputs leave it nothing
    this step (the pass goes on). A session between turns holds its KV cache: it
    continues from there, without a lookup."""
    c = s.config
    # Headroom kept free for those already running (none when alone).
    watermark = c.watermark_blocks if s.running else 0
    draft_slots = c.num_draft_slots
    budget = min(draft.token_budget, draft.input_budget - draft_slots)
    r = s.requests[slot]
    lookup = r.seq.num_computed_tokens == 0
    if lookup and r.resumable and s.kv.hasher.lookahead > 0:
        # A session's kept hashes may cover the token its turn dropped;
        # computing its KV afresh, it hashes its tokens as they are now.
        r.seq.rehash(s.kv.hasher, s.kv.hash_block_size)
    # Before the hit is found, how far the workers' routing reaches caps it
    # (auxiliary outputs, §7.12).
    max_hit = None
    if lookup:
        s.kv.log_event(Lookup(owner=slot))
        max_hit = aux_max_cache_hit(s, slot)
    # A request that must compute every prompt token (vLLM: it wants prompt
    # logprobs) reads no hits; its blocks are still cached.
    reads = lookup and not r.skip_reading_prefix_cache
    # A connector that completes divergent hybrid hits is told full
    # attention's own hit (§4.19.2).
    per_group = None
    if reads and s.kv_setup.divergent_hybrid_hits and s.connector is not None:
        per_group = s.kv.find_hit_per_group(r.seq, max_hit)
    hit: PrefixHit | GroupHits = PrefixHit()
    if per_group is not None:
        hit = per_group
        r.seq.shared_prefix_boundary = 0  # (vLLM's per-group lookup finds none)
    elif reads:
        hit = find_local_hit(s, slot, max_hit)
    elif lookup:
        r.seq.shared_prefix_boundary = 0
    hit_tokens = hit.tokens if lookup else r.seq.num_computed_tokens
    # A KV connector's tokens past the local hit (§4.19).
    external = NO_HIT
    if lookup:
        answer = ask_connector(s, slot, hit_tokens)
        if answer is Ask.LATER:
            return Admit.SKIPPED
        if not isinstance(answer, Ask):
            external = aux_cap_external_hit(s, slot, hit_tokens, answer)
    if per_group is not None and per_group.diverged and external.num_tokens == 0:
        # No external tokens carry a lagging state to the deeper hit: the
        # hit every group agrees on is found instead.
        hit = find_local_hit(s, slot, max_hit)
        hit_tokens = hit.tokens
        assert s.connector is not None
        s.connector.local_hit_reconciled(r.request_id, hit_tokens)
    # An encoder output it needs is still on its way (§4.20).
    if ec_transfer_pending(s, slot, hit_tokens + external.num_tokens):
        return Admit.SKIPPED
    if lookup and s.connector is not None:
        s.connector.external_hit_settled(r.request_id, external)
    if external.load_async:
        return admit_loading(s, slot, hit.blocks, hit_tokens, external.num_tokens, watermark)
    local_tokens = hit_tokens
    hit_tokens += external.num_tokens
    # A held step admits only requests with nothing left but their last token
    # (full hits): the pass ends at the first with prompt to compute.
    prompt_left = hit_tokens + 1 < r.num_tokens
    if draft.hold_prefills and prompt_left:
        return Admit.BLOCKED
    n = r.num_tokens - hit_tokens
    # With speculative decoding, an admission with only its last token left
    # is padded to a whole draft step (placeholder drafts the runner
    # rejects), keeping the step's decode shape uniform; never beside a
    # running prefill chunk (§4.13).
    k = c.num_speculative_tokens
    padded = False
    if (
        k > 0
        and c.drafts_by_batch_size is None
        and n == 1
        and not draft.running_prefill
        and (draft.running_scheduled or hit_tokens > 0)
        # room for the padded step and the token it samples
        and hit_tokens + k + 2 <= c.max_model_len
    ):
        if 1 + k > budget:
            return Admit.BLOCKED  # rather not schedule it than unpadded
        n = 1 + k
        padded = True
    if 0 < draft.threshold < n:
        n = draft.threshold
    # An encoder-only deployment chunks regardless: vLLM exempts it.
    if not c.enable_chunked_prefill and n > budget and c.runner is not Runner.ENCODER_ONLY:
        return Admit.BLOCKED  # without chunking, the head blocks the queue (Q6)
    n = min(n, budget)
    # A prefill chunk ends where a recurrent state is cached (§7.15); when
    # none fits, the request waits at the head.
    n = state_aligned_split(s, slot, n, hit_tokens)
    if n == 0:
        return Admit.BLOCKED
    if padded and n != 1 + k:
        # The cut took placeholder drafts: unpadded, not shortened.
        n = 1
        padded = False
    # Cut before an image the encoder cannot run this step.
    plan = plan_encoder_inputs(s, slot, hit_tokens, n, draft)
    # Nor within a multi-module drafter's read-ahead of the prompt's end.
    n = reserve_prefill_lookahead(s, slot, hit_tokens, plan.num_tokens)
    if n == 0:
        return Admit.SKIPPED
    # A session's computed tokens are in its table already.
    new_hit_tokens = local_tokens if lookup else 0
    allocated = s.kv.allocate(
        r.tables,
        r.seq,
        n,
        new_hit_tokens,
        hit.blocks if new_hit_tokens > 0 else [],
        Admission(
            full_sequence_must_fit=c.scheduler_reserve_full_isl,
            watermark=watermark,
            # Cross-attention slots for the encoder inputs it runs (§4.17).
            encoder_tokens=plan.num_embeds if isinstance(s.encoder, EncoderDecoderCache) else 0,
            external_tokens=external.num_tokens,
            owner=slot,
        ),
        r.in_flight_tokens,
    )
    if allocated is None:
        # Its references to cached encoder outputs go too.
        release_all_encoded(s, slot)
        return Admit.BLOCKED
    # Counted on admission only (Q15), after a lookup, and never for a request
    # that does not read the cache.
    if lookup and not r.skip_reading_prefix_cache:
        s.kv.record_prefix_cache_stats(r.num_tokens, local_tokens, r.num_preemptions > 0)
    draft.carried_prefill |= prompt_left
    draft.sync_kv_loads |= external.num_tokens > 0
    # Still prefilling after this chunk: an async load keeps room for it.
    # One whose load arrived keeps its reservation for the rest of this pass
    # even when this chunk ends its prefill (vLLM only adds to its set here
    # and drops a request when the step is built).
    if hit_tokens + n < r.num_tokens:
        r.inflight_prefill = True
    kind = Kind.NEW if r.status == RequestStatus.WAITING else Kind.RESUMED
    before = (r.seq.num_computed_tokens, r.status)
    r.status = RequestStatus.RUNNING
    r.seq.num_computed_tokens = hit_tokens
    undefer(s, slot)
    pop_waiting(s, from_kv)
    s.running.append(slot)
    notify_after_alloc(s, slot, external.num_tokens, before)
    e = entry(s, slot, n, kind, hit_tokens)
    if padded:
        e.drafts = Drafts(placeholders=n - 1)
    draft.entries.append(e)
    draft.token_budget -= n
    draft.input_budget -= n + draft_slots
    draft.drafts_needed |= not drafts_unused(s, slot, hit_tokens, n)
    commit_encoder_plan(s, slot, plan, draft)
    return Admit.ADMITTED


def find_local_hit(s: Scheduler, slot: int, max_tokens: int | None) -> PrefixHit:
    """The hit every group agrees on for the request in ``slot``, no further
    than ``max_tokens`` when given, with where a shared prefix ends (§7.13)
    and, when its request asks, the hit reported as events."""
    r = s.requests[slot]
    hit = s.kv.find_hit(r.seq, max_tokens)
    r.seq.shared_prefix_boundary = hit.shared_prefix_boundary
    if r.report_hits and hit.tokens > 0:
        # (In hash blocks: each group counts its own.)
        s.kv.log_event(Hit(slot, hit.tokens // s.kv.hash_block_size))
    return hit


def admit_loading(
    s: Scheduler, slot: int, hits: list[list[Block]], hit_tokens: int, external: int, watermark: int
) -> Admit:
    """Admit a request whose external tokens arrive over later steps
    (§4.19): blocks for its ``hit_tokens`` hit and its ``external`` tokens,
    kept clear of what in-flight prefills still need, none of its tokens
    scheduled. It waits, loading, among the block holders (the caller skips
    it back there)."""
    loaded_groups = connector_loaded_groups(s, slot)
    admission = Admission(
        full_sequence_must_fit=s.config.scheduler_reserve_full_isl,
        watermark=watermark,
        external_tokens=external,
        reserved_blocks=reserved_for_inflight_prefills(s),
        load_async=True,
        owner=slot,
        loaded_groups=loaded_groups,
    )
    r = s.requests[slot]
    hits = hits if hit_tokens > 0 else []
    allocated = s.kv.allocate(r.tables, r.seq, 0, hit_tokens, hits, admission, r.in_flight_tokens)
    if allocated is None:
        return Admit.BLOCKED
    notify_after_alloc(s, slot, external, (r.seq.num_computed_tokens, r.status))
    if not r.skip_reading_prefix_cache:
        s.kv.record_prefix_cache_stats(r.num_tokens, hit_tokens, r.num_preemptions > 0)
    r.status = RequestStatus.WAITING_FOR_REMOTE_KVS
    r.seq.num_computed_tokens = hit_tokens + external
    r.inflight_prefill = True
    aux_request_loading(s, slot, hit_tokens + external)
    s.kv.log_event(Loading(owner=slot, num_computed_tokens=hit_tokens + external))
    return Admit.SKIPPED
