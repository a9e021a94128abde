"""LLM: offline generation over a local Hugging Face model directory."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ironbatch.engine.llm_engine import EngineArgs, LLMEngine, Prompt
from ironbatch.outputs import RequestOutput
from ironbatch.sampling_params import SamplingParams


class LLM:
    """``LLM(model=PATH, **engine settings).generate(prompts, params)``; the
    settings are ``EngineArgs``' (``dtype``, ``block_size``, ``num_blocks``,
    ``max_num_seqs``, ``max_num_batched_tokens``, ``max_model_len``,
    ``enable_prefix_caching``, ``enable_chunked_prefill``, ``policy``,
    ``attention_backend``, ``enforce_eager`` (no padded static decode
    steps, no CUDA graphs), ``speculative_config`` (n-gram speculation, as
    vLLM's ``{"method": "ngram", "num_speculative_tokens": k, ...}``), ...)."""

    def __init__(self, model: str, **kwargs: Any) -> None:
        self.llm_engine = LLMEngine(EngineArgs(model=model, **kwargs))

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """Run every prompt to completion; outputs come in the prompts' order.

        All or nothing at the start: every prompt and parameter is checked
        before the first request is queued, so a bad one raises and leaves
        the engine as it was. A request that fails while running comes back
        with finish reason ``"error"``; if ``generate`` itself is
        interrupted, its unfinished requests are aborted."""
        if isinstance(prompts, (str, Mapping)) or (
            isinstance(prompts, Sequence) and prompts and isinstance(prompts[0], int)
        ):
            prompts = [prompts]  # type: ignore[list-item]
        prompts = list(prompts)  # type: ignore[arg-type]
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params = [sampling_params or SamplingParams()] * len(prompts)
        else:
            params = list(sampling_params)
            if len(params) != len(prompts):
                raise ValueError(f"{len(params)} sampling_params for {len(prompts)} prompts")
        engine = self.llm_engine
        batch = []
        for i, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
            try:
                batch.append(engine.prepare_request(None, prompt, p))
            except (ValueError, TypeError) as e:
                raise type(e)(f"prompt {i}: {e}") from e
        engine.add_prepared(batch)
        order = {prepared.request.request_id: i for i, prepared in enumerate(batch)}
        done: list[RequestOutput | None] = [None] * len(prompts)
        bar = None
        if use_tqdm:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(prompts), desc="Processed prompts", dynamic_ncols=True)
        try:
            while engine.has_unfinished_requests():
                for out in engine.step(final_only=True):
                    if out.finished and out.request_id in order:
                        done[order[out.request_id]] = out
                        if bar is not None:
                            bar.update(1)
        finally:
            if bar is not None:
                bar.close()
            unfinished = [rid for rid, i in order.items() if done[i] is None]
            if unfinished:
                engine.abort_request(unfinished)
        return [d for d in done if d is not None]
