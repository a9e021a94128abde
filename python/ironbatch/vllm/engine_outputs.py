"""The pieces of vLLM's ``EngineCoreOutputs`` the drop-in builds the same
way wherever they come from: finish reasons, error outputs, logprobs passed
through, and the step's ``SchedulerStats``."""

from __future__ import annotations

from typing import Any

from vllm.outputs import RequestError
from vllm.v1.engine import EngineCoreOutput, FinishReason
from vllm.v1.metrics.stats import KV_FETCH_STAGES, PrefixCacheStats, SchedulerStats
from vllm.v1.request import Request, RequestStatus

# The core's finish reason -> vLLM's status and reason.
FINISHED = {
    "stop": (RequestStatus.FINISHED_STOPPED, FinishReason.STOP),
    "length": (RequestStatus.FINISHED_LENGTH_CAPPED, FinishReason.LENGTH),
    "abort": (RequestStatus.FINISHED_ABORTED, FinishReason.ABORT),
    "error": (RequestStatus.FINISHED_ERROR, FinishReason.ERROR),
    "repetition": (RequestStatus.FINISHED_REPETITION, FinishReason.REPETITION),
}


def error_output(r: Request, error: RequestError | None) -> EngineCoreOutput:
    """The one output of a request ended with an error and no tokens (a
    refused request, a grammar that failed to compile)."""
    return EngineCoreOutput(
        request_id=r.request_id,
        new_token_ids=[],
        finish_reason=FinishReason.ERROR,
        events=r.take_events(),
        trace_headers=r.trace_headers,
        error=error,
    )


def attach_logprobs(out: EngineCoreOutput, r: Request, mro: Any, n: int) -> None:
    """Pass the model runner's logprobs for ``r``'s ``n`` new tokens through,
    as vLLM does."""
    rid = r.request_id
    if r.sampling_params.num_logprobs is not None and mro.logprobs:
        out.new_logprobs = mro.logprobs.slice_request(mro.req_id_to_index[rid], n)
    out.new_prompt_logprobs_tensors = mro.prompt_logprobs_dict.get(rid)
    out.prompt_token_id_logprobs = mro.prompt_token_id_logprobs_dict.get(rid)


def scheduler_stats(
    core: Any,
    kv_cache_eviction_events: list[Any],
    spec_decoding_stats: Any,
    kv_connector_stats: Any,
    cudagraph_stats: Any,
    perf_stats: Any,
) -> SchedulerStats:
    """vLLM's SchedulerStats from the core's (``_core.SchedulerStats``)."""
    prefix = core.prefix_cache_stats
    return SchedulerStats(
        num_running_reqs=core.num_running_reqs,
        num_waiting_reqs=core.num_waiting_reqs,
        num_skipped_waiting_reqs=core.num_skipped_waiting_reqs,
        num_kv_fetch_reqs_by_stage=dict.fromkeys(KV_FETCH_STAGES, 0),
        kv_cache_usage=core.kv_cache_usage,
        kv_cache_eviction_events=kv_cache_eviction_events,
        prefix_cache_stats=PrefixCacheStats(
            reset=prefix.reset,
            requests=prefix.requests,
            queries=prefix.queries,
            hits=prefix.hits,
            preempted_requests=prefix.preempted_requests,
            preempted_queries=prefix.preempted_queries,
            preempted_hits=prefix.preempted_hits,
        ),
        spec_decoding_stats=spec_decoding_stats,
        kv_connector_stats=kv_connector_stats.to_dict() if kv_connector_stats else None,
        cudagraph_stats=cudagraph_stats,
        perf_stats=perf_stats,
    )
