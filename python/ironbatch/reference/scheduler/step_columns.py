"""The end of a step (docs/scheduling.md §4.7): the decisions become the
model runner's columns, and every scheduled request is advanced as if the
step had already run."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ironbatch.reference.spec_decode import NO_DRAFTS, Drafts
from ironbatch.reference.step import Kind, StepEntry, StepOutput

if TYPE_CHECKING:
    from ironbatch.reference.scheduler import Scheduler


def finish_step(s: Scheduler, entries: list[StepEntry]) -> StepOutput:
    """Write the columns of ``entries`` and advance every scheduled request
    (optimistically, before the step runs)."""
    total = sum(e.num_tokens for e in entries)
    fenced = s.kv_setup.defer_block_free and total > 0
    if fenced:
        # A step that writes KV: frees of its requests wait for it.
        s.sched_step_seq += 1
    assert total <= s.config.max_num_batched_tokens
    assert len(s.running) <= s.config.max_num_seqs
    # The drafts the runner proposes after this step (async: each request
    # scheduled waits for that many placeholders).
    next_drafts = s.config.num_speculative_tokens
    table = s.config.drafts_by_batch_size
    if table is not None and 0 < len(entries) < len(table):
        next_drafts = table[len(entries)]
    out = StepOutput.with_capacity(len(entries), total)
    for e in entries:
        r = s.requests[e.slot]
        out.push_entry(e, r.num_output_tokens + r.num_output_placeholders)
        # Each group's new blocks (the whole table for an admission), group
        # by group.
        for table, group in zip(r.tables, s.kv.groups, strict=True):
            if group.kind.is_cross():
                # Taken whole on admission, read by no decoder position.
                if e.kind is not Kind.RUNNING:
                    out.push_new_blocks(table.block_ids())
            else:
                start = len(table) - table.grown if e.kind is Kind.RUNNING else 0
                if start < len(table):
                    out.push_new_blocks(table.block_ids()[start:])
            out.end_group()
        end = e.num_computed_tokens + e.num_tokens
        # None without a KV cache, or when group 0 holds recurrent states.
        slotted = r.tables and not s.kv.groups[0].kind.is_slotless()
        first = r.tables[0] if slotted else None
        for p in range(e.num_computed_tokens, end):
            out.push_token(p, None if first is None else s.kv.slot_of(0, first, p))
        out.end_entry(end)
        r.seq.num_computed_tokens += e.num_tokens
        r.in_flight_tokens += e.num_tokens
        if fenced:
            r.last_sched_seq = s.sched_step_seq
        r.prefill_chunk = r.is_prefill_chunk
        if not r.prefill_chunk:
            # Its prefill is done: an async load reserves nothing for it.
            r.inflight_prefill = False
            structured = r.grammar is not None
            out.has_structured_output_requests |= structured
            if s.config.async_scheduling:
                # Its grammar mask needs the token still in flight.
                out.pending_structured_output_tokens |= structured and r.num_output_placeholders > 0
                # The token this step samples (none for a pooling runner)
                # and the drafts it verifies; the runner proposes the next
                # drafts meanwhile.
                sampled = s.config.runner.sampled_tokens_per_step()
                r.num_output_placeholders += sampled + len(e.drafts)
                k = next_drafts
                r.drafts = Drafts(placeholders=k) if k else NO_DRAFTS
                if s.config.decode_stagger > 0:
                    r.next_decode_step = s.current_step + s.config.decode_stagger
    # The other decoder groups' slots follow group 0's, group by group, each
    # in the tokens' order (cross-attention's are the encoder's, a recurrent
    # group's blocks hold states: none).
    for g in range(1, len(s.kv.groups)):
        if s.kv.groups[g].kind.is_slotless():
            continue
        for e in entries:
            table = s.requests[e.slot].tables[g]
            for p in range(e.num_computed_tokens, e.num_computed_tokens + e.num_tokens):
                out.push_slot(s.kv.slot_of(g, table, p))
    out.entries = entries
    out.new_block_ids_to_zero = s.kv.take_blocks_to_zero()
    # In the order vLLM adds them to its sets: a set's iteration order
    # (which a connector building its metadata follows) can depend on it.
    out.preempted_req_ids, s.preempted_ids = s.preempted_ids, []
    out.finished_req_ids, s.finished_ids = s.finished_ids, []
    out.scheduler_id = s.id
    out.step_id = s.next_step
    s.pending_steps.append(s.next_step)
    s.next_step += 1
    return out
