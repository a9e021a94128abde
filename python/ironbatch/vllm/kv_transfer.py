"""The drop-in's part of a step with a KV connector (docs/scheduling.md
§4.19), around what the core decides: at the end of ``schedule()`` the
requests loading their KV are written back and the connector builds the
step's metadata; in ``update_from_output`` the requests a failed load ended
get their error outputs, the connector takes the worker's report, and
finished requests whose transfers are done leave the request table.

The functions take the drop-in ``Scheduler`` and share its state."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vllm.v1.core.sched.output import KVConnectorBlockState, SchedulerOutput
from vllm.v1.request import RequestStatus

from ironbatch import _core
from ironbatch.vllm.kv_connector import set_tokens

if TYPE_CHECKING:
    from ironbatch.vllm.scheduler import Scheduler


def connector_step(s: Scheduler, output: SchedulerOutput, step: Any) -> None:
    """The end of ``schedule()`` with a connector: vLLM's Requests as vLLM's
    scheduler holds them when it builds the connector's metadata (those
    scheduled with their tokens and the computed count before this step,
    unless the connector reads none of that; those loading as
    ``WAITING_FOR_REMOTE_KVS``), then the metadata."""
    bridge = s._bridge
    assert bridge is not None
    core = s._core.core
    slot_of = s._mirror.slot_of
    scheduled = output.num_scheduled_tokens
    output.has_sync_kv_loads = step.has_sync_kv_loads
    # A loading request changes state only when it starts loading or, its
    # load reported, when a waiting pass settles it.
    started = [rid for rid in bridge.allocated if rid not in scheduled]
    bridge.allocated.clear()
    for rid in [*started, *s._settling]:
        r = s.requests[rid]
        _tail, computed, status = _core.vllm_request_tail(core, slot_of[rid], r.num_tokens)
        r.num_computed_tokens = computed
        if rid not in scheduled:
            r.status = RequestStatus[status]
        if r.status != RequestStatus.WAITING_FOR_REMOTE_KVS:
            s._settling.discard(rid)
    if bridge.refreshes_scheduled:
        for rid, n in scheduled.items():
            r = s.requests[rid]
            tail, computed, _status = _core.vllm_request_tail(core, slot_of[rid], r.num_tokens)
            if tail:
                set_tokens(r, r._all_token_ids + tail)
            else:
                # Tokens appended elsewhere (a grammar's check) leave the
                # hashes of the blocks they fill to be computed.
                r.update_block_hashes()
            r.num_computed_tokens = computed - n
            # Set at admission (an offloading connector stores the blocks a
            # later request can resume from by it).
            r.shared_prefix_boundary = _core.vllm_shared_prefix_boundary(core, slot_of[rid])
        # Finished requests too: their last tokens came without hashes.
        for rid in output.finished_req_ids:
            if (r := s.requests.get(rid)) is not None:
                r.update_block_hashes()
    # The states recurrent groups cached in mode "align", each with its block
    # (a state table is no token range to resolve by position), and their
    # requests among those the connector may take a job for.
    offloads: dict[str, list[tuple[int, int, int]]] = {}
    # (vLLM drains them group by group, each group's in the order cached.)
    offered = sorted(s._core.take_boundary_states(), key=lambda state: state[1])
    for rid, group, block_id, num_tokens in offered:
        offloads.setdefault(rid, []).append((group, block_id, num_tokens))
    output.kv_connector_block_state = KVConnectorBlockState(
        req_ids=set(scheduled) | {rid for rid in offloads if rid in s.requests},
        resolve_block_ids=lambda rid: tuple(_core.vllm_block_ids(core, slot_of[rid])),
        boundary_state_offloads=offloads,
    )
    output.kv_connector_metadata = s.connector.build_connector_meta(output)
    # Connector-only state: never sent to the workers.
    output.kv_connector_block_state = None


def kv_transfers_done(s: Scheduler, kv_connector_output: Any) -> Any:
    """After the step's outputs: the connector takes the worker's report
    (the core settled the transfers it names), finished requests whose
    blocks were released leave the request table, and the connector's KV
    events join the step's. Returns the step's connector stats (the
    worker's with the scheduler side's)."""
    connector = s.connector
    bridge = s._bridge
    assert bridge is not None
    stats = None
    if kv_connector_output:
        connector.update_connector_output(kv_connector_output)
        received = kv_connector_output.finished_recving or set()
        for rid in received:
            r = s.requests.get(rid)
            if r is not None and not r.is_finished():
                bridge.load_done(rid)
                s._settling.add(rid)
        for rid in received | (kv_connector_output.finished_sending or set()):
            r = s.requests.get(rid)
            if r is not None and r.is_finished() and not s._core.has_request(rid):
                del s.requests[rid]
        stats = kv_connector_output.kv_connector_stats
    scheduler_stats = connector.get_kv_connector_stats()
    if scheduler_stats is not None and not scheduler_stats.is_empty():
        stats = scheduler_stats if stats is None else stats.aggregate(scheduler_stats)
    s._kv_events.add_connector_events(connector.take_events())
    return stats
