"""The WAITING pass (docs/scheduling.md §4.5): admit waiting requests from
the head of the queue while the budgets, ``max_num_active_seqs`` and the KV cache
allow, each with its longest cached prefix."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ironbatch.reference.kv_events import Hit
from ironbatch.reference.request import RequestStatus
from ironbatch.reference.scheduler.running_pass import entry
from ironbatch.reference.step import Kind

if TYPE_CHECKING:
    from ironbatch.reference.scheduler import Scheduler, StepDraft


def schedule_waiting(s: Scheduler, draft: StepDraft) -> None:
    """Admit waiting requests into ``draft`` (only when nobody was
    preempted this step and admissions are not paused)."""
    skipped: list[int] = []
    while (
        draft.token_budget > 0
        and draft.input_budget > 0
        and len(s.running) < s.config.max_num_active_seqs
    ):
        slot = s.waiting_queue.peek()
        if slot is None:
            break
        # Held for its grammar (§4.10); the compile result counts now.
        r = s.requests[slot]
        if r.grammar is not None:
            r.grammar, reached = r.grammar.reach()
            if reached.failed:
                draft.grammar_failed.append(slot)
            if not reached.go:
                skip(s, slot, skipped)
                continue
            if reached.released:
                draft.grammar_released.append(slot)
        if output_in_flight(s, slot):
            skip(s, slot, skipped)
            continue
        if not admit(s, slot, draft):
            break  # it stays at the head
    # Skipped requests go back to the head, in their order (Q11).
    for slot in reversed(skipped):
        s.waiting_queue.prepend(slot, s.requests[slot])


def output_in_flight(s: Scheduler, slot: int) -> bool:
    """Whether a preempted request's earlier output is still on its way
    (docs/scheduling.md §5.4): it waits until that drains, unless a reset
    dropped it."""
    r = s.requests[slot]
    return r.stale_tokens > 0 and not r.drop_stale


def skip(s: Scheduler, slot: int, skipped: list[int]) -> None:
    """Take the head out of this pass; it goes back at the end."""
    defer(s, slot)
    s.waiting_queue.pop()
    skipped.append(slot)


def defer(s: Scheduler, slot: int) -> None:
    """Count a request as skipped by the waiting pass (vLLM's
    ``deferred_waiting``, reported in the stats) until it is admitted."""
    r = s.requests[slot]
    if not r.deferred:
        r.deferred = True
        s.num_deferred += 1


def admit(s: Scheduler, slot: int, draft: StepDraft) -> bool:
    """Admit the request at the head of the queue, after its prefix hits;
    False when it cannot be admitted now (the pass ends there)."""
    c = s.config
    # Headroom kept free for those already running (none when alone).
    watermark = c.watermark_blocks if s.running else 0
    budget = min(draft.token_budget, draft.input_budget)
    r = s.requests[slot]
    # A request that must compute every prompt token (vLLM: it wants prompt
    # logprobs) reads no hits; its blocks are still cached.
    hits, hit_tokens = ([], 0) if r.skip_reading_prefix_cache else s.kv.get_computed_blocks(r.seq)
    if r.report_hits and hit_tokens > 0:
        s.kv.log_event(Hit(slot, len(hits)))
    # A held step admits only requests with nothing left but their last token
    # (full hits): the pass ends at the first with prompt to compute.
    prompt_left = hit_tokens + 1 < r.num_tokens
    if draft.hold_prefills and prompt_left:
        return False
    n = r.num_tokens - hit_tokens
    if 0 < draft.threshold < n:
        n = draft.threshold
    if not c.enable_chunked_prefill and n > budget:
        return False  # without chunking, the head blocks the queue (Q6)
    n = min(n, budget)
    grown = s.kv.allocate(
        r.table, r.seq, n, hit_tokens, hits, c.scheduler_reserve_full_isl, watermark
    )
    if grown is None:
        return False
    # Counted on admission only (Q15), and never for a request that does not
    # read the cache.
    if not r.skip_reading_prefix_cache:
        s.kv.record_prefix_cache_stats(r.num_tokens, hit_tokens, r.num_preemptions > 0)
    draft.carried_prefill |= prompt_left
    kind = Kind.NEW if r.status == RequestStatus.WAITING else Kind.RESUMED
    r.status = RequestStatus.RUNNING
    r.seq.num_computed_tokens = hit_tokens
    if r.deferred:
        r.deferred = False
        s.num_deferred -= 1
    # Its new blocks were cached by the allocation, after the hits.
    s.log_stored(slot, len(hits))
    s.waiting_queue.pop()
    s.running.append(slot)
    draft.entries.append(entry(s, slot, n, kind, hit_tokens, grown))
    draft.token_budget -= n
    draft.input_budget -= n
    return True
