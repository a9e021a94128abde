"""Stop checks after each appended token, in vLLM 0.33's order
(docs/scheduling.md §5.2). ``min_tokens`` gates none of them (Q3): the
sampler keeps EOS and stop tokens from being produced too early."""

from __future__ import annotations

from ironbatch.reference.request import Request, RequestStatus


def check_stop(r: Request, max_model_len: int) -> bool:
    """Whether ``r`` stops on its last token; sets its status (and
    ``stop_reason`` for a stop token) if so."""
    last = r.seq.tokens[-1]
    if r.stop.eos_token_id is not None and last == r.stop.eos_token_id:
        r.status = RequestStatus.FINISHED_STOPPED
        return True
    if last in r.stop.stop_token_ids:
        r.status = RequestStatus.FINISHED_STOPPED
        r.stop_reason = last
        return True
    if r.num_tokens >= max_model_len or r.num_output_tokens >= r.stop.max_tokens:
        r.status = RequestStatus.FINISHED_LENGTH_CAPPED
        return True
    return False
