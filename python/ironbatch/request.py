"""Request: what a client submits to the scheduler."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from ironbatch.lora import LoRARequest, check_lora_request
from ironbatch.multimodal import MultimodalInput, check_mm_features
from ironbatch.prompt_embeds import check_prompt_embeds
from ironbatch.reference.args import u32_list
from ironbatch.reference.limits import utf8_str
from ironbatch.sampling_params import SamplingParams


class Request:
    """A prompt, how to sample it and when to stop. ``arrival_time`` defaults
    to the wall clock; pass it explicitly for reproducible priority order.
    ``structured_output``: its output follows a grammar, as with vLLM's
    structured outputs; the scheduler holds it until
    ``Scheduler.report_grammar`` says the grammar compiled, and
    ``update_from_output(..., accept=...)`` checks its tokens
    (docs/scheduling.md §4.10). ``resumable``: one input chunk of a
    streaming session; its later chunks come as requests with the same id,
    and one that is not resumable ends the input (§4.12). ``lora_request``:
    its LoRA adapter (``ironbatch.LoRARequest`` or vLLM's), counted against
    ``SchedulerConfig.max_loras`` and keying its prefix-cache blocks (§4.14).
    ``mm_features``: its images (audio, video) as ``ironbatch.MultimodalInput``
    (or vLLM's ``MultiModalFeatureSpec``), sorted by position; the scheduler
    needs ``SchedulerConfig.encoder_compute_budget`` and
    ``encoder_cache_size`` to take them (§4.15). ``prompt_embeds``: the
    prompt given as embeddings (a 2-D tensor or array, a row per position of
    ``prompt_token_ids``, which then hold placeholders such as 0); the
    scheduler keys each block's hash by a digest of its rows (§7.4)."""

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        sampling_params: SamplingParams | None = None,
        eos_token_id: int | None = None,
        priority: int = 0,
        arrival_time: float | None = None,
        cache_salt: str | None = None,
        structured_output: bool = False,
        resumable: bool = False,
        lora_request: LoRARequest | Any = None,
        mm_features: Sequence[MultimodalInput | Any] | None = None,
        prompt_embeds: Any = None,
    ) -> None:
        self.request_id = utf8_str("request_id", request_id)
        self.prompt_token_ids = u32_list("prompt_token_ids", prompt_token_ids)
        if not self.prompt_token_ids:
            raise ValueError(f"prompt_token_ids of request {request_id!r} must not be empty")
        self.sampling_params = sampling_params if sampling_params is not None else SamplingParams()
        if not isinstance(self.sampling_params, SamplingParams):
            raise TypeError(
                f"sampling_params must be a SamplingParams, got "
                f"{type(self.sampling_params).__name__}"
            )
        if eos_token_id is not None:
            eos_token_id = u32_list("eos_token_id", [eos_token_id])[0]
        self.eos_token_id = eos_token_id
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise TypeError(f"priority must be an int, got {type(priority).__name__}")
        if not -(2**63) <= priority < 2**63:
            raise ValueError(f"priority = {priority} is outside the 64-bit range")
        self.priority = priority
        if arrival_time is None:
            arrival_time = time.time()
        if isinstance(arrival_time, bool) or not isinstance(arrival_time, (int, float)):
            raise TypeError(f"arrival_time must be a float, got {type(arrival_time).__name__}")
        if arrival_time != arrival_time:
            raise ValueError("arrival_time must not be NaN")
        self.arrival_time = float(arrival_time)
        self.cache_salt = None if cache_salt is None else utf8_str("cache_salt", cache_salt)
        if not isinstance(structured_output, bool):
            raise TypeError(
                f"structured_output must be a bool, got {type(structured_output).__name__}"
            )
        self.structured_output = structured_output
        if not isinstance(resumable, bool):
            raise TypeError(f"resumable must be a bool, got {type(resumable).__name__}")
        self.resumable = resumable
        if lora_request is not None:
            check_lora_request(lora_request)
        self.lora_request = lora_request
        self.mm_features = [] if mm_features is None else check_mm_features(mm_features)
        if prompt_embeds is not None:
            check_prompt_embeds(prompt_embeds, len(self.prompt_token_ids))
        self.prompt_embeds = prompt_embeds

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, prompt_tokens={len(self.prompt_token_ids)}, "
            f"priority={self.priority}, arrival_time={self.arrival_time})"
        )
