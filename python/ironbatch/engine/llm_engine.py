"""LLMEngine: requests in, one scheduling step at a time, RequestOutputs out.

One ``step()``: the scheduler decides (Rust core by default), the model
runner computes the scheduled tokens and samples, the scheduler applies the
tokens (stop checks, frees), and the engine detokenizes, applies stop
strings and reports per-request outputs for streaming."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ironbatch.config import CacheConfig, SchedulerConfig
from ironbatch.engine.detokenizer import IncrementalDetokenizer, find_stop
from ironbatch.engine.ngram_proposer import NgramProposer
from ironbatch.engine.runner_output import RunnerOutput
from ironbatch.engine.spec_decoding_stats import SpecDecodingStats
from ironbatch.engine.speculative_config import SpeculativeConfig
from ironbatch.outputs import CompletionOutput, RequestMetrics, RequestOutput
from ironbatch.reference.args import u32_list
from ironbatch.request import Request
from ironbatch.sampling_params import SamplingParams
from ironbatch.scheduler import Scheduler
from ironbatch.scheduler_output import Kind, SchedulerOutput, UpdateOutputs

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
    # True: every step eager. False: decode steps run padded on static
    # buffers, replayed as CUDA graphs on CUDA (captured at start-up).
    enforce_eager: bool = False
    scheduler_backend: str = "rust"
    seed: int = 0
    # The most logprobs a request may ask for per token (-1: the vocabulary).
    max_logprobs: int = 20
    # vLLM's --speculative-config keys for n-gram speculation, e.g.
    # {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4};
    # None: off.
    speculative_config: SpeculativeConfig | Mapping[str, Any] | None = None


@dataclass(frozen=True)
class PreparedRequest:
    """A request that passed every check, not yet queued."""

    request: Request
    prompt: str | None
    params: SamplingParams


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
        # Checked before the model loads: a bad setting fails fast.
        self.speculative_config = SpeculativeConfig.of(args.speculative_config)
        if not isinstance(args.enforce_eager, bool):
            kind = type(args.enforce_eager).__name__
            raise TypeError(f"enforce_eager must be a bool, got {kind}")
        device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.model, self.model_config = load_model(args.model, args.dtype, device)
        self.tokenizer = load_tokenizer(args.model)
        c = self.model_config
        dtype = resolve_dtype(args.dtype, c)
        # None derives it from the model; 0 or any other value
        # SchedulerConfig checks (0 is refused there, with the range).
        max_len = c.max_position_embeddings if args.max_model_len is None else args.max_model_len
        # None derives the count; 0 or any other value CacheConfig checks.
        num_blocks = (
            args.num_blocks
            if args.num_blocks is not None
            else kv_cache.num_blocks_for(self._kv_budget(device), c, args.block_size, dtype)
        )
        chunked = args.enable_chunked_prefill
        batched = (
            args.max_num_batched_tokens
            if args.max_num_batched_tokens is not None
            else max(2048, args.max_num_seqs)
            if chunked
            else max(max_len, args.max_num_seqs)
        )
        self.scheduler = Scheduler(
            SchedulerConfig(
                max_model_len=max_len,
                max_num_seqs=args.max_num_seqs,
                max_num_batched_tokens=batched,
                enable_chunked_prefill=chunked,
                long_prefill_token_threshold=args.long_prefill_token_threshold,
                policy=args.policy,
                num_speculative_tokens=self._num_spec_tokens,
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
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=batched,
            enforce_eager=args.enforce_eager,
            seed=args.seed,
        )
        self.num_blocks, self.max_model_len, self.device = num_blocks, max_len, device
        spec = self.speculative_config
        self.proposer = (
            None
            if spec is None
            else NgramProposer(
                num_speculative_tokens=spec.num_speculative_tokens,
                prompt_lookup_min=spec.prompt_lookup_min,
                prompt_lookup_max=spec.prompt_lookup_max,
                max_model_len=max_len,
            )
        )
        #: Drafts proposed, verified and accepted since the engine started.
        self.spec_decoding_stats = SpecDecodingStats(self._num_spec_tokens)
        self.states: dict[str, _State] = {}
        self._ids = itertools.count()
        # Guards the scheduler and the request states: add_request and
        # abort_request (any thread) take it briefly; step() holds it around
        # schedule() and update_from_output(), not around the forward.
        self._lock = threading.Lock()
        self._stepping = threading.Lock()  # one step at a time
        self.num_preemptions = 0
        # Seconds per phase of step(), summed (the runner keeps its own).
        self.timings = {"schedule": 0.0, "update": 0.0, "outputs": 0.0, "step": 0.0}

    @property
    def _num_spec_tokens(self) -> int:
        spec = self.speculative_config
        return 0 if spec is None else spec.num_speculative_tokens

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
        returns the request id. Safe to call from any thread while another
        thread steps. A refused request (ValueError/TypeError naming the
        field) changes nothing."""
        prepared = self.prepare_request(request_id, prompt, sampling_params, arrival_time, priority)
        with self._lock:
            self._admit(prepared)
        return prepared.request.request_id

    def prepare_request(
        self,
        request_id: str | None,
        prompt: Prompt,
        sampling_params: SamplingParams | None = None,
        arrival_time: float | None = None,
        priority: int = 0,
    ) -> PreparedRequest:
        """Every check ``add_request`` makes that needs no engine state
        (tokens, vocabulary, lengths, sampling parameters), with nothing
        queued: ``LLM.generate`` checks a whole batch before adding any."""
        params = sampling_params or SamplingParams()
        if not isinstance(params, SamplingParams):
            raise TypeError(
                f"sampling_params must be a SamplingParams, got {type(params).__name__}"
            )
        vocab = self.model_config.vocab_size
        params.verify(vocab, self.args.max_logprobs)
        text, ids = self._tokenize(prompt)
        ids = u32_list("prompt_token_ids", ids)
        salt = prompt.get("cache_salt") if isinstance(prompt, Mapping) else None
        bad = next((t for t in ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise ValueError(f"prompt token id {bad} is outside the vocabulary [0, {vocab})")
        if len(ids) >= self.max_model_len:
            raise ValueError(
                f"the prompt has {len(ids)} tokens; it must be shorter than "
                f"max_model_len ({self.max_model_len})"
            )
        eos = self.model_config.eos_token_ids
        stop_ids = list(params.stop_token_ids)
        if not params.ignore_eos:  # extra EOS ids of the generation config stop too
            stop_ids += [e for e in eos[1:] if e not in stop_ids]
        sched_params = SamplingParams(
            max_tokens=params.max_tokens,
            min_tokens=params.min_tokens,
            ignore_eos=params.ignore_eos,
            stop_token_ids=stop_ids,
            repetition_detection=params.repetition_detection,
        )
        if request_id is None:
            request_id = str(next(self._ids))
        request = Request(
            request_id,
            ids,
            sched_params,
            eos_token_id=eos[0] if eos else None,
            priority=priority,
            arrival_time=arrival_time,
            cache_salt=salt,
        )
        return PreparedRequest(request, text, params)

    def _admit(self, prepared: PreparedRequest) -> None:
        """Queue a prepared request (under the lock)."""
        request, params = prepared.request, prepared.params
        self.scheduler.add_request(request)
        self.states[request.request_id] = _State(
            request=request,
            prompt=prepared.prompt,
            params=params,
            detok=IncrementalDetokenizer(self.tokenizer, params.skip_special_tokens),
            metrics=RequestMetrics(arrival_time=request.arrival_time),
            logprobs=[] if params.logprobs is not None else None,
        )

    def add_prepared(self, batch: Sequence[PreparedRequest]) -> None:
        """Queue prepared requests all or none: if one is refused (a live
        duplicate id), those already queued are taken back."""
        with self._lock:
            added: list[str] = []
            try:
                for prepared in batch:
                    self._admit(prepared)
                    added.append(prepared.request.request_id)
            except BaseException:
                self._abort(added)
                raise

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
                return prompt.get("prompt"), prompt["prompt_token_ids"]
            if "prompt" in prompt:
                return self._tokenize(prompt["prompt"])
            raise ValueError("a prompt mapping needs 'prompt_token_ids' or 'prompt'")
        if isinstance(prompt, (bytes, int)) or not isinstance(prompt, Sequence):
            raise TypeError(
                f"a prompt must be text, token ids or a mapping, got {type(prompt).__name__}"
            )
        return None, list(prompt)

    def abort_request(self, request_ids: str | Iterable[str]) -> None:
        """End requests now (unknown and finished ids are ignored); safe to
        call from any thread while another thread steps."""
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        with self._lock:
            self._abort(ids)

    def _abort(self, ids: list[str]) -> None:
        self.scheduler.finish_requests(ids)
        for rid in ids:
            self.states.pop(rid, None)

    def has_unfinished_requests(self) -> bool:
        with self._lock:
            return self.scheduler.has_unfinished_requests()

    def get_num_unfinished_requests(self) -> int:
        with self._lock:
            return self.scheduler.get_num_unfinished_requests()

    # -- one step --------------------------------------------------------------

    def step(self, final_only: bool = False) -> list[RequestOutput]:
        """One scheduling step; outputs for the requests that got tokens
        (streaming), or with ``final_only`` just for those that finished
        (offline generation: no per-step output objects, and text decoded
        once at the end unless stop strings need it earlier).

        Nothing that fails inside a step strands a request. A request whose
        own part fails (its sampler row, its output) finishes alone, with
        finish reason ``"error"`` and the reason in ``RequestOutput.error``.
        If the whole step fails (the forward), every request of the step
        finishes that way and the prefix cache is reset, since the blocks
        the step was writing may hold garbage; the engine keeps serving.
        Only one thread may step at a time."""
        with self._stepping:
            t0 = time.perf_counter()
            with self._lock:
                out = self.scheduler.schedule()
                step_states = [self.states.get(rid) for rid in out.req_ids]
                failed = self._begin_step(out, step_states)
            t1 = time.perf_counter()
            try:
                result = self.runner.execute(out, self.model_config.eos_token_ids)
            except BaseException as e:
                with self._lock:
                    return self._abandon_step(step_states, "the step failed", e)
            t2 = time.perf_counter()
            with self._lock:
                failed.update({i: result.errors[i] for i in result.errors})
                outputs = self._end_requests(
                    [(step_states[i], reason) for i, reason in sorted(failed.items())]
                )
                try:
                    updates = self.scheduler.update_from_output(out, result.for_update(out.req_ids))
                except BaseException as e:
                    return outputs + self._abandon_step(step_states, "applying the step failed", e)
                t3 = time.perf_counter()
                if len(updates):
                    outputs += self._outputs(out, result, updates, step_states, final_only)
                if self.proposer is not None:
                    self.spec_decoding_stats.observe(updates.spec_decoding_stats)
                    self._propose(out, updates, step_states)
            t4 = time.perf_counter()
        tm = self.timings
        tm["schedule"] += t1 - t0
        tm["update"] += t3 - t2
        tm["outputs"] += t4 - t3
        tm["step"] += t4 - t0
        return outputs

    def _begin_step(self, out: SchedulerOutput, step_states: list[_State | None]) -> dict[int, str]:
        """Count preemptions and hand new requests to the runner; returns
        the rows whose request could not begin, with the reason."""
        self.num_preemptions += len(out.preempted_req_ids)
        for rid in out.preempted_req_ids:
            if rid in self.states:
                self.states[rid].metrics.num_preemptions += 1
        failed = {}
        for i in np.flatnonzero(out.kinds == Kind.NEW).tolist():
            st = step_states[i]
            if st is None:
                continue
            try:
                self.runner.begin_request(
                    int(out.req_slots[i]), st.request.prompt_token_ids, st.params
                )
            except Exception as e:  # noqa: BLE001 - this request alone ends
                failed[i] = _reason("the request could not start", e)
        return failed

    def _propose(
        self, out: SchedulerOutput, updates: UpdateOutputs, step_states: list[_State | None]
    ) -> None:
        """Drafts for the next step (vLLM's sync engine hands them over at
        this point), for every request of the step that got tokens and still
        runs, from its known tokens in the runner: those before the step
        plus the ones it emitted."""
        assert self.proposer is not None
        drafts: dict[str, list[int]] = {}
        for row, u in zip(updates.rows.tolist(), updates, strict=True):
            st = step_states[row]
            if u.finish_reason is not None or st is None or self.states.get(u.request_id) is not st:
                continue
            known = int(out.seq_lens[row] - out.num_spec_tokens[row]) + len(u.new_token_ids)
            proposal = self.proposer.propose(
                self.runner.known_tokens(int(out.req_slots[row]), known)
            )
            if len(proposal):
                drafts[u.request_id] = proposal.tolist()
        if drafts:
            stats = self.spec_decoding_stats
            stats.num_proposals += len(drafts)
            stats.num_proposed_tokens += sum(map(len, drafts.values()))
            self.scheduler.update_draft_token_ids(drafts)

    def _abandon_step(
        self, step_states: list[_State | None], what: str, e: BaseException
    ) -> list[RequestOutput]:
        """Fail the step, then re-raise ``e`` if it is no ``Exception`` (an
        interrupt ends the caller's loop too, the engine sound)."""
        outputs = self._fail_step(step_states, _reason(what, e))
        if not isinstance(e, Exception):
            raise e
        return outputs

    def _fail_step(self, step_states: list[_State | None], reason: str) -> list[RequestOutput]:
        """The whole step failed: end its requests, and forget every cached
        block, since blocks the step was writing may hold garbage (running
        requests outside the step are preempted to recompute if need be)."""
        outputs = self._end_requests([(st, reason) for st in step_states])
        if not self.scheduler.reset_prefix_cache():
            self.scheduler.reset_prefix_cache(reset_running_requests=True)
        return outputs

    def _end_requests(self, failures: list[tuple[_State | None, str]]) -> list[RequestOutput]:
        """Finish each request with finish reason "error". A state that is no
        longer the live one for its id (aborted meanwhile, and the id reused)
        is skipped."""
        live = [
            (st, reason)
            for st, reason in failures
            if st is not None and self.states.get(st.request.request_id) is st
        ]
        if not live:
            return []
        self.scheduler.finish_requests([st.request.request_id for st, _ in live], "FINISHED_ERROR")
        now = time.time()
        return [self._error_output(st, reason, now) for st, reason in live]

    def _error_output(self, st: _State, reason: str, now: float) -> RequestOutput:
        self.states.pop(st.request.request_id, None)
        st.metrics.finished_time = now
        return self._request_output(st, "error", None, finished=True, delta="", error=reason)

    def _outputs(
        self,
        out: SchedulerOutput,
        result: RunnerOutput,
        updates: UpdateOutputs,
        step_states: list[_State | None],
        final_only: bool,
    ) -> list[RequestOutput]:
        now = time.time()
        first_entry: dict[int, int] = {}  # row -> its first logprobs entry
        if result.logprobs is not None:
            for j, row in enumerate(result.logprobs[0].tolist()):
                first_entry.setdefault(row, j)
        outputs = []
        for row, u in zip(updates.rows.tolist(), updates, strict=True):
            st = step_states[row]
            if st is None or self.states.get(u.request_id) is not st:
                continue
            try:
                logprobs = []
                if st.logprobs is not None and row in first_entry:
                    assert result.logprobs is not None
                    j = first_entry[row]
                    logprobs = [  # one per token kept (a stop may have trimmed some)
                        self._logprob_entry(result.logprobs[1][j + i], token, st)
                        for i, token in enumerate(u.new_token_ids)
                    ]
                output = self._advance(
                    st, u.new_token_ids, u.finish_reason, u.stop_reason, now, logprobs, final_only
                )
            except Exception as e:  # noqa: BLE001 - this request alone ends
                if self.states.get(u.request_id) is st:
                    outputs += self._end_requests([(st, _reason("its output failed", e))])
                continue
            if output is not None:
                outputs.append(output)
        return outputs

    def _logprob_entry(self, row: Any, chosen: int, st: _State) -> tuple[float, dict[int, float]]:
        """The chosen token's logprob, and the top ``logprobs`` with it."""
        k = st.params.logprobs
        entry = {chosen: float(row[chosen])}
        if k:
            k = row.shape[-1] if k == -1 else min(k, row.shape[-1])
            top = row.topk(k)
            entry.update(zip(top.indices.tolist(), top.values.tolist(), strict=True))
        return float(row[chosen]), entry

    def _advance(
        self,
        st: _State,
        new_ids: list[int],
        finish_reason: str | None,
        stop_reason: int | str | None,
        now: float,
        logprobs: list[tuple[float, dict[int, float]]],
        final_only: bool = False,
    ) -> RequestOutput | None:
        rid = st.request.request_id
        st.output_ids.extend(new_ids)
        if st.metrics.first_token_time is None:
            st.metrics.first_token_time = now
        if st.logprobs is not None:
            for chosen, entry in logprobs:
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
        return self._request_output(
            st, finish_reason, stop_reason, finished=finished, delta=delta, new_ids=new_ids
        )

    def _request_output(
        self,
        st: _State,
        finish_reason: str | None,
        stop_reason: int | str | None,
        *,
        finished: bool,
        delta: str,
        new_ids: list[int] | None = None,
        error: str | None = None,
    ) -> RequestOutput:
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
            st.request.request_id,
            st.prompt,
            st.request.prompt_token_ids,
            [completion],
            finished,
            st.metrics,
            new_token_ids=list(new_ids or []),
            text_delta=delta,
            error=error,
        )


def _reason(what: str, e: BaseException) -> str:
    return f"{what}: {type(e).__name__}: {e}"
