"""Who is preempted and what preemption does (docs/scheduling.md §4.3,
§4.4): recompute-style, the victim's blocks freed and its tokens computed
again when it is admitted again."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ironbatch.reference.request import RequestStatus
from ironbatch.reference.scheduler.encoder_inputs import (
    refund_encoder_inputs,
    release_all_encoded,
)
from ironbatch.reference.scheduler_config import Policy
from ironbatch.reference.spec_decode import NO_DRAFTS

if TYPE_CHECKING:
    from ironbatch.reference.scheduler import Scheduler, StepDraft


def take_victim(s: Scheduler, current: int, cursor: int, draft: StepDraft) -> tuple[int, int]:
    """Remove the victim from ``running``; returns it and the running
    pass's cursor after the removal. FCFS: the last running request.
    Priority: the largest ``(priority, arrival_time)``, the earliest in
    ``running`` on ties (Q9); if it was already scheduled this step, its
    entry is undone and its tokens go back to the budget."""
    if s.policy is Policy.FCFS:
        # Never scheduled already: the pass walks forward to it.
        return s.running.pop(), cursor
    v = victim_index(s)
    victim = s.running.pop(v)
    if v < cursor:
        cursor -= 1
    if victim != current:
        for k, e in enumerate(draft.entries):
            if e.slot == victim:
                refund = draft.entries.pop(k).num_tokens
                draft.token_budget += refund
                draft.input_budget += refund + s.config.num_draft_slots
                refund_encoder_inputs(s, victim, draft)
                break
    return victim, cursor


def victim_of(s: Scheduler, current: int) -> int:
    """The victim ``take_victim`` would take while ``current`` asks for
    blocks, left in ``running``."""
    if s.policy is Policy.FCFS:
        return s.running[-1] if s.running else current
    return s.running[victim_index(s)]


def victim_index(s: Scheduler) -> int:
    """Priority's victim: the index in ``running`` of the largest
    ``(priority, arrival_time)``, the earliest on ties."""
    v = 0
    for k, slot in enumerate(s.running):
        cand, best = s.requests[slot], s.requests[s.running[v]]
        if cand.priority > best.priority or (
            cand.priority == best.priority and cand.arrival_time > best.arrival_time
        ):
            v = k
    return v


def preempt(s: Scheduler, slot: int, drop_stale: bool) -> None:
    """Preempt a request that already left ``running``: free its blocks,
    forget what it computed, and put it at the head of the waiting queue.
    Its output in flight becomes stale (docs/scheduling.md §5.4): still
    delivered, but it keeps the request waiting until it drains;
    ``drop_stale`` (a reset) discards that share instead."""
    s.log_released(slot)
    release_all_encoded(s, slot)
    s.free_blocks_of(slot)
    r = s.requests[slot]
    r.status = RequestStatus.PREEMPTED
    r.seq.num_computed_tokens = 0
    r.num_preemptions += 1
    r.inflight_prefill = False
    # A dropped share not yet drained stays dropped through this one.
    r.drop_stale = drop_stale or (r.drop_stale and r.stale_tokens > 0)
    r.stale_tokens = r.in_flight_tokens
    r.num_output_placeholders = 0
    r.drafts = NO_DRAFTS
    s.waiting_queue.prepend(slot, s.requests)
    if r.request_id not in s.preempted_ids:
        s.preempted_ids.append(r.request_id)
    s.num_preempted += 1
