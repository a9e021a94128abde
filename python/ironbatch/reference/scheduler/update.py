"""``update_from_output`` (docs/scheduling.md §5): the tokens a step sampled
come back; each is appended and checked for a stop (and, for a
structured-output request, against its grammar), finished requests are freed
in scheduling order, and (async) placeholders are resolved."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ironbatch.reference.error import foreign_step, step_already_applied
from ironbatch.reference.kv_cache_manager import KvCacheManager
from ironbatch.reference.kv_connector import NO_REPORT, KvTransferReport
from ironbatch.reference.request import Request, RequestStatus
from ironbatch.reference.scheduler import (
    block_pins,
    kv_load_failure,
    kv_transfer,
    session,
    waiting_pass,
)
from ironbatch.reference.scheduler.encoder_inputs import release_encoded
from ironbatch.reference.scheduler.request_errors import NO_ERRORS, RequestErrors, end_with_errors
from ironbatch.reference.scheduler_config import Runner
from ironbatch.reference.spec_decode import SpecDecodingStats
from ironbatch.reference.step import (
    Finished,
    StepEntry,
    StepOutput,
    UpdateOutput,
    UpdateRecord,
)
from ironbatch.reference.stop_check import check_stop

if TYPE_CHECKING:
    from ironbatch.reference.scheduler import Scheduler

#: ``accept(slot, request, kept)``: whether a structured-output request's
#: grammar takes the tokens it kept (it must not raise: the bindings catch).
AcceptKept = Callable[[int, Request, list[int]], bool]


def accept_all(slot: int, request: Request, kept: list[int]) -> bool:
    del slot, request, kept
    return True


def update_from_output(
    s: Scheduler, step: StepOutput, tokens: list[int], offsets: list[int]
) -> UpdateOutput:
    """Apply a step's sampled tokens: entry ``i`` of ``step`` gets
    ``tokens[offsets[i]:offsets[i + 1]]``. Checked first, so a
    ``ValueError`` changes nothing."""
    return update_from_output_checked(s, step, tokens, offsets, accept_all)


def update_from_output_checked(
    s: Scheduler, step: StepOutput, tokens: list[int], offsets: list[int], accept: AcceptKept
) -> UpdateOutput:
    """``update_from_output``, asking ``accept(slot, request, kept)`` about
    the tokens each structured-output request kept (appended already, after
    the stop check trimmed them; delivered stale output included). False
    ends the request with an error, whatever the stop check said (§5.2): its
    grammar rejected them."""
    return update_with_kv_report(s, step, tokens, offsets, accept, NO_REPORT)


def update_with_kv_report(
    s: Scheduler,
    step: StepOutput,
    tokens: list[int],
    offsets: list[int],
    accept: AcceptKept,
    report: KvTransferReport,
    errors: RequestErrors = NO_ERRORS,
) -> UpdateOutput:
    """``update_from_output_checked`` with the worker's report of the step's
    KV transfers (§4.19), in vLLM's order: failed loads cut their requests
    back first (those scheduled in the step take no output), then the
    output is applied, then the requests the "fail" policy ends and those
    ``errors`` names finish with an error, in one order (see
    ``RequestErrors``), then finished loads and sends are settled."""
    check_update(s, step, tokens, offsets)
    if not report.is_empty():
        kv_load_failure.check_kv_report(s, report)
    failed = take_failed_loads(s, step, report)
    s.pending_steps.remove(step.step_id)
    out = UpdateOutput()
    ended = Ended()
    for i, e in enumerate(step.entries):
        if not s.is_live(e):
            continue  # finished (and maybe its slot reused) meanwhile
        if e.slot in failed.skip:
            skip_cut_back(s, e)
            continue
        sampled = tokens[offsets[i] : offsets[i + 1]]
        status_before = apply_output(s, i, e, sampled, accept, out)
        if status_before is not None:
            end_request(s, e.slot, status_before, out, ended)
    unqueue_ended(s, ended)
    settle_kv_report(s, out, failed, report, errors)
    return out


def skip_cut_back(s: Scheduler, e: StepEntry) -> None:
    """A step's entry whose request a failed load cut back: it takes no
    output, and computes again from there."""
    r = s.requests[e.slot]
    r.in_flight_tokens = max(r.in_flight_tokens - e.num_tokens, 0)
    r.stale_tokens = max(r.stale_tokens - e.num_tokens, 0)


def take_failed_loads(
    s: Scheduler, step: StepOutput, report: KvTransferReport
) -> kv_load_failure.FailedLoads:
    """A step's KV-transfer report (checked), before its output: the step's
    writes are done, so fenced frees go back, and failed loads cut their
    requests back (those the update skips, those it ends)."""
    block_pins.apply_pin_requests(s)
    if s.kv_setup.defer_block_free and any(e.num_tokens > 0 for e in step.entries):
        # Every write of this step and those before it is done.
        s.processed_step_seq += 1
        s.drain_deferred_frees()
    if report.failed_recving or report.invalid_block_ids:
        return kv_load_failure.apply_failed_loads(s, report, step)
    return kv_load_failure.FailedLoads()


def settle_kv_report(
    s: Scheduler,
    out: UpdateOutput,
    failed: kv_load_failure.FailedLoads,
    report: KvTransferReport,
    errors: RequestErrors,
) -> None:
    """A step's KV-transfer report, after its output: the requests the
    "fail" policy ends and the caller's errors finish with an error, then
    finished loads and sends are settled."""
    end_with_errors(s, out, failed, errors)
    if report.finished_recving or report.finished_sending:
        kv_transfer.settle_kv_transfers(s, report.finished_recving, report.finished_sending)


@dataclass
class Ended:
    """The requests an update finished, by the queue each leaves."""

    running: list[int] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)
    #: Streaming sessions whose turn ended: queued again, waiting.
    continuing: list[int] = field(default_factory=list)


def end_request(
    s: Scheduler, slot: int, status_before: RequestStatus, out: UpdateOutput, ended: Ended
) -> None:
    """The request in ``slot`` finished in this update (its record is the
    last of ``out.finished``): a session's turn ends, anything else is freed
    now, in scheduling order, which shapes the free queue (Q18)."""
    if status_before == RequestStatus.RUNNING:
        ended.running.append(slot)
    else:
        ended.waiting.append(slot)
    continues = session.end_turn(s, slot)
    # A session's turn end resets what it computed to its frontier.
    out.finished[-1].num_computed_tokens = s.requests[slot].seq.num_computed_tokens
    out.finished[-1].session_continues = continues
    if continues:
        # A streaming session: it waits for (or took) its next chunk.
        ended.continuing.append(slot)
    else:
        s.free_request(slot, False)


def unqueue_ended(s: Scheduler, ended: Ended) -> None:
    """Out of their queues at once, as vLLM takes them out; sessions that go
    on are queued again, waiting."""
    if ended.running:
        gone = set(ended.running)
        s.running[:] = [slot for slot in s.running if slot not in gone]
    s.unqueue_waiting(ended.waiting)
    for slot in ended.continuing:
        if slot in ended.waiting:
            waiting_pass.undefer(s, slot)
        s.enqueue_waiting(slot)


def apply_output(
    s: Scheduler, row: int, e: StepEntry, sampled: list[int], accept: AcceptKept, out: UpdateOutput
) -> RequestStatus | None:
    """Apply entry ``row``'s tokens to its request and record them in
    ``out``. Returns the request's status before, if it finished (the
    caller frees it)."""
    kv = s.kv
    r = s.requests[e.slot]
    r.in_flight_tokens = max(r.in_flight_tokens - e.num_tokens, 0)
    stale = r.stale_tokens > 0
    if stale:
        r.stale_tokens = max(r.stale_tokens - e.num_tokens, 0)
        if r.drop_stale:
            return None  # a reset preempted it: discarded (docs/scheduling.md §5.4)
    if not sampled:
        release_encoded(s.encoder, s.ec_connector, e.slot, r)
        # An encoder-only deployment samples nothing: a request is done once
        # its prompt is consumed (its images encoded, §4.18).
        consumed = r.seq.num_computed_tokens >= r.seq.num_prompt_tokens
        if s.config.runner is Runner.ENCODER_ONLY and consumed:
            return finish_without_tokens(kv, row, e.slot, r, out)
        return None  # a prefill chunk: no output
    num_drafts = len(e.drafts)
    if num_drafts > 0:
        # Positions of rejected drafts are computed again; a stale output's
        # counts predate the preemption and are left alone.
        accepted = len(sampled) - 1
        rejected = num_drafts - accepted
        if not stale:
            r.seq.num_computed_tokens = max(r.seq.num_computed_tokens - rejected, 0)
            r.num_output_placeholders = max(r.num_output_placeholders - rejected, 0)
        if out.spec_decoding_stats is None:
            out.spec_decoding_stats = SpecDecodingStats.new(s.config.num_speculative_tokens)
        out.spec_decoding_stats.observe(num_drafts, accepted)
    release_encoded(s.encoder, s.ec_connector, e.slot, r)
    status_before = r.status
    had_placeholders = r.num_output_placeholders > 0
    start = len(out.tokens)
    finished = append_until_stop(r, sampled, kv, s.config.max_model_len, out.tokens)
    if finished and not stale:
        # Positions scheduled for tokens after the stop were for nothing.
        unused = len(sampled) - (len(out.tokens) - start)
        r.seq.num_computed_tokens -= min(unused, r.seq.num_computed_tokens)
    if not stale and had_placeholders:
        # Every returned token resolves a placeholder, kept or trimmed.
        r.num_output_placeholders = max(r.num_output_placeholders - len(sampled), 0)
    confirms_blocks = had_placeholders or s.config.num_speculative_tokens > 0
    if not stale and status_before == RequestStatus.RUNNING and confirms_blocks:
        cache_arrived(kv, e.slot, r)
    if r.grammar is not None and not accept(e.slot, r, out.tokens[start:]):
        r.status = RequestStatus.FINISHED_ERROR  # the grammar rejected them
        r.resumable = False  # which ends a session too
        finished = True
    out.records.append(UpdateRecord(row, e.slot, len(out.tokens), kv.num_cached_tokens(r.tables)))
    if not finished:
        return None
    out.finished.append(
        Finished(
            record=len(out.records) - 1,
            request_id=r.request_id,
            status=r.status,
            stop_reason=r.stop_reason,
            token_ids=list(r.seq.tokens),
            num_computed_tokens=r.seq.num_computed_tokens,
        )
    )
    return status_before


def check_update(s: Scheduler, step: StepOutput, tokens: list[int], offsets: list[int]) -> None:
    """The whole output must fit the step before anything changes."""
    if step.scheduler_id != s.id:
        raise foreign_step()
    if step.step_id not in s.pending_steps:
        raise step_already_applied()
    if s.config.runner is Runner.POOLING and tokens:
        raise ValueError(
            "sampled: a pooling runner samples no tokens; apply its output with "
            "update_from_pooler_output"
        )
    if s.config.runner is Runner.ENCODER_ONLY and tokens:
        raise ValueError(
            "sampled: an encoder-only runner samples no tokens (runner='encoder_only')"
        )
    n = len(step.entries)
    if len(offsets) != n + 1:
        raise ValueError(
            f"sampled: {len(offsets)} offsets for a step of {n} requests (need {n + 1})"
        )
    rising = all(offsets[k] <= offsets[k + 1] for k in range(n))
    if offsets[0] != 0 or not rising or offsets[n] != len(tokens):
        raise ValueError("sampled: offsets must rise from 0 to the number of tokens")
    for i, e in enumerate(step.entries):
        got = offsets[i + 1] - offsets[i]
        # A step samples one token after the drafts it verified: a runner
        # handing back more would grow the request by tokens no step computed.
        if got > len(e.drafts) + 1:
            raise ValueError(
                f"sampled: entry {i} got {got} tokens, but its step scheduled "
                f"{len(e.drafts)} drafts, so it samples at most {len(e.drafts) + 1}"
            )
        if got > 0 and not e.samples:
            raise ValueError(
                f"sampled: entry {i} got tokens, but its step ended before the request's "
                "last known token"
            )


def finish_without_tokens(
    kv: KvCacheManager, row: int, slot: int, r: Request, out: UpdateOutput
) -> RequestStatus:
    """End request ``r`` (in ``slot``, entry ``row`` of the step) with a
    result that carries no token: a pooled output, or an encoder-only
    deployment's consumed prompt (``FINISHED_STOPPED``). Returns its status
    before, for the caller to free it."""
    status_before = r.status
    r.status = RequestStatus.FINISHED_STOPPED
    out.records.append(UpdateRecord(row, slot, len(out.tokens), kv.num_cached_tokens(r.tables)))
    out.finished.append(
        Finished(
            record=len(out.records) - 1,
            request_id=r.request_id,
            status=r.status,
            stop_reason=None,
            token_ids=list(r.seq.tokens),
            num_computed_tokens=r.seq.num_computed_tokens,
        )
    )
    return status_before


def append_until_stop(
    r: Request, sampled: list[int], kv: KvCacheManager, max_model_len: int, out: list[int]
) -> bool:
    """Append ``sampled`` to ``r`` one token at a time, stopping after the
    first token that ends it (docs/scheduling.md §5.2); the appended tokens
    go to ``out`` too. Returns whether it finished."""
    for t in sampled:
        r.seq.append([t], kv.hasher, kv.hash_block_size)
        out.append(t)
        if check_stop(r, max_model_len):
            return True
    return False


def cache_arrived(kv: KvCacheManager, slot: int, r: Request) -> None:
    """Hash-cache the blocks of a running request that arrived tokens
    confirmed: under async scheduling (the tokens were placeholders at
    allocation) and speculative decoding (only accepted drafts count), vLLM
    caches them when the output arrives."""
    upto = max(r.seq.num_computed_tokens - r.in_flight_tokens, 0)
    kv.cache_full_blocks(r.tables, r.seq, upto, slot)
