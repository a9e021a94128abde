"""LLMEngine: requests in, one scheduling step at a time, RequestOutputs out.

One ``step()``: the scheduler decides (Rust core by default), the model
runner computes the scheduled tokens and samples, the scheduler applies the
tokens (stop checks, frees), and the engine detokenizes, applies stop
strings and reports per-request outputs for streaming."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ironbatch.config import CacheConfig, SchedulerConfig
from ironbatch.engine.detokenizer import IncrementalDetokenizer, find_stop
from ironbatch.outputs import CompletionOutput, RequestMetrics, RequestOutput
from ironbatch.request import Request
from ironbatch.sampling_params import SamplingParams
from ironbatch.scheduler import Scheduler
from ironbatch.scheduler_output import NEW
from ironbatch.tokens import token_list

DEFAULT_CPU_KV_BYTES = 512 << 20

Prompt = str | Sequence[int] | Mapping[str, Any]


@dataclass
class EngineArgs:
    """The engine's settings, named as vLLM names them."""

    model: str
    dtype: str = "auto"
    device: str | None = None  # default: cuda if available, else cpu
    block_size: int = 16
    num_blocks: int | None = None  # overrides the count derived from memory
    kv_cache_memory_bytes: int | None = None
    gpu_memory_utilization: float = 0.9
    max_num_seqs: int = 128
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0
    policy: str = "fcfs"
    attention_backend: str | None = None  # default: triton on CUDA, torch on CPU
    scheduler_backend: str = "rust"
    seed: int = 0


@dataclass
class _State:
    request: Request
    prompt: str | None
    params: SamplingParams
    detok: IncrementalDetokenizer
    metrics: RequestMetrics
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[int, float]] | None = None
    cumulative_logprob: float = 0.0


class LLMEngine:
    def __init__(self, args: EngineArgs) -> None:
        import torch

        from ironbatch.model import kv_cache
        from ironbatch.model.loader import load_model, load_tokenizer, resolve_dtype
        from ironbatch.model.runner import ModelRunner

        self.args = args
        device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.model, self.model_config = load_model(args.model, args.dtype, device)
        self.tokenizer = load_tokenizer(args.model)
        c = self.model_config
        dtype = resolve_dtype(args.dtype, c)
        max_len = args.max_model_len or c.max_position_embeddings
        num_blocks = args.num_blocks or kv_cache.num_blocks_for(
            self._kv_budget(device), c, args.block_size, dtype
        )
        chunked = args.enable_chunked_prefill
        batched = args.max_num_batched_tokens or (
            max(2048, args.max_num_seqs) if chunked else max(max_len, args.max_num_seqs)
        )
        self.scheduler = Scheduler(
            SchedulerConfig(
                max_model_len=max_len,
                max_num_seqs=args.max_num_seqs,
                max_num_batched_tokens=batched,
                enable_chunked_prefill=chunked,
                long_prefill_token_threshold=args.long_prefill_token_threshold,
                policy=args.policy,
            ),
            CacheConfig(
                num_blocks=num_blocks,
                block_size=args.block_size,
                enable_prefix_caching=args.enable_prefix_caching,
            ),
            backend=args.scheduler_backend,
        )
        backend = args.attention_backend or ("triton" if device.type == "cuda" else "torch")
        self.runner = ModelRunner(
            self.model,
            c,
            num_blocks=num_blocks,
            block_size=args.block_size,
            max_model_len=max_len,
            dtype=dtype,
            device=device,
            attention_backend=backend,
            seed=args.seed,
        )
        self.num_blocks, self.max_model_len, self.device = num_blocks, max_len, device
        self.states: dict[str, _State] = {}
        self._ids = itertools.count()
        self.num_preemptions = 0
        # Seconds per phase of step(), summed (the runner keeps its own).
        self.timings = {"schedule": 0.0, "update": 0.0, "outputs": 0.0, "step": 0.0}

    def _kv_budget(self, device: Any) -> int:
        import torch

        if self.args.kv_cache_memory_bytes is not None:
            return self.args.kv_cache_memory_bytes
        if device.type != "cuda":
            return DEFAULT_CPU_KV_BYTES
        free, total = torch.cuda.mem_get_info(device)
        used = total - free
        # Leave room for activations: a tenth of what the budget allows.
        return int(max(0, total * self.args.gpu_memory_utilization - used) * 0.9)

    # -- requests ------------------------------------------------------------

    def add_request(
        self,
        request_id: str | None,
        prompt: Prompt,
        sampling_params: SamplingParams | None = None,
        arrival_time: float | None = None,
        priority: int = 0,
    ) -> str:
        """Queue a prompt (text, token ids, or a vLLM-style mapping with
        ``prompt_token_ids`` or ``prompt`` and optionally ``cache_salt``);
        returns the request id."""
        params = sampling_params or SamplingParams()
        if not isinstance(params, SamplingParams):
            raise TypeError(
                f"sampling_params must be a SamplingParams, got {type(params).__name__}"
            )
        request_id = str(next(self._ids)) if request_id is None else request_id
        text, ids = self._tokenize(prompt)
        ids = token_list("prompt_token_ids", ids)
        salt = prompt.get("cache_salt") if isinstance(prompt, Mapping) else None
        vocab = self.model_config.vocab_size
        bad = next((t for t in ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise ValueError(f"prompt token id {bad} is outside the vocabulary [0, {vocab})")
        eos = self.model_config.eos_token_ids
        stop_ids = list(params.stop_token_ids)
        if not params.ignore_eos:  # extra EOS ids of the generation config stop too
            stop_ids += [e for e in eos[1:] if e not in stop_ids]
        sched_params = SamplingParams(
            max_tokens=params.max_tokens,
            min_tokens=params.min_tokens,
            ignore_eos=params.ignore_eos,
            stop_token_ids=stop_ids,
        )
        request = Request(
            request_id,
            ids,
            sched_params,
            eos_token_id=eos[0] if eos else None,
            priority=priority,
            arrival_time=arrival_time,
            cache_salt=salt,
        )
        self.scheduler.add_request(request)
        self.states[request_id] = _State(
            request=request,
            prompt=text,
            params=params,
            detok=IncrementalDetokenizer(self.tokenizer, params.skip_special_tokens),
            metrics=RequestMetrics(arrival_time=request.arrival_time),
            logprobs=[] if params.logprobs is not None else None,
        )
        return request_id

    def _tokenize(self, prompt: Prompt) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError(
                    "this model has no tokenizer.json: pass "
                    "{'prompt_token_ids': [...]} instead of text"
                )
            return prompt, self.tokenizer.encode(prompt).ids
        if isinstance(prompt, Mapping):  # vLLM's prompt dicts, with an optional cache_salt
            if "prompt_token_ids" in prompt:
                return prompt.get("prompt"), list(prompt["prompt_token_ids"])
            if "prompt" in prompt:
                return self._tokenize(prompt["prompt"])
            raise ValueError("a prompt mapping needs 'prompt_token_ids' or 'prompt'")
        return None, list(prompt)

    def abort_request(self, request_ids: str | Iterable[str]) -> None:
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        self.scheduler.finish_requests(ids)
        for rid in ids:
            self.states.pop(rid, None)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def get_num_unfinished_requests(self) -> int:
        return self.scheduler.get_num_unfinished_requests()

    # -- one step --------------------------------------------------------------

    def step(self, final_only: bool = False) -> list[RequestOutput]:
        """One scheduling step; outputs for the requests that got tokens
        (streaming), or with ``final_only`` just for those that finished
        (offline generation: no per-step output objects, and text decoded
        once at the end unless stop strings need it earlier)."""
        t0 = time.perf_counter()
        out = self.scheduler.schedule()
        self.num_preemptions += len(out.preempted_req_ids)
        for rid in out.preempted_req_ids:
            if rid in self.states:
                self.states[rid].metrics.num_preemptions += 1
        for i in np.flatnonzero(out.kinds == NEW).tolist():
            st = self.states[out.req_ids[i]]
            self.runner.begin_request(int(out.req_slots[i]), st.request.prompt_token_ids, st.params)
        t1 = time.perf_counter()
        sampled = self.runner.execute(out, self.model_config.eos_token_ids)
        t2 = time.perf_counter()
        updates = self.scheduler.update_from_output(out, sampled)
        t3 = time.perf_counter()
        results = []
        if len(updates):
            now = time.time()
            logprobs = self._step_logprobs(out, sampled)
            for u in updates:
                st = self.states.get(u.request_id)
                if st is None:
                    continue
                output = self._advance(
                    st, u.new_token_ids, u.finish_reason, u.stop_reason, now, logprobs, final_only
                )
                if output is not None:
                    results.append(output)
        t4 = time.perf_counter()
        tm = self.timings
        tm["schedule"] += t1 - t0
        tm["update"] += t3 - t2
        tm["outputs"] += t4 - t3
        tm["step"] += t4 - t0
        return results

    def _step_logprobs(self, out: Any, sampled: np.ndarray) -> dict[str, tuple] | None:
        if self.runner.last_logprobs is None:
            return None
        which, logprobs = self.runner.last_logprobs
        result = {}
        for j, i in enumerate(which.tolist()):
            st = self.states.get(out.req_ids[i])
            if st is None or st.params.logprobs is None:
                continue
            row = logprobs[j]
            top = row.topk(st.params.logprobs) if st.params.logprobs else None
            chosen = int(sampled[i])
            entry = {chosen: float(row[chosen])}
            if top is not None:
                entry.update(zip(top.indices.tolist(), top.values.tolist(), strict=True))
            result[out.req_ids[i]] = (float(row[chosen]), entry)
        return result

    def _advance(
        self,
        st: _State,
        new_ids: list[int],
        finish_reason: str | None,
        stop_reason: int | str | None,
        now: float,
        logprobs: dict[str, tuple] | None,
        final_only: bool = False,
    ) -> RequestOutput | None:
        rid = st.request.request_id
        st.output_ids.extend(new_ids)
        if st.metrics.first_token_time is None:
            st.metrics.first_token_time = now
        if logprobs is not None and rid in logprobs and st.logprobs is not None:
            chosen, entry = logprobs[rid]
            st.cumulative_logprob += chosen
            st.logprobs.append(entry)
        if final_only and finish_reason is None and not st.params.stop:
            return None  # nothing to report, and no stop string to look for yet
        before = len(st.detok.text)
        delta = st.detok.add(st.output_ids, final=finish_reason is not None)
        if st.params.stop and delta:
            found = find_stop(st.detok.text, len(delta), st.params.stop)
            if found is not None:
                s, start = found
                end = start + len(s) if st.params.include_stop_str_in_output else start
                st.detok.text = st.detok.text[:end]
                delta = st.detok.text[before:]
                if finish_reason is None:
                    self.scheduler.finish_requests([rid], "FINISHED_STOPPED")
                finish_reason, stop_reason = "stop", s
        finished = finish_reason is not None
        if finished:
            st.metrics.finished_time = now
            del self.states[rid]
        elif final_only:
            return None
        completion = CompletionOutput(
            index=0,
            text=st.detok.text,
            token_ids=list(st.output_ids),
            cumulative_logprob=st.cumulative_logprob if st.logprobs is not None else None,
            logprobs=st.logprobs,
            finish_reason=finish_reason,
            stop_reason=stop_reason,
        )
        return RequestOutput(
            rid,
            st.prompt,
            st.request.prompt_token_ids,
            [completion],
            finished,
            st.metrics,
            new_token_ids=list(new_ids),
            text_delta=delta,
        )
