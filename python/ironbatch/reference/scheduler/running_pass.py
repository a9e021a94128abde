"""The RUNNING pass (docs/scheduling.md §4.2): every running request, in
order, gets the tokens it is behind by, within the budget; when no block is
free for it, victims are preempted until one is, or until it is the victim
itself."""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

from ironbatch.reference.kv_cache_manager import Admission
from ironbatch.reference.request import Request
from ironbatch.reference.scheduler.drafts import drafts_unused
from ironbatch.reference.scheduler.ec_transfer import ec_transfer_pending
from ironbatch.reference.scheduler.encoder_inputs import commit_encoder_plan, plan_encoder_inputs
from ironbatch.reference.scheduler.kv_transfer import connector_frees_pending
from ironbatch.reference.scheduler.preemption import preempt, take_victim, victim_of
from ironbatch.reference.scheduler.prefill_lookahead import reserve_prefill_lookahead
from ironbatch.reference.scheduler.state_aligned_split import state_aligned_split
from ironbatch.reference.scheduler_config import Policy
from ironbatch.reference.spec_decode import NO_DRAFTS, Drafts
from ironbatch.reference.step import Kind, StepEntry

if TYPE_CHECKING:
    from ironbatch.reference.scheduler import Scheduler, StepDraft


class Grant(enum.Enum):
    """What a running request's allocation came to."""

    #: Its tables cover the tokens (each records what it grew by).
    GRANTED = enum.auto()
    #: It was the victim itself.
    PREEMPTED_ITSELF = enum.auto()
    #: Too few blocks, and the KV connector is about to free some, or the
    #: victim's blocks are fenced by a step in flight: the pass ends without
    #: preempting.
    AWAITING_FREES = enum.auto()


def schedule_running(s: Scheduler, draft: StepDraft) -> None:
    """Schedule the running requests into ``draft``."""
    # A drafter's own input slots (draft models, parallel drafting) come out
    # of the input budget beside each request's tokens.
    draft_slots = s.config.num_draft_slots
    i = 0
    while i < len(s.running) and draft.token_budget > 0 and draft.input_budget > draft_slots:
        slot = s.running[i]
        r = s.requests[slot]
        # Async: its last token is in flight already. Pipeline parallelism:
        # its last decode is still a few stages away. A held step skips
        # running prefill chunks (§4.11).
        if (
            last_token_in_flight(r)
            or s.current_step < r.next_decode_step
            or (draft.hold_prefills and r.prefill_chunk)
        ):
            i += 1
            continue
        # An encoder output it needs is still on its way (§4.20). Its
        # confirmed tokens, as vLLM counts them: below zero where a failed
        # load cut it back under the tokens in flight.
        confirmed = r.seq.num_computed_tokens - r.num_output_placeholders
        if ec_transfer_pending(s, slot, confirmed):
            i += 1
            continue
        n = num_running_tokens(s, slot, draft)
        if n == 0:
            # Nothing to compute this step: skip it, don't end the pass
            # (Q17); later requests may still need tokens.
            i += 1
            continue
        computed = s.requests[slot].seq.num_computed_tokens
        # A prefill chunk ends where a recurrent state is cached (§7.15).
        n = state_aligned_split(s, slot, n, computed)
        if n == 0:
            i += 1
            continue
        # Cut before an image the encoder cannot run this step (§4.15).
        plan = plan_encoder_inputs(s, slot, computed, n, draft)
        # Nor within a multi-module drafter's read-ahead of the prompt's end.
        n = reserve_prefill_lookahead(s, slot, computed, plan.num_tokens)
        if n == 0:
            i += 1
            continue
        grant, i = allocate_or_preempt(s, slot, n, i, draft)
        if grant is Grant.GRANTED:
            commit_encoder_plan(s, slot, plan, draft)
            draft.carried_prefill |= s.requests[slot].prefill_chunk
            draft.running_prefill |= s.requests[slot].prefill_chunk
            e = entry(s, slot, n, Kind.RUNNING, computed)
            e.drafts = take_scheduled_drafts(s, slot, n)
            draft.entries.append(e)
            draft.token_budget -= n
            draft.input_budget -= n + draft_slots
            draft.drafts_needed |= not drafts_unused(s, slot, computed, n)
            i += 1
        elif grant is Grant.PREEMPTED_ITSELF and s.policy is Policy.PRIORITY:
            # It preempted itself: running[i] is now the next request and
            # the pass goes on (Q10).
            continue
        else:
            break  # FCFS ends the pass (and so does a wait for freed blocks)


def num_running_tokens(s: Scheduler, slot: int, draft: StepDraft) -> int:
    """Tokens the running request in ``slot`` gets this step; 0 to skip it."""
    r = s.requests[slot]
    computed = r.seq.num_computed_tokens
    placeholders = r.num_output_placeholders
    # Its drafts count against the budget and max_model_len (§4.13). At
    # least 0: a second synchronous step scheduled before the first's output
    # finds its drafts' positions computed already (nothing to do).
    n = max(r.num_tokens + len(r.drafts) + placeholders - computed, 0)
    if 0 < draft.threshold < n:
        n = draft.threshold
    # A generating request never computes the last position of
    # max_model_len (nothing would sample after it); a pooled one may.
    sampled = s.config.runner.sampled_tokens_per_step()
    room = max(s.config.max_model_len - sampled - computed, 0)
    input_room = draft.input_budget - s.config.num_draft_slots
    return min(n, draft.token_budget, input_room, room)


def take_scheduled_drafts(s: Scheduler, slot: int, n: int) -> Drafts:
    """The drafts among the ``n`` tokens scheduled for the running request
    in ``slot`` (a prefix of its drafts when the budget or max_model_len cut
    the step short); its drafts are used up either way."""
    r = s.requests[slot]
    if not r.drafts:
        return NO_DRAFTS
    drafts, r.drafts = r.drafts, NO_DRAFTS
    scheduled = r.seq.num_computed_tokens + n - (r.num_tokens + r.num_output_placeholders)
    return drafts.first(scheduled) if scheduled > 0 else NO_DRAFTS


def allocate_or_preempt(
    s: Scheduler, slot: int, n: int, cursor: int, draft: StepDraft
) -> tuple[Grant, int]:
    """Blocks for ``n`` more tokens of the running request in ``slot``
    (``running[cursor]``). While too few are free, a victim is preempted;
    the cursor and the budget follow what that removes. Returns what the
    allocation came to and the cursor."""
    while True:
        r = s.requests[slot]
        admission = Admission(owner=slot)
        if s.kv.allocate(r.tables, r.seq, n, 0, [], admission, r.in_flight_tokens) is not None:
            return Grant.GRANTED, cursor
        # A KV connector is about to free blocks: wait for them rather than
        # preempt (§4.19).
        if connector_frees_pending(s):
            return Grant.AWAITING_FREES, cursor
        # A victim a step in flight may still write cannot give its blocks
        # back yet: the pass ends as if none were to be had.
        if not s.blocks_can_be_freed(victim_of(s, slot)):
            return Grant.AWAITING_FREES, cursor
        victim, cursor = take_victim(s, slot, cursor, draft)
        preempt(s, victim, s.kv_setup.requires_kv_delivery)
        draft.preempted_any = True
        if victim == slot:
            return Grant.PREEMPTED_ITSELF, cursor


def entry(s: Scheduler, slot: int, n: int, kind: Kind, computed: int) -> StepEntry:
    """A step entry for the request in ``slot``: ``n`` tokens after
    ``computed`` (its tables record the blocks they grew by)."""
    r = s.requests[slot]
    return StepEntry(
        slot=slot,
        generation=s.requests.generation(slot),
        num_tokens=n,
        kind=kind,
        num_computed_tokens=computed,
        samples=computed + n >= r.num_tokens,
    )


def last_token_in_flight(r: Request) -> bool:
    """Async: the token in flight is the request's last one (max_tokens), so
    another step could only compute a position nobody samples."""
    placeholders = r.num_output_placeholders
    return (
        placeholders > 0
        and r.seq.num_computed_tokens + 2
        >= placeholders + r.seq.num_prompt_tokens + r.stop.max_tokens
    )
