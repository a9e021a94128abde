"""What ``update_from_output`` returns: each request's ``EngineCoreOutput``
(the core made most of them; the ones that carry more than tokens are
completed here), errors for refused requests and failed grammars, grouped
by client as vLLM's ``EngineCoreOutputs``, with the finished ids and the
step's ``SchedulerStats``. The pieces built the same way everywhere are in
``engine_outputs.py``.

The functions take the drop-in ``Scheduler`` and share its state (its
mirror of vLLM's requests, the grammar hand-off, the refused requests)."""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Any

from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs
from vllm.v1.spec_decode.metrics import SpecDecodingStats

from ironbatch.vllm.engine_outputs import FINISHED, attach_logprobs, error_output
from ironbatch.vllm.sessions import end_turn

if TYPE_CHECKING:
    from ironbatch.vllm.scheduler import Scheduler


def outputs_by_client(s: Scheduler, update: Any, mro: Any) -> dict[int, list[EngineCoreOutput]]:
    """One EngineCoreOutput per request that got tokens, by client. Most
    carry only tokens (the core made those); a finish, events, prefill
    stats and the like (``RequestMirror.full_output_slots``) or logprobs
    fill in the rest."""
    mirror = s._mirror
    only_client = mirror.only_client()  # before finishes forget requests
    outs = update.outputs
    finished = update.finished
    if s._aux is not None:  # (before finishes forget requests)
        by_slot = mirror.by_slot
        s._aux.attach(outs, [by_slot[slot] for slot in update.slots], mro)
    full = mirror.full_output_slots
    logprobs = bool(mro.logprobs or mro.prompt_logprobs_dict or mro.prompt_token_id_logprobs_dict)
    if full or finished or logprobs:
        record_slots = update.slots
        ends = {f.record: f for f in finished}
        if ends:
            full = full.union(record_slots[record] for record in ends)
        cached_tokens = update.cached_tokens
        completed = range(len(outs)) if logprobs else update.records_of(list(full))
        for k in completed:
            _complete(s, outs[k], record_slots[k], ends.get(k), cached_tokens[k], mro, logprobs)
    masks = mro.sampling_masks if s.return_sampling_mask else None
    if masks is not None:
        # Each sample's token support (--return-sampling-mask), for the
        # tokens the output keeps.
        index = mro.req_id_to_index
        for out in outs:
            if out.new_token_ids:
                out.new_sampling_mask = masks.slice_request(
                    index[out.request_id], len(out.new_token_ids)
                )
    outputs: dict[int, list[EngineCoreOutput]] = defaultdict(list)
    if only_client is not None:
        if outs:
            outputs[only_client] = outs  # one client: the usual front end
    else:
        clients = mirror.client_of_slot
        for slot, out in zip(update.slots, outs, strict=True):
            outputs[clients[slot]].append(out)
    return outputs


def attach_pooler_outputs(update: Any, mro: Any) -> None:
    """A pooling runner's results on their outputs: each record is a
    request whose pooled result arrived (and which finished with it)."""
    pooler_output = mro.pooler_output
    index = mro.req_id_to_index
    for out, rid in zip(update.outputs, update.req_ids, strict=True):
        out.pooling_output = pooler_output[index[rid]]


def _complete(
    s: Scheduler,
    out: EngineCoreOutput,
    slot: int,
    end: Any,
    cached_tokens: int,
    mro: Any,
    logprobs: bool,
) -> None:
    """The rest of an output: finish, events, prefill stats, logprobs.
    ``end`` is the core's FinishedRequest when the request finished."""
    r = s._mirror.by_slot[slot]
    assert r is not None
    if end is not None:
        r.stop_reason = end.stop_reason
        s._mirror.finish_tokens(r, end)
        status, out.finish_reason = FINISHED[end.finish_reason]
        out.stop_reason = r.stop_reason
        out.spec_decode_metrics = r.spec_decode_metrics  # its acceptance, this step's too
        if end.session_continues:
            end_turn(s, r, slot)
        else:
            if r.resumable and r.streaming_queue:
                r.streaming_queue.popleft()  # the end of its input, taken
            r.status, r.num_computed_tokens = status, end.num_computed_tokens
            if s._bridge is not None:
                out.kv_transfer_params = s._bridge.transfer_params.pop(r.request_id, None)
            if s._ec_bridge is not None:
                out.ec_transfer_params = s._ec_bridge.transfer_params.pop(r.request_id, None)
            s._forget(r)
    if r.prefill_stats is not None:
        out.prefill_stats, r.prefill_stats = r.prefill_stats, None
        out.prefill_stats.finalize(cached_tokens)
        params = out.kv_transfer_params
        if params is not None and params.get("do_remote_prefill"):
            # The prefill side's cache hits, for the decode side to report.
            params["remote_prefill_cached_tokens"] = out.prefill_stats.num_cached_tokens
    if r.events:
        out.events = r.take_events()
    if r.trace_headers is not None:
        out.trace_headers = r.trace_headers
    if r.num_nans_in_logits:
        out.num_nans_in_logits = r.num_nans_in_logits
    if r.stop_reason is not None:  # a session's: sticky across its turns
        out.stop_reason = r.stop_reason
    quiet = r.trace_headers is None and not r.num_nans_in_logits and r.stop_reason is None
    if end is None and quiet:
        s._mirror.full_output_slots.discard(slot)
    if logprobs:
        attach_logprobs(out, r, mro, len(out.new_token_ids))


def report_rejected(s: Scheduler, outputs: dict[int, list[EngineCoreOutput]]) -> None:
    """The error outputs of the requests ``add_request`` refused, each its
    request's only output."""
    for r, error in s._rejected:
        outputs[r.client_index].append(error_output(r, error))
    s._rejected.clear()


def engine_core_outputs(
    s: Scheduler,
    outputs: dict[int, list[EngineCoreOutput]],
    spec_decoding_stats: SpecDecodingStats | None,
    cudagraph_stats: Any,
    kv_connector_stats: Any = None,
    ec_connector_stats: Any = None,
    perf_stats: Any = None,
) -> dict[int, EngineCoreOutputs]:
    """The step's outputs as vLLM's ``EngineCoreOutputs`` per client, with
    the ids finished since the last step and the step's stats."""
    result = {client: EngineCoreOutputs(outputs=outs) for client, outs in outputs.items()}
    finished = s.finished_req_ids_dict
    if finished:
        for client, ids in finished.items():
            if (eco := result.get(client)) is not None:
                eco.finished_requests = ids
            else:
                result[client] = EngineCoreOutputs(finished_requests=ids)
        finished.clear()
    stats = s.make_stats(
        spec_decoding_stats=spec_decoding_stats,
        kv_connector_stats=kv_connector_stats,
        cudagraph_stats=cudagraph_stats,
        perf_stats=perf_stats,
        ec_connector_stats=ec_connector_stats,
    )
    if stats is not None:
        # Stats go to one front-end only, even in a step without outputs.
        if (eco := next(iter(result.values()), None)) is None:
            result[0] = eco = EngineCoreOutputs()
        eco.scheduler_stats = stats
    return result
