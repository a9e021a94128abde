"""The pieces of vLLM's ``EngineCoreOutputs`` the drop-in builds the same
way wherever they come from: finish reasons, error outputs and logprobs
passed through (the core makes the step's ``SchedulerStats``:
``_core.VllmObjects.scheduler_stats``)."""

from __future__ import annotations

from typing import Any

from vllm.outputs import RequestError
from vllm.v1.engine import EngineCoreOutput, FinishReason
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
