"""A trace's rows as a serving workload: the deployment the schedulers run
under, and each row's request (prompt tokens, output length, the step it
arrives before).

Prompts. The traces record lengths only, so prompt tokens are synthesized
from the request's index, deterministically. Like chat sessions sharing
system prompts, three requests in four open with one of three shared
"system prompts" (200, 500 and 1,000 tokens; up to half the prompt), the
rest of the prompt the request's own. Lengths are capped to fit
``max_model_len``: the prompt to ``max_model_len - 1`` tokens, the output to
what is left; a request stops at its generated tokens (``max_tokens`` with
``ignore_eos``), however the runner samples.

Time. The schedulers run no model, so arrivals are mapped to steps by
assuming every step takes ``step_ms`` of model time (30 ms by default, a
mid-size model's mixed step on one GPU; a real engine's steps vary with
their tokens): step ``s`` runs during ``[s, s + 1) × step_ms``, and a request
arriving in ``((s - 1) × step_ms, s × step_ms]`` is added before step ``s``
is scheduled. ``rate_scale`` divides the arrival times (2: twice the rate)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ironbatch.bench.azure_trace import TraceRequest
from ironbatch.bench.scheduler_steps import Workload
from ironbatch.request import Request
from ironbatch.sampling_params import SamplingParams

EOS = 2
SYSTEM_PROMPT_LENGTHS = (200, 500, 1000)
_SYSTEM_VOCAB = 1000  # system prompts' tokens: [3, 1003)
_OWN_VOCAB = 30_000  # requests' own tokens: [1003, 31003), within a 32k vocabulary


@dataclass(frozen=True)
class Deployment(Workload):
    """A serving deployment's scheduler settings, as the bench drivers take
    them (prefix caching and chunked prefill on, FCFS, no long-prefill
    threshold). ``cache_blocks``: the KV cache's blocks, the null block
    included; None sizes it for ``max_num_seqs`` requests at
    ``max_model_len`` each (ample: nothing is preempted)."""

    cache_blocks: int | None = None

    @property
    def num_blocks(self) -> int:
        if self.cache_blocks is not None:
            return self.cache_blocks
        return super().num_blocks


def deployment(
    *,
    max_num_batched_tokens: int = 8192,
    max_num_seqs: int = 256,
    max_model_len: int = 8192,
    block_size: int = 16,
    cache_blocks: int | None = None,
) -> Deployment:
    """The replay's deployment: block 16, max_model_len 8192, 256 sequences,
    an 8,192-token budget by default."""
    return Deployment(
        name="azure-replay",
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        initial_requests=0,
        prompt_len=0,
        max_model_len=max_model_len,
        block_size=block_size,
        cache_blocks=cache_blocks,
    )


def system_prompt(index: int) -> np.ndarray:
    """Shared system prompt ``index``'s tokens."""
    k = np.arange(SYSTEM_PROMPT_LENGTHS[index], dtype=np.int64)
    return 3 + (k * 31 + index * 337) % _SYSTEM_VOCAB


def prompt_tokens(index: int, length: int) -> list[int]:
    """Request ``index``'s prompt of ``length`` tokens: a shared system
    prompt's head (for three indices in four), then tokens of its own
    (distinct first tokens for indices that differ modulo 30,000)."""
    prompt = np.empty(length, dtype=np.int64)
    shared = 0
    if index % 4 != 3:
        system = system_prompt(index % len(SYSTEM_PROMPT_LENGTHS))
        shared = min(len(system), length // 2)
        prompt[:shared] = system[:shared]
    k = np.arange(length - shared, dtype=np.int64)
    prompt[shared:] = 3 + _SYSTEM_VOCAB + (k * 7919 + index * 104729) % _OWN_VOCAB
    return prompt.tolist()


def trace_request(
    index: int, row: TraceRequest, *, max_model_len: int, rate_scale: float
) -> Request:
    """Row ``index`` of a trace as a request ``req-<index>`` (the id form
    the vLLM bench driver reads), its lengths capped to ``max_model_len``."""
    prompt_len = min(max(row.context_tokens, 1), max_model_len - 1)
    max_tokens = max(1, min(row.generated_tokens, max_model_len - prompt_len))
    return Request(
        f"req-{index}",
        prompt_tokens(index, prompt_len),
        SamplingParams(max_tokens=max_tokens, ignore_eos=True),
        eos_token_id=EOS,
        arrival_time=row.arrival_s / rate_scale,
    )


def arrival_steps(rows: Sequence[TraceRequest], *, step_ms: float, rate_scale: float) -> list[int]:
    """The step each row is added before: the first step starting at or
    after its (scaled) arrival."""
    if not step_ms > 0:
        raise ValueError(f"step_ms must be > 0, got {step_ms}")
    if not rate_scale > 0:
        raise ValueError(f"rate_scale must be > 0, got {rate_scale}")
    step_s = step_ms / 1000
    # A hair below the boundary still counts as on it (float noise).
    return [max(0, math.ceil(r.arrival_s / rate_scale / step_s - 1e-9)) for r in rows]
