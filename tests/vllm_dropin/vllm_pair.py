"""vLLM's own scheduler and the drop-in, built from the same VllmConfig and
driven side by side with identical vLLM Requests and model-runner outputs:
every SchedulerOutput, every EngineCoreOutputs and every request's state
must be equal (timestamps aside). Structured-output requests get their
grammars (``fake_grammar``) when the test resolves them, and grammar masks
are taken when vLLM's EngineCore takes them: at once, or (async, a token
still in flight) after the previous step's update."""

from __future__ import annotations

import copy
import dataclasses
import enum
import itertools
import operator
import random
from collections import Counter, deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import numpy as np
import torch
from vllm.distributed.aux_output_connector.connector import AuxRequestOutput
from vllm.distributed.kv_events import BlockStored
from vllm.sampling_params import StructuredOutputsParams
from vllm.v1.core.sched.interface import PauseState
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.engine import FinishReason
from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput, SamplingMaskLists
from vllm.v1.request import Request, RequestStatus

from ironbatch import _core

import fake_grammar
import vllm_setup

# Request fields the drop-in keeps current at every step; tokens and
# num_computed_tokens it brings up to date at admission, resumption, finish
# and abort (the core holds them meanwhile).
CURRENT = ("status", "num_preemptions", "stop_reason", "num_prompt_tokens")


def _new_request_data(d: Any) -> dict[str, Any]:
    fields = {f.name: getattr(d, f.name) for f in dataclasses.fields(d)}
    fields["sampling_params"] = repr(fields["sampling_params"])
    if fields["prefill_token_ids"] is not None:
        fields["prefill_token_ids"] = list(fields["prefill_token_ids"])
    if fields["prompt_embeds"] is not None:  # a tensor: compared by value
        fields["prompt_embeds"] = fields["prompt_embeds"].tolist()
    return fields


def connector_metadata_view(meta: Any) -> Any:
    """A KV connector's metadata, comparable: its fields, recursively, with
    tensors as lists and without the scheduler process's clock readings
    (NIXL stamps send deadlines and its own clock, which two schedulers
    never read alike)."""
    return None if meta is None else plain(meta)


def plain(value: Any) -> Any:
    """Tensors as lists and objects as their fields, recursively."""
    if hasattr(value, "tolist"):  # torch tensors, NumPy arrays
        return value.tolist()
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted(plain(v) for v in value)
    if hasattr(value, "__dict__") and not isinstance(value, type | enum.Enum):
        fields = dict(vars(value))
        fields.pop("scheduler_clock", None)  # the scheduler's clock reading
        if "reqs_to_send" in fields:  # NIXL's send deadlines, by that clock
            fields["reqs_to_send"] = sorted(fields["reqs_to_send"])
        return (type(value).__name__, plain(fields))
    return value


def scheduler_output_view(so: SchedulerOutput) -> dict[str, Any]:
    """Every field of a SchedulerOutput, comparable."""
    view = {f.name: getattr(so, f.name) for f in dataclasses.fields(so)}
    view["kv_connector_metadata"] = connector_metadata_view(so.kv_connector_metadata)
    view["ec_connector_metadata"] = plain(so.ec_connector_metadata)
    view["scheduled_new_reqs"] = [_new_request_data(d) for d in so.scheduled_new_reqs]
    # Its fields hold plain lists, sets and dicts: compared as they are
    # (callers that keep a view copy it).
    view["scheduled_cached_reqs"] = _fields(so.scheduled_cached_reqs)
    view["num_scheduled_tokens"] = list(so.num_scheduled_tokens.items())  # order matters too
    # As a connector iterates them: a set's order follows how it was built
    # (the order its ids were added) where their hashes collide.
    view["finished_req_ids"] = list(so.finished_req_ids)
    preempted = so.preempted_req_ids
    view["preempted_req_ids"] = None if preempted is None else list(preempted)
    return view


def _fields(obj: Any) -> dict[str, Any]:
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}


def runner_output_copy(mro: ModelRunnerOutput) -> ModelRunnerOutput:
    """A copy of a runner's output for one scheduler (vLLM trims a
    request's token list in place at a stop): the token lists copied one
    level down, which is all they hold, every other field set deep-copied."""
    kw: dict[str, Any] = {}
    for f in dataclasses.fields(mro):
        value = getattr(mro, f.name)
        if f.name == "sampled_token_ids":
            kw[f.name] = [list(tokens) for tokens in value]
        else:
            kw[f.name] = value if value is None else copy.deepcopy(value)
    return ModelRunnerOutput(**kw)


def _struct_view(obj: Any, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    return {f: getattr(obj, f) for f in obj.__struct_fields__ if f not in skip}


def engine_outputs_view(outs: dict[int, Any]) -> dict[int, Any]:
    """EngineCoreOutputs per client, comparable: events by type only, no
    timestamps."""
    view: dict[int, Any] = {}
    for client, eco in outs.items():
        v = _struct_view(eco, skip=("timestamp", "outputs", "scheduler_stats"))
        v["outputs"] = []
        for o in eco.outputs:
            ov = _struct_view(o, skip=("events",))
            ov["events"] = None if o.events is None else [e.type for e in o.events]
            if o.pooling_output is not None:  # a tensor: compared by value
                ov["pooling_output"] = o.pooling_output.tolist()
            if o.new_sampling_mask is not None:  # arrays: compared by value
                ov["new_sampling_mask"] = o.new_sampling_mask.to_nested_list()
            if o.routed_experts is not None:  # an array: compared by value
                ov["routed_experts"] = o.routed_experts.tolist()
            v["outputs"].append(ov)
        stats = eco.scheduler_stats
        v["scheduler_stats"] = None if stats is None else dataclasses.asdict(stats)
        if stats is not None:
            # Residency metrics time blocks by the clock: compare what was
            # sampled and evicted, and how often each was reused.
            v["scheduler_stats"]["kv_cache_eviction_events"] = [
                len(e.reuse_gaps_seconds) for e in stats.kv_cache_eviction_events
            ]
            v["scheduler_stats"]["kv_connector_stats"] = _untimed(stats.kv_connector_stats)
            details = v["scheduler_stats"].get("iteration_details")
            if details is not None:  # EngineCore times the step by the clock
                details.pop("elapsed_ms", None)
        view[client] = v
    return view


def _untimed(stats: Any) -> Any:
    """A KV connector's stats with its latencies (series named in seconds,
    read off the clock) as their sample counts."""
    if not isinstance(stats, dict):
        return stats
    out = {}
    for k, v in stats.items():
        if isinstance(v, dict):
            v = _untimed(v)
        elif "seconds" in str(k) and isinstance(v, dict | list):
            v = len(v)
        out[k] = v
    data = out.get("data")
    if isinstance(data, dict):
        out["data"] = {
            name: {key: len(x) if isinstance(x, list) else x for key, x in series.items()}
            if "seconds" in name and isinstance(series, dict)
            else series
            for name, series in data.items()
        }
    return out


_current = operator.attrgetter(*CURRENT)
REQUEST_VIEW = (*CURRENT, "all_token_ids", "num_computed_tokens")


def request_view(r: Request, tokens: list[int] | None = None, computed: int | None = None) -> tuple:
    """A request's state, as the fields ``REQUEST_VIEW`` names (a tuple: the
    check runs for every request after every call); ``tokens`` and
    ``computed`` stand in for its own. Its token list is the request's own,
    not a copy: compare it before the next call."""
    return (
        *_current(r),
        r._all_token_ids if tokens is None else tokens,
        r.num_computed_tokens if computed is None else computed,
    )


def assert_same_request(a: tuple, b: tuple, rid: str) -> None:
    """Two request views equal, or the fields that differ, by name."""
    if a != b:
        named = [(k, x, y) for k, x, y in zip(REQUEST_VIEW, a, b, strict=True) if x != y]
        raise AssertionError(f"{rid}: (field, vLLM, drop-in) {named}")


def core_view(ours: Any, r: Request) -> dict:
    """The drop-in's view of a live request, read from its core (without
    bringing the Request object up to date, which would hide a missing sync);
    a finished one whose blocks a KV transfer holds was brought up to date
    when it finished."""
    if r.is_finished():
        return request_view(r)
    tokens, computed = _core.vllm_request_state(ours._core.core, ours._mirror.slot_of[r.request_id])
    return request_view(r, tokens, computed)


class VllmUnderflow(Exception):
    """vLLM's own scheduler drove a request's computed-token count below
    zero: a running request whose KV load failed (recompute policy) had
    drafts in flight, and their rejection is taken off the count the failure
    reset (vLLM 0.33's update_from_output does not guard it; the core stops
    at zero). Past it the two cannot be compared."""


class VllmPoolDry(Exception):
    """vLLM's own scheduler ran its block pool dry mid-allocation: a fresh
    request's external hit beside cached recurrent states takes a state
    block its count leaves out, so with the pool nearly full vLLM admits it
    and its ``get_new_blocks`` raises (the core counts the block and leaves
    the request waiting: docs/scheduling.md §4.19.2, rule 7). Past it the
    two cannot be compared."""


class _Recorder:
    """A KV-event publisher that keeps the batches."""

    def __init__(self, batches: list[Any]) -> None:
        self.batches = batches

    def publish(self, batch: Any) -> None:
        self.batches.append(batch)

    def shutdown(self) -> None:
        pass

    def get_publisher_config(self) -> None:
        return None


class VllmPair:
    """The two schedulers; ``events`` counts what a workload exercised."""

    def __init__(
        self,
        rng: random.Random,
        model_runner_v1: bool = False,
        reasoning: bool = False,
        **settings: Any,
    ) -> None:
        self.rng = rng
        # Grammars compiled by vLLM's backend over settings["tokenizer"]
        # (else fake ones), and tokens sampled from their masks.
        self.real_grammars = settings.get("tokenizer") is not None
        self.masks: dict[int, tuple[list[str], np.ndarray]] = {}
        self.settings = settings
        # The scheduler's block: decode context parallelism's ranks each hold
        # a part of one.
        self.bs = settings.get("block_size", vllm_setup.DEFAULTS["block_size"]) * settings.get(
            "decode_context_parallel_size", 1
        )
        # The runner returns each sample's token support (--return-sampling-mask).
        self.sampling_masks = settings.get("return_sampling_mask", False)
        # The runner returns each token's routed experts (auxiliary outputs).
        self.routed_experts = settings.get("return_routed_experts", False)
        # Both schedulers read the runner version once, when built; V2 is the
        # default, V1 gets resumptions as cached data with all_token_ids.
        with vllm_setup.env_var("VLLM_USE_V2_MODEL_RUNNER", "0" if model_runner_v1 else None):
            self.vllm = vllm_setup.make_scheduler("vllm", **settings)
            self.ours = vllm_setup.make_scheduler("ironbatch", **settings)
        assert self.vllm.use_v2_model_runner == self.ours.use_v2_model_runner != model_runner_v1
        assert type(self.ours).__module__ == "ironbatch.vllm.scheduler", type(self.ours)
        for s in (self.vllm, self.ours):
            if not self.real_grammars:
                fake_grammar.install(s.structured_output_manager, reasoning)
        # KV-cache events: what each would publish, batch by batch.
        self.published: tuple[list[Any], list[Any]] = ([], [])
        for s, batches in zip((self.vllm, self.ours), self.published, strict=True):
            s.kv_event_publisher = _Recorder(batches)
        # Residency metrics sample blocks at random; here every third block
        # handed out, the same ones on both sides when both hand out alike.
        for collector in (self.vllm.kv_metrics_collector, self.ours._kv_metrics.collector):
            if collector is not None:
                calls = itertools.count()
                collector.should_sample_block = lambda calls=calls: next(calls) % 3 == 0
        # Steps scheduled, not yet updated: (vLLM's output, ours, rows that sample).
        self.in_flight: deque[tuple[SchedulerOutput, SchedulerOutput, list[str]]] = deque()
        self.unmasked: set[int] = set()  # steps whose grammar masks wait (ids of vLLM's output)
        self.made: dict[str, tuple[Request, Request]] = {}  # each request, as each side got it
        self.compiling: dict[str, tuple[Future, Future]] = {}  # grammars not yet resolved
        self.events: Counter = Counter()
        #: The token each sampling request gets (the workload sets it).
        self.choose: Callable[[], int] = lambda: 3
        # Speculative decoding: drafts the proposer hands over, verified by
        # the runner, which accepts a random number of them.
        self.num_spec_tokens: int = self.vllm.vllm_config.num_speculative_tokens
        spec = self.vllm.vllm_config.speculative_config
        # vLLM's GPU n-gram proposer hands over k drafts, -1 where it found none.
        self.padded_drafts = spec is not None and spec.method == "ngram_gpu"
        # EngineCore's block hasher covers this many tokens after each block.
        self.hash_lookahead: int = self.vllm.vllm_config.num_hash_lookahead_tokens
        self.async_scheduling = bool(settings.get("async_scheduling"))
        # An embedding model: outputs are pooled, never sampled.
        self.pooling = settings.get("runner") == "pooling"
        # An encoder-only deployment: nothing comes back but the rows.
        self.encoder_only = bool(settings.get("mm_encoder_only"))
        #: With a KV connector: the worker's report of a step (vLLM's
        #: output), handed to both with that step's runner output.
        self.kv_reports: Callable[[SchedulerOutput], Any] | None = None

    # -- inputs -----------------------------------------------------------------

    def add(self, rid: str, prompt: list[int], grammar: bool = False, **kw: Any) -> None:
        if grammar:
            kw["structured_outputs"] = StructuredOutputsParams(json={"type": "object"})
        pair = tuple(
            vllm_setup.make_request(
                rid,
                prompt,
                block_size=self.bs,
                hash_lookahead_tokens=self.hash_lookahead,
                # Each its own: a KV connector may change its transfer parameters.
                **(
                    {**kw, "extra_args": copy.deepcopy(kw["extra_args"])}
                    if "extra_args" in kw
                    else kw
                ),
            )
            for _ in "ab"
        )
        if self.real_grammars and pair[0].use_structured_output:
            # As EngineCore does, each engine compiles its own; both are
            # waited for here, so both schedulers find them compiled.
            for r, s in zip(pair, (self.vllm, self.ours), strict=True):
                r.sampling_params.structured_outputs._backend = "xgrammar"
                s.structured_output_manager.grammar_init(r)
                compiled = r.structured_output_request._grammar
                if isinstance(compiled, Future):
                    compiled.exception()
        if grammar:  # compiling, as EngineCore's grammar_init leaves it
            futures = (Future(), Future())
            for r, future in zip(pair, futures, strict=True):
                r.structured_output_request.grammar = future
            self.compiling[rid] = futures
        self.made[rid] = pair
        self.vllm.add_request(pair[0])
        self.ours.add_request(pair[1])
        self.check_requests()

    def add_chunk(self, rid: str, prompt: list[int], resumable: bool, **kw: Any) -> None:
        """The next input chunk of the streaming session ``rid`` (or, not
        resumable, the end of its input), to both."""
        for s in (self.vllm, self.ours):
            # Each its own images: taking a chunk moves their positions.
            chunk = vllm_setup.make_request(
                rid,
                prompt,
                block_size=self.bs,
                resumable=resumable,
                hash_lookahead_tokens=self.hash_lookahead,
                **copy.deepcopy(kw),
            )
            s.add_request(chunk)
        self.events["session_chunks"] += 1
        self.check_requests()

    def resolve_grammar(self, rid: str, compiled: bool) -> None:
        """The grammar compile of ``rid`` ends, alike for both sides."""
        for future in self.compiling.pop(rid):
            if compiled:
                future.set_result(fake_grammar.FakeGrammar())
            else:
                future.set_exception(ValueError(f"bad schema for {rid}"))

    def abort(self, rids: list[str]) -> None:
        a = self.vllm.finish_requests(rids, RequestStatus.FINISHED_ABORTED)
        b = self.ours.finish_requests(rids, RequestStatus.FINISHED_ABORTED)
        assert [r.request_id for r in a] == [r.request_id for r in b]
        for ra, rb in zip(a, b, strict=True):  # finished requests are brought up to date
            assert_same_request(request_view(ra), request_view(rb), ra.request_id)
        self.events["aborted"] += len(a)
        self.check_requests()

    def reset_prefix_cache(self, reset_running_requests: bool) -> None:
        # With sessions between turns holding blocks, vLLM raises (its running
        # requests preempted all the same); both must.
        outcomes = []
        for s in (self.vllm, self.ours):
            try:
                outcomes.append(s.reset_prefix_cache(reset_running_requests))
            except RuntimeError:
                outcomes.append("raised")
        assert outcomes[0] == outcomes[1], outcomes
        self.events["reset_raised"] += outcomes[0] == "raised"
        self.events["reset"] += 1
        self.check_requests()

    def set_pause_state(self, state: PauseState) -> None:
        self.vllm.set_pause_state(state)
        self.ours.set_pause_state(state)
        assert self.vllm.pause_state == self.ours.pause_state == state
        self.events["paused"] += state != PauseState.UNPAUSED
        self.check_requests()

    # -- steps --------------------------------------------------------------------

    def schedule(self, throttle_prefills: bool = False) -> None:
        if self.unmasked:
            # EngineCore does not schedule past a step whose mask waits: it
            # applies the previous step's output, then takes the mask.
            self.update_oldest()
        stagger = self.vllm.current_step + 1  # the call about to happen
        self.events["decode_staggered"] += sum(
            stagger < r.next_decode_eligible_step for r in self.vllm.running
        )
        try:
            a = self.vllm.schedule(throttle_prefills)
        except ValueError as e:
            if "free blocks from the pool" in str(e):
                raise VllmPoolDry(str(e)) from e
            raise
        b = self.ours.schedule(throttle_prefills)
        assert scheduler_output_view(a) == scheduler_output_view(b)
        self.events["pp_token_ids"] += bool(a.scheduled_cached_reqs.new_token_ids)
        if a.pending_structured_output_tokens:
            self.unmasked.add(id(a))
            self.events["masks_deferred"] += 1
        else:
            self.take_masks(a, b)
        # vLLM's runner samples for every scheduled request past its prefill.
        sampling = [
            rid for rid in a.num_scheduled_tokens if not self.vllm.requests[rid].is_prefill_chunk
        ]
        self.in_flight.append((a, b, sampling))
        self.events["steps"] += 1
        self.events["preempted"] += len(a.preempted_req_ids or ())
        self.events["prefix_hits"] += sum(1 for d in a.scheduled_new_reqs if d.num_computed_tokens)
        self.events["skip_reading"] += sum(
            1 for d in a.scheduled_new_reqs if self.made[d.req_id][0].skip_reading_prefix_cache
        )
        self.events["skipped"] += len(self.vllm.deferred_waiting)
        self.events["lora_capped"] += self.lora_capped()
        self.events["encoder_inputs"] += sum(map(len, a.scheduled_encoder_inputs.values()))
        self.events["encoder_evicted"] += len(a.free_encoder_mm_hashes)
        self.events["encoder_updates"] += len(a.encoder_input_updates)
        self.events["placeholders"] += sum(
            1 for r in self.vllm.requests.values() if r.num_output_placeholders > 1
        )
        self.check_requests()

    def lora_capped(self) -> int:
        """Waiting requests skipped for an adapter past ``max_loras`` (the
        running batch holds that many others) after a step."""
        lc = self.vllm.vllm_config.lora_config
        if lc is None:
            return 0
        running = {r.lora_request.lora_int_id for r in self.vllm.running if r.lora_request}
        if len(running) < lc.max_loras:
            return 0
        return sum(
            1
            for r in self.vllm.deferred_waiting
            if r.lora_request and r.lora_request.lora_int_id not in running
        )

    def take_masks(self, a: SchedulerOutput, b: SchedulerOutput) -> None:
        """Both schedulers' grammar masks for a step: the same rows, the
        same bits (the fake grammars' states show in them)."""
        if id(a) in self.unmasked and self.num_spec_tokens:
            # EngineCore hands a deferred step its drafts before its masks.
            drafts = self.proposed(list(a.num_scheduled_tokens))
            self.vllm.update_draft_token_ids_in_output(copy.deepcopy(drafts), a)
            self.ours.update_draft_token_ids_in_output(copy.deepcopy(drafts), b)
            assert a.scheduled_spec_decode_tokens == b.scheduled_spec_decode_tokens
            assert a.num_invalid_spec_tokens == b.num_invalid_spec_tokens
            self.events["spec_invalid"] += sum((a.num_invalid_spec_tokens or {}).values())
        self.unmasked.discard(id(a))
        ga, gb = self.vllm.get_grammar_bitmask(a), self.ours.get_grammar_bitmask(b)
        assert (ga is None) == (gb is None)
        if ga is None:
            return
        assert ga.structured_output_request_ids == gb.structured_output_request_ids
        assert np.array_equal(ga.grammar_bitmask, gb.grammar_bitmask)
        assert ga.num_acceptable_drafts == gb.num_acceptable_drafts
        self.events["masked_rows"] += len(ga.structured_output_request_ids)
        if self.real_grammars:  # the model samples from these masks
            self.masks[id(a)] = (ga.structured_output_request_ids, ga.grammar_bitmask.copy())

    def update_oldest(self, choose: Callable[[], int] | None = None) -> None:
        """Apply the oldest step in flight; ``choose()`` (default
        ``self.choose``) gives each sampled token. Masks that waited for
        this output are taken after it."""
        choose = choose or self.choose
        a, b, sampling = self.in_flight.popleft()
        if id(a) in self.unmasked:
            self.take_masks(a, b)
        runner_order = list(a.num_scheduled_tokens)
        self.rng.shuffle(runner_order)  # a persistent batch has its own row order
        if self.pooling or self.encoder_only:
            self.apply_without_tokens(a, b, sampling if self.pooling else [], runner_order)
            return
        tokens = {rid: self.verified(a, rid, choose) for rid in sampling}
        ids, bitmask = self.masks.pop(id(a), ([], None))
        for row, rid in enumerate(ids):
            if rid in tokens:  # a token the grammar allows
                bits = np.unpackbits(bitmask[row].view(np.uint8), bitorder="little")
                tokens[rid] = [self.rng.choice(np.flatnonzero(bits).tolist())]
                self.events["grammar_sampled"] += 1
        mro = ModelRunnerOutput(
            req_ids=runner_order,
            req_id_to_index={rid: i for i, rid in enumerate(runner_order)},
            sampled_token_ids=[tokens.get(rid, []) for rid in runner_order],
        )
        if self.sampling_masks:
            mro.sampling_masks = sampling_masks(mro.sampled_token_ids)
        if self.routed_experts:
            mro.aux_output_connector_output = self.routed_rows(a)
        if self.kv_reports is not None:
            mro.kv_connector_output = self.kv_reports(a)
        # A copy for each: vLLM trims a request's token list in place at a stop.
        oa = self.vllm.update_from_output(a, runner_output_copy(mro))
        for rid in a.num_scheduled_tokens:
            if self.made[rid][0].num_computed_tokens < 0:
                raise VllmUnderflow(rid)
        if mro.kv_connector_output is not None:
            # Its sets copied alike for both: a copy may iterate in another
            # order, and the order transfers are named in is the order they
            # free blocks in.
            mro.kv_connector_output = copy.deepcopy(mro.kv_connector_output)
        ob = self.ours.update_from_output(b, mro)
        va, vb = engine_outputs_view(oa), engine_outputs_view(ob)
        assert va == vb
        if self.num_spec_tokens and not self.async_scheduling:
            # After the output, the proposer's drafts for the next step.
            drafts = self.proposed(runner_order)
            self.vllm.update_draft_token_ids(copy.deepcopy(drafts))
            self.ours.update_draft_token_ids(copy.deepcopy(drafts))
        for eco in oa.values():
            stats = eco.scheduler_stats
            if stats is not None and stats.spec_decoding_stats is not None:
                self.events["spec_verified"] += stats.spec_decoding_stats.num_drafts
        self.events["kv_evictions"] += sum(
            len(eco.scheduler_stats.kv_cache_eviction_events)
            for eco in oa.values()
            if eco.scheduler_stats is not None
        )
        self.check_kv_events()
        for later_a, later_b, _ in self.in_flight:
            if id(later_a) in self.unmasked:
                self.take_masks(later_a, later_b)
        for eco in oa.values():
            for o in eco.outputs:
                if o.finish_reason is not None:
                    self.events["finished"] += 1
                    self.events["repetition"] += o.finish_reason == FinishReason.REPETITION
                    if o.finish_reason == FinishReason.ERROR:
                        self.events["grammar_failed" if o.error else "grammar_rejected"] += 1
                    if o.request_id in self.vllm.requests:  # a session's turn ended
                        self.events["session_turns"] += 1
                        continue
                    ra, rb = self.made[o.request_id]
                    assert_same_request(request_view(ra), request_view(rb), o.request_id)
                r = self.vllm.requests.get(o.request_id)
                # Output of a step that ran before the request was preempted.
                self.events["stale"] += r is not None and r.status == RequestStatus.PREEMPTED
        self.check_requests()

    def routed_rows(self, a: SchedulerOutput) -> dict[str, AuxRequestOutput]:
        """The runner's routed experts for a step: for each scheduled
        request, rows from its first token past what the step computes
        (each row a function of the request and the position)."""
        rows = {}
        for rid in a.num_scheduled_tokens:
            r = self.vllm.requests.get(rid)
            if r is None:  # aborted since
                continue
            # (A request preempted since computes nothing, but its stale
            # output still comes.)
            n = max(r.num_computed_tokens, r.num_tokens) + self.num_spec_tokens + 2
            positions = np.arange(n)
            rows[rid] = AuxRequestOutput(
                token_start=0,
                rows=np.stack([positions % 8, (positions + len(rid)) % 8], axis=1),
            )
        return rows

    def apply_without_tokens(
        self, a: SchedulerOutput, b: SchedulerOutput, pooled: list[str], runner_order: list[str]
    ) -> None:
        """A pooling runner's output: a pooled tensor for each request whose
        prompt the step finished, None for the others (chunks); an
        encoder-only runner's (``pooled`` empty): no token and no pooled
        result for any row (vLLM's ``make_empty_encoder_model_runner_output``)."""
        mro = ModelRunnerOutput(
            req_ids=runner_order,
            req_id_to_index={rid: i for i, rid in enumerate(runner_order)},
            sampled_token_ids=[[] for _ in runner_order] if self.encoder_only else [],
            pooler_output=[
                torch.full((4,), float(i)) if rid in pooled else None
                for i, rid in enumerate(runner_order)
            ],
        )
        if self.kv_reports is not None:
            mro.kv_connector_output = self.kv_reports(a)
        oa = self.vllm.update_from_output(a, runner_output_copy(mro))
        if mro.kv_connector_output is not None:
            # Its sets copied alike for both: a copy may iterate in another
            # order, and the order transfers are named in is the order they
            # free blocks in.
            mro.kv_connector_output = copy.deepcopy(mro.kv_connector_output)
        ob = self.ours.update_from_output(b, mro)
        assert engine_outputs_view(oa) == engine_outputs_view(ob)
        self.check_kv_events()
        for eco in oa.values():
            for o in eco.outputs:
                self.events["pooled"] += o.pooling_output is not None
                self.events["finished"] += o.finish_reason is not None
                ended = o.finish_reason is not None
                self.events["encoder_only_finished"] += self.encoder_only and ended
        self.check_requests()

    def proposed(self, req_ids: list[str]) -> DraftTokenIds:
        """Drafts for ``req_ids`` (some none, some fewer than k), as a
        proposer hands them over."""
        k = self.num_spec_tokens
        drafts = [[self.choose() for _ in range(self.rng.randint(0, k))] for _ in req_ids]
        if self.padded_drafts:
            drafts = [d + [-1] * (k - len(d)) for d in drafts]
            self.events["spec_empty_slots"] += sum(d.count(-1) for d in drafts)
        return DraftTokenIds(req_ids=list(req_ids), draft_token_ids=drafts)

    def verified(self, a: SchedulerOutput, rid: str, choose: Callable[[], int]) -> list[int]:
        """What the runner returns for a sampling request: the drafts it
        accepted (any number; placeholders that pad a synchronous step are
        always rejected) and one token of its own."""
        drafts = a.scheduled_spec_decode_tokens.get(rid, [])
        if -1 in drafts and not self.async_scheduling:
            # Never a -1 (a prefix hit's padded step, a proposer's empty slot).
            accepted = self.rng.randint(0, drafts.index(-1))
        else:
            accepted = self.rng.randint(0, len(drafts))
        self.events["spec_drafts"] += len(drafts)
        self.events["spec_accepted"] += accepted
        return [choose() for _ in range(accepted)] + [choose()]

    def check_kv_events(self) -> None:
        """Both published the same KV-cache events, batch by batch."""
        a, b = self.published
        assert [batch.events for batch in a] == [batch.events for batch in b]
        for batch in a:
            for event in batch.events:
                self.events[f"kv_{type(event).__name__}"] += 1
                if isinstance(event, BlockStored) and event.parent_block_hash is None:
                    self.events["kv_stored_from_block_0"] += 1
        a.clear()
        b.clear()

    # -- state ---------------------------------------------------------------------

    def check_requests(self) -> None:
        a, b = self.vllm, self.ours
        assert list(a.requests) == list(b.requests)
        for rid, r in a.requests.items():
            assert_same_request(request_view(r), core_view(b, b.requests[rid]), rid)
            if r.use_structured_output:  # kept current by the drop-in, for the grammar
                assert list(b.requests[rid].all_token_ids) == list(r.all_token_ids), rid
                so_a, so_b = r.structured_output_request, b.requests[rid].structured_output_request
                assert so_a.reasoning_ended == so_b.reasoning_ended, rid
                self.events["reasoning_ended"] += bool(so_a.reasoning_ended)
        assert a.get_request_counts() == b.get_request_counts()
        assert a.get_num_unfinished_requests() == b.get_num_unfinished_requests()
        assert a.has_finished_requests() == b.has_finished_requests()
        assert a.has_requests() == b.has_requests()
        assert a.get_kv_cache_usage() == b.get_kv_cache_usage()
        if b._multimodal:
            ecm = a.encoder_cache_manager
            if a.is_encoder_decoder:  # EncoderDecoderCacheManager: a slot count
                expected = {
                    "num_free_slots": ecm.num_free_slots,
                    "allocated": list(ecm.allocated),
                    "to_free": list(ecm.to_free),
                }
            else:
                expected = {
                    "num_free_slots": ecm.num_free_slots,
                    "num_freeable_slots": ecm.num_freeable_slots,
                    "cached": {k: sorted(v) for k, v in ecm.cached.items()},
                    "freeable": list(ecm.freeable),
                }
            assert _core.vllm_encoder_cache_state(b._core.core) == expected


def sampling_masks(sampled: list[list[int]]) -> SamplingMaskLists:
    """A runner's sampling masks for ``sampled`` (one row per request, in
    runner order): each sampled position's support, the token and a few
    others fixed by it, as vLLM's CSR lists."""
    token_ids: list[int] = []
    offsets, cu = [0], [0]
    for tokens in sampled:
        for t in tokens:
            token_ids += sorted({t, (7 * t + 1) % 97, (3 * t + 5) % 89})
            offsets.append(len(token_ids))
        cu.append(len(offsets) - 1)
    return SamplingMaskLists(np.array(token_ids, np.int64), np.array(offsets, np.int64), cu)
