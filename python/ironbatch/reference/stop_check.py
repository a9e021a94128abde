"""Stop checks after each appended token, in vLLM 0.33's order
(docs/scheduling.md §5.2): EOS, stop tokens, length, then (once
``min_tokens`` are out) a repeating pattern. ``min_tokens`` gates none of
the first three (Q3): the sampler keeps EOS and stop tokens from being
produced too early."""

from __future__ import annotations

from collections.abc import Sequence

from ironbatch.reference.request import REPETITION_DETECTED, Repetition, Request, RequestStatus


def check_stop(r: Request, max_model_len: int) -> bool:
    """Whether ``r`` stops on its last token; sets its status (and
    ``stop_reason`` for a stop token or a repetition) if so."""
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
    # min_tokens gates the repetition check alone (vLLM 0.33's order).
    if r.num_output_tokens < r.stop.min_tokens:
        return False
    if r.stop.repetition is not None:
        if repeats(r.seq.tokens[r.seq.num_prompt_tokens :], r.stop.repetition):
            r.status = RequestStatus.FINISHED_REPETITION
            r.stop_reason = REPETITION_DETECTED
            return True
    return False


def repeats(output: Sequence[int], rules: Repetition) -> bool:
    """Whether ``output`` ends in a pattern of some length in
    ``min_pattern_size..max_pattern_size`` repeated ``min_count`` times, the
    shortest length first; vLLM gives up at the first length whose repeats
    would not fit."""
    min_len = max(rules.min_pattern_size, 1)
    if rules.max_pattern_size <= 0 or rules.min_count < 2 or min_len > rules.max_pattern_size:
        return False
    for length in range(min_len, rules.max_pattern_size + 1):
        if length * rules.min_count > len(output):
            return False
        if all(
            output[-(length * m + n)] == output[-n]
            for n in range(1, length + 1)
            for m in range(1, rules.min_count)
        ):
            return True
    return False
