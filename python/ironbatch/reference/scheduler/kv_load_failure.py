"""KV loads that failed (docs/scheduling.md §4.19): a load that failed whole
(``failed_recving``) or blocks that did not arrive (``invalid_block_ids``).
The requests they touch are cut back to what arrived and either compute the
rest or end with an error, as the connector's failure policy says; vLLM
0.33's rules, in its order."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ironbatch.reference.block import cdiv
from ironbatch.reference.kv_connector import KvTransferReport, LoadFailurePolicy
from ironbatch.reference.request import RequestStatus
from ironbatch.reference.scheduler import kv_transfer
from ironbatch.reference.scheduler.request_errors import ErrorGroups
from ironbatch.reference.step import StepOutput

if TYPE_CHECKING:
    from ironbatch.reference.scheduler import Scheduler


@dataclass
class FailedLoads:
    """The requests a report's failures touched."""

    #: Scheduled in the step and touched: the update applies no output to
    #: them (their computed tokens were cut back).
    skip: list[int] = field(default_factory=list)
    #: To end with an error after the update (the "fail" policy), in the
    #: order they were found.
    ended: list[int] = field(default_factory=list)
    #: The same, as each of vLLM's three searches found them.
    groups: ErrorGroups = field(default_factory=ErrorGroups)


@dataclass
class Cut:
    """What one walk over requests found (vLLM's
    ``_update_requests_with_invalid_blocks``)."""

    affected: list[int] = field(default_factory=list)
    #: Invalid blocks and every block after them, to uncache ("fail").
    to_evict: list[int] = field(default_factory=list)


def check_kv_report(s: Scheduler, report: KvTransferReport) -> None:
    """Refuse (``ValueError``) a report naming blocks the pool does not
    have, or transfers of requests in no state for them, before anything
    changes."""
    num_blocks = s.kv.pool.num_blocks
    for b in report.invalid_block_ids:
        if b >= num_blocks:
            raise ValueError(
                f"invalid_block_ids: block {b} is not in the pool of {num_blocks} blocks"
            )
    if report.invalid_block_ids and len(s.config.kv_cache_groups) > 1:
        # Block ids are unique within a group only.
        raise ValueError(
            "invalid_block_ids: a layout of several KV-cache groups reports failed_recving"
        )
    kv_transfer.check_kv_transfers(s, report.finished_recving, report.finished_sending)


def apply_failed_loads(s: Scheduler, report: KvTransferReport, step: StepOutput) -> FailedLoads:
    """The report's failures, before the update applies the step's output:
    whole failed loads first, then invalid blocks."""
    recompute = s.kv_setup.load_failure_policy is LoadFailurePolicy.RECOMPUTE
    failed = FailedLoads()
    for rid in report.failed_recving:
        slot = s.ids.get(rid)
        if slot is None:
            continue  # gone already: nothing to fail
        r = s.requests[slot]
        if r.status != RequestStatus.WAITING_FOR_REMOTE_KVS or slot in failed.ended:
            continue
        if recompute:
            r.seq.num_computed_tokens = 0
            r.kv_load_failed = True
        else:
            failed.ended.append(slot)
            failed.groups.whole.append(slot)
    if not report.invalid_block_ids:
        return failed
    invalid = set(report.invalid_block_ids)
    # Tokens each request got in this step: its blocks past what it had
    # computed before hold nothing loaded.
    scheduled = [(e.slot, e.num_tokens) for e in step.entries if s.is_live(e)]
    loading = [
        slot
        for slot in s.kv_holding()
        if s.requests[slot].status == RequestStatus.WAITING_FOR_REMOTE_KVS
    ]
    # Each walk claims blocks on its own (vLLM's two calls): a block a
    # loading request claimed is claimed again by the first running one.
    loads = cut_at_invalid_blocks(s, loading, invalid, scheduled)
    runs = cut_at_invalid_blocks(s, list(s.running), invalid, scheduled)
    if recompute:
        for slot in loads.affected:
            s.requests[slot].kv_load_failed = True
        failed.skip.extend(runs.affected)
    else:
        # The blocks cannot be trusted: nobody may hit them again.
        s.kv.uncache_blocks(runs.to_evict)
        failed.groups.loading = list(loads.affected)
        failed.groups.running = list(runs.affected)
        for slot in [*loads.affected, *runs.affected]:
            if slot not in failed.ended:
                failed.ended.append(slot)
        failed.skip = list(failed.ended)
    return failed


def cut_at_invalid_blocks(
    s: Scheduler,
    slots: list[int],
    invalid: set[int],
    scheduled: list[tuple[int, int]],
) -> Cut:
    """Cut each of ``slots`` back to its first invalid block among those it
    had computed before this step, unless a request walked earlier in this
    walk claimed that block (it will compute it again; this one only loses
    this step's tokens)."""
    bs = s.kv.hash_block_size
    cut = Cut()
    marked: set[int] = set()
    for slot in slots:
        r = s.requests[slot]
        in_step = next((n for sl, n in scheduled if sl == slot), 0)
        computed_before = max(r.seq.num_computed_tokens - in_step, 0)
        ids = r.tables[0].block_ids()
        affected = claimed = False
        for idx, block in enumerate(ids[: cdiv(computed_before, bs)]):
            if block not in invalid:
                continue
            affected = True
            if block in marked:
                continue  # an earlier request's to compute
            marked.add(block)
            if claimed:
                continue  # past the cut
            claimed = True
            r.seq.num_computed_tokens = idx * bs
            cut.to_evict.extend(ids[idx:])
        if affected:
            if not claimed:
                r.seq.num_computed_tokens = computed_before
            cut.affected.append(slot)
    return cut
