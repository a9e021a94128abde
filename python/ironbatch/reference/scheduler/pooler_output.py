"""A pooling runner's output (docs/scheduling.md §4.16): no tokens come
back, only a pooled result for each request whose step reached the end of
its prompt. That result finishes the request (``FINISHED_STOPPED``), as
vLLM's ``update_from_output`` ends a pooling request as soon as its
``pooler_output`` arrives; a step that ended inside the prompt (a chunk)
brings nothing and the request runs on."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ironbatch.reference.error import foreign_step, step_already_applied
from ironbatch.reference.kv_connector import KvTransferReport
from ironbatch.reference.request import RequestStatus
from ironbatch.reference.scheduler.encoder_inputs import release_encoded
from ironbatch.reference.scheduler.kv_load_failure import check_kv_report
from ironbatch.reference.scheduler.request_errors import NO_ERRORS, RequestErrors
from ironbatch.reference.scheduler.update import (
    Ended,
    end_request,
    finish_without_tokens,
    settle_kv_report,
    skip_cut_back,
    take_failed_loads,
    unqueue_ended,
)
from ironbatch.reference.scheduler_config import Runner
from ironbatch.reference.step import StepEntry, StepOutput, UpdateOutput

if TYPE_CHECKING:
    from ironbatch.reference.scheduler import Scheduler


def update_from_pooler_output(s: Scheduler, step: StepOutput, pooled: list[bool]) -> UpdateOutput:
    """Apply a pooling runner's output: ``pooled[i]`` says whether entry
    ``i`` of ``step`` got a pooled result. Checked first, so a
    ``ValueError`` changes nothing."""
    return update_pooled_with_kv_report(s, step, pooled, KvTransferReport())


def update_pooled_with_kv_report(
    s: Scheduler,
    step: StepOutput,
    pooled: list[bool],
    report: KvTransferReport,
    errors: RequestErrors = NO_ERRORS,
) -> UpdateOutput:
    """``update_from_pooler_output`` with the worker's report of the step's
    KV transfers, in the order a generating update takes it
    (``update_with_kv_report``): a request a failed load cut back gets no
    pooled result from this step."""
    check_pooled(s, step, pooled)
    if not report.is_empty():
        check_kv_report(s, report)
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
        status_before = apply_pooled(s, i, e, pooled[i], out)
        if status_before is not None:
            end_request(s, e.slot, status_before, out, ended)
    unqueue_ended(s, ended)
    settle_kv_report(s, out, failed, report, errors)
    return out


def apply_pooled(
    s: Scheduler, row: int, e: StepEntry, pooled: bool, out: UpdateOutput
) -> RequestStatus | None:
    """Entry ``row``'s result: a pooled one finishes its request (returns
    its status before, for the caller to free it)."""
    r = s.requests[e.slot]
    r.in_flight_tokens = max(r.in_flight_tokens - e.num_tokens, 0)
    if r.stale_tokens > 0:
        r.stale_tokens = max(r.stale_tokens - e.num_tokens, 0)
        if r.drop_stale:
            return None  # a reset preempted it: discarded (docs/scheduling.md §5.4)
    # The step ran, so its encoder inputs are released either way.
    release_encoded(s.encoder, s.ec_connector, e.slot, r)
    if not pooled:
        return None  # a prefill chunk: no output
    return finish_without_tokens(s.kv, row, e.slot, r, out)


def check_pooled(s: Scheduler, step: StepOutput, pooled: list[bool]) -> None:
    """The whole pooled output must fit the step before anything changes."""
    if s.config.runner is not Runner.POOLING:
        raise ValueError(
            "pooler_output: this scheduler's runner generates (runner='generate'); apply its "
            "sampled tokens with update_from_output"
        )
    if step.scheduler_id != s.id:
        raise foreign_step()
    if step.step_id not in s.pending_steps:
        raise step_already_applied()
    n = len(step.entries)
    if len(pooled) != n:
        raise ValueError(f"pooler_output: {len(pooled)} entries for a step of {n} requests")
    # A runner pools a prompt once its last position is computed: a result
    # for a step that ended inside the prompt would finish a request whose
    # prompt was never read to the end.
    for i in range(n):
        if pooled[i] and not step.entries[i].samples:
            raise ValueError(
                f"pooler_output: entry {i} got a pooled result, but its step ended before the "
                "end of the request's prompt"
            )
