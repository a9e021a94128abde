"""``ironbatch.vllm.Scheduler``: vLLM 0.33's scheduler interface on the Rust
core, for ``--scheduler-cls ironbatch.vllm.Scheduler``.

vLLM's EngineCore constructs it like its own scheduler and hands it vLLM
``Request`` objects; it returns vLLM's own ``SchedulerOutput`` and
``EngineCoreOutputs``. The decisions (tokens per request, preemption
victims, prefix hits, block ids) come from the core, which makes vLLM's.
A configuration the core does not cover yet is handed, whole and at
construction, to vLLM's own scheduler (see ``support.py``).

What lives where: the core owns the scheduling state (queues, tokens, block
tables, ``num_computed_tokens``, output placeholders). vLLM's ``Request``
objects are written only when something happens to them, or on
``sync_requests()`` (``request_mirror.py``). The core hashes blocks
itself; vLLM's ``Request.block_hashes`` are brought up to date only where
vLLM's hashes are seen (KV-cache events, a streaming session's next chunk).
The SchedulerOutput's request data is built in ``runner_request_data.py``,
the grammar hand-off in ``structured_outputs.py``, a streaming session's
chunks are taken in ``sessions.py``, and ``update_from_output``'s
EngineCoreOutputs are built in ``step_outputs.py`` (their common parts in
``engine_outputs.py``)."""

from __future__ import annotations

import logging
import time
from collections import defaultdict, deque
from collections.abc import Iterable
from typing import Any

from vllm.multimodal import MULTIMODAL_REGISTRY
from vllm.outputs import RequestError
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.interface import PauseState, SchedulerInterface
from vllm.v1.core.sched.output import (
    CachedRequestData,
    GrammarOutput,
    SchedulerOutput,
)
from vllm.v1.core.sched.scheduler import Scheduler as VllmScheduler
from vllm.v1.engine import EngineCoreEventType, EngineCoreOutput, EngineCoreOutputs
from vllm.v1.metrics.perf import ModelMetrics
from vllm.v1.metrics.stats import (
    KV_FETCH_STAGES,
    PrefixCacheStats,
    RequestSpecDecodeMetrics,
    SchedulerStats,
)
from vllm.v1.outputs import DraftTokenIds
from vllm.v1.request import Request, RequestStatus

from ironbatch import _core
from ironbatch._core import VllmStepRows as StepRows
from ironbatch.reference.request import FINISHED_STATUS_NAMES
from ironbatch.vllm.aux_outputs import AuxOutputs
from ironbatch.vllm.ec_connector import EcConnectorBridge, build_ec_connector, ec_stats
from ironbatch.vllm.encoder_inputs import EncoderInputs, encoder_input_stats
from ironbatch.vllm.kv_cache_view import KVCacheManagerView
from ironbatch.vllm.kv_connector import ConnectorBridge, build_connector, connector_setup
from ironbatch.vllm.kv_events import KvEvents
from ironbatch.vllm.kv_metrics import KvMetrics
from ironbatch.vllm.kv_transfer import connector_step, kv_transfers_done
from ironbatch.vllm.request_errors import (
    give_back_step_errors,
    report_errors,
    take_step_errors,
)
from ironbatch.vllm.request_mirror import RequestMirror
from ironbatch.vllm.runner_request_data import RunnerRequestData
from ironbatch.vllm.sessions import add_session_chunk
from ironbatch.vllm.settings import core_scheduler, drafts_by_batch_size
from ironbatch.vllm.speculation import Speculation, observe_per_request
from ironbatch.vllm.step_outputs import (
    attach_pooler_outputs,
    engine_core_outputs,
    outputs_by_client,
    report_rejected,
)
from ironbatch.vllm.structured_outputs import StructuredOutputs
from ironbatch.vllm.support import unsupported_config, unsupported_request

logger = logging.getLogger("ironbatch.vllm")


class Scheduler(SchedulerInterface):
    """vLLM's V1 scheduler, decided by ironbatch's Rust core."""

    def __new__(
        cls,
        vllm_config: Any,
        kv_cache_config: Any,
        structured_output_manager: Any,
        block_size: int,
        hash_block_size: int | None = None,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        why = unsupported_config(vllm_config, kv_cache_config, block_size, hash_block_size)
        if why is None:
            return super().__new__(cls)
        fallback = (
            AsyncScheduler if vllm_config.scheduler_config.async_scheduling else VllmScheduler
        )
        logger.warning(
            "ironbatch.vllm.Scheduler does not support %s yet; this engine uses vLLM's %s",
            why,
            fallback.__name__,
        )
        # vLLM's schedulers take the same arguments in the same order. The
        # result is not an instance of cls, so Python skips __init__ on it.
        return fallback(
            vllm_config,
            kv_cache_config,
            structured_output_manager,
            block_size,
            hash_block_size,
            *args,
            **kwargs,
        )

    def __init__(
        self,
        vllm_config: Any,
        kv_cache_config: Any,
        structured_output_manager: Any,
        block_size: int,
        hash_block_size: int | None = None,
        mm_registry: Any = MULTIMODAL_REGISTRY,
        include_finished_set: bool = False,
        log_stats: bool = False,
    ) -> None:
        sc = vllm_config.scheduler_config
        self.vllm_config = vllm_config
        self.scheduler_config = sc
        self.cache_config = vllm_config.cache_config
        self.kv_cache_config = kv_cache_config
        self._num_kv_cache_groups = len(kv_cache_config.kv_cache_groups)
        self.structured_output_manager = structured_output_manager
        self.block_size = block_size
        # What a request's hashes are cut at (groups of different block
        # sizes: their greatest common divisor, docs/scheduling.md §7.16).
        self.hash_block_size = hash_block_size or block_size
        self.log_stats = log_stats
        self.max_model_len: int = vllm_config.model_config.max_model_len
        self.use_v2_model_runner: bool = vllm_config.use_v2_model_runner
        self.use_pp = vllm_config.parallel_config.pipeline_parallel_size > 1
        self.num_spec_tokens: int = vllm_config.num_speculative_tokens
        # An embedding or classification model: results come back pooled.
        self._pooling = vllm_config.model_config.runner_type == "pooling"
        # vLLM's V2 runner skips drafting in a step whose drafts nobody can
        # verify, when its drafter has a forward pass of its own.
        self.can_skip_drafts = bool(vllm_config.num_lookahead_tokens) and self.use_v2_model_runner
        # vLLM's engine checked the cache holds a max_model_len sequence;
        # its scheduler (and so the core) runs with whatever it was given.
        self._core = core_scheduler(vllm_config, kv_cache_config, block_size, mm_registry)
        # What EngineCore reads of vLLM's KV-cache manager (group block sizes).
        dcp = vllm_config.parallel_config.decode_context_parallel_size
        self.kv_cache_manager = KVCacheManagerView(kv_cache_config, dcp, self._core)
        # Unfinished, in arrival order, and finished ones whose blocks a KV
        # transfer still holds (as in vLLM).
        self.requests: dict[str, Request] = {}
        # A KV connector (--kv-transfer-config), vLLM's own object, called by
        # the core through the bridge (docs/scheduling.md §4.19).
        self.connector = None
        self._bridge: ConnectorBridge | None = None
        # Requests waiting for their KV whose load was reported done: a
        # waiting pass settles them (their status then changes).
        self._settling: set[str] = set()
        if vllm_config.kv_transfer_config is not None:
            self.connector = build_connector(vllm_config, kv_cache_config)
            self._bridge = ConnectorBridge(self.connector, self.requests, log_stats)
            self._core.set_kv_connector(self._bridge, connector_setup(vllm_config, self.connector))
            self.connector.bind_kv_cache_manager(self.kv_cache_manager)
        # An encoder-cache connector (--ec-transfer-config), vLLM's own
        # object too, called by the core through its bridge (§4.20).
        self.ec_connector = None  # EngineCore reads it
        self._ec_bridge: EcConnectorBridge | None = None
        if vllm_config.ec_transfer_config is not None:
            self.ec_connector = build_ec_connector(vllm_config)
            self._ec_bridge = EcConnectorBridge(self.ec_connector, self.requests)
            self._core.set_ec_connector(self._ec_bridge)
        # KV-cache events for KV-aware routers (--kv-events-config).
        self.kv_events_config = vllm_config.kv_events_config
        self._kv_events = KvEvents(vllm_config, kv_cache_config, self.hash_block_size)
        if self._kv_events.enabled:
            self._core.enable_kv_events()
        # KV-cache residency metrics (--kv-cache-metrics).
        self._kv_metrics = KvMetrics(vllm_config, kv_cache_config.num_blocks)
        if self._kv_metrics.enabled:
            self._core.enable_block_lifecycle_events()
        # Auxiliary outputs (--enable-return-routed-experts): the core caps
        # prefix hits as vLLM's connector does; vLLM's own connector builds
        # the workers' metadata, told of the cache as the core's events
        # replay it.
        self._aux: AuxOutputs | None = None
        if vllm_config.aux_output_config.enabled:
            self._aux = AuxOutputs(
                kv_cache_config,
                dcp,
                self.hash_block_size,
                self._kv_events.cached,
                vllm_config.num_hash_lookahead_tokens,
                self.connector,
            )
            self._core.enable_aux_outputs()
            self._core.enable_kv_events()
            self._core.enable_request_events()
        # The events are followed (their hashes read off vLLM's Requests,
        # whose tokens are then kept current) for publishing or the
        # auxiliary outputs.
        self._follow_kv_events = self._kv_events.enabled or self._aux is not None
        self._take_kv_events = self._follow_kv_events or self._kv_metrics.enabled
        self._mirror = RequestMirror(self._core, log_stats, vllm_config.num_hash_lookahead_tokens)
        self._runner_data = RunnerRequestData(
            self._mirror, self.use_v2_model_runner, vllm_config.model_config.uses_mrope
        )
        # vLLM's per-step objects, made by the core from its step: this
        # engine's classes and the shape of what its model runner is sent.
        self._objects = _core.VllmObjects(
            scheduler_output=SchedulerOutput,
            cached_request_data=CachedRequestData,
            scheduler_stats=SchedulerStats,
            prefix_cache_stats=PrefixCacheStats,
            engine_core_output=EngineCoreOutput,
            kv_fetch_stages=KV_FETCH_STAGES,
            num_kv_cache_groups=self._num_kv_cache_groups,
            model_runner_v2=self.use_v2_model_runner,
            # Synchronous pipeline parallelism sends the first stage its tokens.
            send_token_ids=self.use_pp and not sc.async_scheduling,
            num_speculative_tokens=self.num_spec_tokens,
            can_skip_drafts=self.can_skip_drafts,
        )
        # Steps scheduled and not yet updated: id(output) -> (output, its rows).
        self._in_flight: dict[int, tuple[SchedulerOutput, StepRows]] = {}
        self._reset_preempted: set[str] = set()  # status already mirrored by a reset
        self._has_finished = False  # finished ids wait for the next schedule()
        self._rejected: list[tuple[Request, RequestError]] = []
        # Encoder outputs lost that a refused update took from the connector.
        self._unavailable_held: set[str] = set()
        self._structured = StructuredOutputs(structured_output_manager, self.requests)
        self._speculation = Speculation(self._core, self.requests, self._structured)
        # Images and audio (docs/scheduling.md §4.15): only a model with an
        # encoder pays for their bookkeeping.
        self._multimodal = self._core.has_encoder
        self._encoder = EncoderInputs(
            self._core.core,
            self.requests,
            self.use_v2_model_runner,
            vllm_config.model_config.is_encoder_decoder,
        )
        # Observability options, as vLLM's scheduler keeps them: the step's
        # FLOPs and bytes (--enable-mfu-metrics), the encoder inputs a step
        # runs (--enable-logging-iteration-details), each request's
        # acceptance (--per-request-spec-decode-metrics).
        obs = vllm_config.observability_config
        self._perf_metrics: ModelMetrics | None = None
        if log_stats and obs.enable_mfu_metrics:
            self._perf_metrics = ModelMetrics(vllm_config)
        self._iteration_details = log_stats and obs.enable_logging_iteration_details
        self._spec_metrics_level: str = obs.per_request_spec_decode_metrics
        # Dynamic speculation lengths: the drafts each step's runner proposes,
        # by its batch size (vLLM's lookup, built as vLLM builds it).
        self._drafts_by_batch_size = drafts_by_batch_size(vllm_config)
        # --return-sampling-mask: each output's token support, passed through.
        self.return_sampling_mask: bool = vllm_config.model_config.return_sampling_mask
        self.finished_req_ids_dict: dict[int, set[str]] | None = (
            defaultdict(set) if include_finished_set else None
        )

    # -- requests in and out ------------------------------------------------

    def add_request(self, request: Request) -> None:
        rid = request.request_id
        existing = self.requests.get(rid)
        if existing is not None:
            add_session_chunk(self, existing, request)
            return
        if self.log_stats:
            request.record_event(EngineCoreEventType.QUEUED)
        why = unsupported_request(request)
        if why is not None:
            self._reject(request, f"ironbatch.vllm.Scheduler does not support {why} yet")
            return
        if self.connector is not None:
            # Before the core takes it: a P/D prefill instance may shorten
            # the prompt here and cap its output at one token.
            self.connector.on_new_request(request)
            assert self._bridge is not None
            self._bridge.arrived(request)
        try:
            slot = self._core_add(request)
        except ValueError as e:
            # The core refused it (its fields do not fit together, e.g. an
            # image past its prompt): it alone ends, with the core's reason.
            self._reject(request, str(e))
            return
        if request.resumable:
            request.streaming_queue = deque()  # its chunks not applied yet
        if request.use_structured_output:
            self._structured.track(request)
        self._mirror.add(request, slot)
        self.requests[rid] = request
        if self._spec_metrics_level != "none":
            request.spec_decode_metrics = RequestSpecDecodeMetrics.new(self.num_spec_tokens)

    def _reject(self, request: Request, message: str) -> None:
        """End a request at admission with an error output."""
        request.status = RequestStatus.FINISHED_ERROR
        self._rejected.append((request, RequestError("validation_error", message)))

    def _core_add(self, request: Request) -> int:
        sp = request.sampling_params
        embeds = request.prompt_embeds
        # A prompt given as embeddings: its tokens are vLLM's (0 where an
        # embedding stands), its blocks keyed by their embeddings' digests.
        prompt = (
            request.prompt_token_ids or ()
            if embeds is None
            else request.all_token_ids[: request.num_prompt_tokens]
        )
        # A pooling request has no sampling parameters: nothing to stop on.
        return self._core.add_request(
            request_id=request.request_id,
            prompt_token_ids=prompt,
            max_tokens=request.max_tokens,
            min_tokens=0 if sp is None else sp.min_tokens,
            eos_token_id=None if sp is None else sp.eos_token_id,
            stop_token_ids=() if sp is None else sp.stop_token_ids or (),
            repetition_detection=None if sp is None else sp.repetition_detection,
            priority=request.priority,
            arrival_time=request.arrival_time,
            cache_salt=request.cache_salt,
            skip_reading_prefix_cache=request.skip_reading_prefix_cache,
            structured_output=request.use_structured_output,
            # (vLLM sets the mode only on sampling requests.)
            report_hits=getattr(request, "kv_cache_report_mode", "incremental") == "full",
            resumable=request.resumable,
            lora_request=request.lora_request,
            mm_features=request.mm_features or None,
            prompt_embeds_digests=self._core.digests_of(embeds),
        )

    def has_request(self, request_id: str) -> bool:
        return request_id in self.requests

    def finish_requests(
        self, request_ids: str | Iterable[str] | None, finished_status: RequestStatus
    ) -> list[Request]:
        """End requests from outside (aborts, stop strings); unknown and
        finished ids are ignored. Frees in vLLM's order (a set's, for an
        iterable), which shapes the free queue."""
        if not RequestStatus.is_finished(finished_status):
            raise ValueError(f"finished_status must be a finished status, got {finished_status}")
        if isinstance(request_ids, str):
            ids: Iterable[str] = (request_ids,)
        elif request_ids is None:
            ids = list(self.requests)
        else:
            ids = set(request_ids)
        valid = [
            r for rid in ids if (r := self.requests.get(rid)) is not None and not r.is_finished()
        ]
        if not valid:
            return []
        for r in valid:
            self._mirror.sync(r)
        name = (
            finished_status.name
            if finished_status.name in FINISHED_STATUS_NAMES
            else "FINISHED_ERROR"
        )
        self._core.finish_requests([r.request_id for r in valid], name)
        if self._aux is not None:
            self._drain_kv_events()  # their releases, while their slots are known
        for r in valid:
            r.status = finished_status
            self._forget(r)
        return valid

    def _forget(self, request: Request) -> None:
        rid = request.request_id
        connectors = self._bridge is not None or self._ec_bridge is not None
        if not connectors or not self._core.has_request(rid):
            del self.requests[rid]
        # else a connector holds its blocks: vLLM keeps it until released
        if self._bridge is not None:
            self._bridge.transfer_params.pop(rid, None)  # aborts and errors return none
            self._settling.discard(rid)
        if self._ec_bridge is not None:
            self._ec_bridge.transfer_params.pop(rid, None)
        self._structured.forget(rid)
        self._encoder.forget(rid)
        self._mirror.remove(rid)
        self._has_finished = True
        if self.finished_req_ids_dict is not None:
            self.finished_req_ids_dict[request.client_index].add(rid)

    def sync_requests(self) -> None:
        """Bring every live request's ``output_token_ids``, ``all_token_ids``
        and ``num_computed_tokens`` up to date (steps leave them behind)."""
        for r in self.requests.values():
            if not r.is_finished():
                self._mirror.sync(r)

    # -- schedule() -----------------------------------------------------------

    def schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:
        """One step, as vLLM's SchedulerOutput. ``throttle_prefills``: a
        data-parallel engine's prefill balancing holds prefills this step."""
        if self._structured.compiling:
            self._structured.report_compiled(self._core)
        # The core makes the SchedulerOutput; only what needs vLLM's Requests
        # is added here, and a steady step has none of it.
        rows = self._objects.schedule(self._core.core, throttle_prefills)
        output = rows.output
        self._has_finished = False
        if rows.has_news:
            self._mirror_step(rows, output)
            if rows.new or rows.resumed:
                output.scheduled_new_reqs.extend(self._runner_data.new(rows))
        if self._multimodal:
            self._encoder.mismatch.update(rows.step.encoder_mismatch)
            output.encoder_input_updates = self._encoder.updates(
                output.num_scheduled_tokens,
                output.scheduled_new_reqs,
                output.scheduled_encoder_inputs,
                self._mirror.slot_of,
            )
        if self._drafts_by_batch_size is not None and output.num_scheduled_tokens:
            batch = len(output.num_scheduled_tokens)
            output.num_spec_tokens_to_schedule = self._drafts_by_batch_size[batch]
        if self._iteration_details:
            output.scheduled_encoder_input_stats = encoder_input_stats(
                self.requests, output.scheduled_encoder_inputs
            )
        if not self.use_v2_model_runner:
            self._runner_data.add_unseen_token_ids(rows, output.scheduled_cached_reqs)
        if self._take_kv_events:
            self._drain_kv_events()
        if self._bridge is not None:
            connector_step(self, output, rows.step)
        if self._aux is not None:
            output.aux_output_connector_metadata = self._aux.metadata(
                output, rows.computed, self.requests, self._mirror.sync
            )
        if self.ec_connector is not None:
            output.ec_connector_metadata = self.ec_connector.build_connector_meta(output)
        self._in_flight[id(output)] = (output, rows)
        return output

    def _mirror_step(self, rows: StepRows, output: SchedulerOutput) -> None:
        """Write what happened to vLLM's Requests: preemptions, admissions,
        and the tokens of resumed ones (the runner reinstalls them)."""
        now = time.monotonic()
        step = rows.step
        for rid in step.grammar_released:
            self.requests[rid].status = RequestStatus.WAITING  # then maybe admitted
        for rid in step.grammar_failed:
            self._structured.note_failed(rid)
        self._mirror_preemptions(output.preempted_req_ids, now)
        mirror = self._mirror
        slots, computed = rows.slots, rows.computed
        bridge = self._bridge
        for i in rows.admitted:
            slot = slots[i]
            r = mirror.by_slot[slot]
            split = None if bridge is None else bridge.hit_split.pop(r.request_id, None)
            mirror.admitted(r, slot, computed[i], now, split)
        for i in rows.resumed:
            mirror.sync(mirror.by_slot[slots[i]], computed_too=False)

    def _mirror_preemptions(self, preempted_req_ids: set[str], now: float) -> None:
        for rid in preempted_req_ids:
            r = self.requests.get(rid)
            if r is None or rid in self._reset_preempted:
                continue
            self._mirror.preempted(r, now)
            self._encoder.forget(rid)
        self._reset_preempted.clear()

    # -- update_from_output() -------------------------------------------------

    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_runner_output: Any
    ) -> dict[int, EngineCoreOutputs]:
        """Apply a step's sampled tokens; vLLM's EngineCoreOutputs per client."""
        key = id(scheduler_output)
        entry = self._in_flight.get(key)
        if entry is None or entry[0] is not scheduler_output:
            raise ValueError(
                "scheduler_output was not made by this scheduler's schedule(), "
                "or its output was already applied"
            )
        step = entry[1].step
        mro = model_runner_output
        perf_stats = None
        if self._perf_metrics is not None and self._perf_metrics.is_enabled():
            perf_stats = self._perf_metrics.get_step_perf_stats_per_gpu(scheduler_output)
        # Checked in full before anything changes: a refused output can be
        # retried. Each record's EngineCoreOutput comes made.
        kv_output = mro.kv_connector_output if self._bridge is not None else None
        if self._bridge is not None:
            self._bridge.synced_from.clear()  # (what the update's calls sync)
        # The core ends them with the failed loads, in vLLM's order.
        errors = take_step_errors(self)
        error_ids = errors.request_ids()
        end_order = errors.end_order if error_ids or kv_output else None
        try:
            if self._pooling:
                update = self._objects.update_pooled(
                    self._core.core,
                    step=step,
                    req_id_to_index=mro.req_id_to_index,
                    pooler_output=mro.pooler_output or [],
                    kv_connector_output=kv_output,
                    errors=error_ids,
                    end_order=end_order,
                )
            else:
                update = self._objects.update(
                    self._core.core,
                    step=step,
                    req_id_to_index=mro.req_id_to_index,
                    sampled_token_ids=mro.sampled_token_ids,
                    accept=self._structured.accept if step.has_structured_output_requests else None,
                    kv_connector_output=kv_output,
                    errors=error_ids,
                    end_order=end_order,
                )
        except Exception:
            give_back_step_errors(self, errors)  # refused, nothing changed: the next one ends them
            raise
        if self._pooling:
            attach_pooler_outputs(update, mro)
        del self._in_flight[key]
        if update.spec_decoding_stats is not None and self._spec_metrics_level != "none":
            # Before the outputs are made: a request that finishes leaves then.
            detailed = self._spec_metrics_level == "detailed"
            observe_per_request(self.requests, scheduler_output, step, update, mro, detailed)
        if self._follow_kv_events:
            # Before the finished are forgotten: their stores name their slots.
            self._mirror_tokens(update)
        if self._take_kv_events:
            self._drain_kv_events()
        if out_of_step := self._structured.out_of_step:
            for rid in out_of_step:
                if (r := self.requests.get(rid)) is not None:
                    self._mirror.sync(r, computed_too=False)
            out_of_step.clear()
        if mro.num_nans_in_logits:
            self._note_nans(mro.num_nans_in_logits)
        outputs = outputs_by_client(self, update, mro)
        if update.errored:
            report_errors(self, update, outputs, errors)
        if self._rejected:
            report_rejected(self, outputs)
        kv_connector_stats = ec_connector_stats = None
        if self._bridge is not None:
            kv_connector_stats = kv_transfers_done(self, mro.kv_connector_output)
        if self.ec_connector is not None:
            if mro.ec_connector_output:
                self.ec_connector.update_connector_output(mro.ec_connector_output)
            ec_connector_stats = ec_stats(self.ec_connector, mro.ec_connector_output)
        self._kv_events.publish()
        spec_stats = None
        if self.log_stats and update.spec_decoding_stats is not None:
            spec_stats = Speculation.stats(scheduler_output, step, update)
        return engine_core_outputs(
            self,
            outputs,
            spec_stats,
            mro.cudagraph_stats,
            kv_connector_stats,
            ec_connector_stats,
            perf_stats,
        )

    def _drain_kv_events(self) -> None:
        """Hand the core's KV-cache events to their users: routers' events to
        be published, the cache they replay and the requests' lookups and
        releases to the auxiliary outputs, block lives to the residency
        metrics."""
        events = self._core.take_kv_events()
        if self._follow_kv_events:
            aux = self._aux
            self._kv_events.convert(
                events,
                self._mirror.by_slot.__getitem__,
                None if aux is None else aux.on_request_event,
            )
        if self._kv_metrics.enabled:
            self._kv_metrics.feed(events)

    def _mirror_tokens(self, update: Any) -> None:
        """Append each request's new tokens to its Request (KV events: its
        block hashes come from them). A structured-output request's were
        appended by the grammar check already, and the KV connector's calls
        in the update (a finish) brought some up to date."""
        by_slot = self._mirror.by_slot
        synced = self._bridge.synced_from if self._bridge is not None else {}
        for slot, kept in zip(update.slots, update.new_token_ids, strict=True):
            r = by_slot[slot]
            if r is None or r.use_structured_output:
                continue
            before = synced.get(r.request_id)
            if before is not None:
                kept = kept[r.num_tokens - before :]
            r._all_token_ids.extend(kept)
            r._output_token_ids.extend(kept)

    def _note_nans(self, num_nans_in_logits: dict[str, int]) -> None:
        for rid, n in num_nans_in_logits.items():
            if (r := self.requests.get(rid)) is not None:
                r.num_nans_in_logits = n
                self._mirror.mark_full(r)

    def get_grammar_bitmask(self, scheduler_output: SchedulerOutput) -> GrammarOutput | None:
        """The grammar masks for the structured-output requests that sample
        in this step, in scheduling order; None when there are none. Called
        before the step's output is applied (in async, after the previous
        step's), so requests that finished meanwhile drop out, as in vLLM."""
        if not scheduler_output.has_structured_output_requests:
            return None
        entry = self._in_flight.get(id(scheduler_output))
        if entry is None or entry[0] is not scheduler_output:
            raise ValueError(
                "scheduler_output was not made by this scheduler's schedule(), "
                "or its output was already applied"
            )
        return self._structured.bitmask(entry[1].step, scheduler_output)

    def update_draft_token_ids(self, draft_token_ids: DraftTokenIds) -> None:
        """Synchronous speculative decoding: drafts for the next step."""
        self._speculation.take_drafts(draft_token_ids)

    def update_draft_token_ids_in_output(
        self, draft_token_ids: DraftTokenIds, scheduler_output: SchedulerOutput
    ) -> None:
        """Async speculative decoding: drafts into a step whose masks waited."""
        self._speculation.fill_deferred(draft_token_ids, scheduler_output)

    # -- state ----------------------------------------------------------------

    def get_num_unfinished_requests(self) -> int:
        state = self.pause_state
        if state == PauseState.PAUSED_ALL:
            return 0
        running, waiting = self._core.request_counts()
        if state == PauseState.PAUSED_NEW:
            # Requests holding KV blocks still drain; queued ones stay queued.
            waiting = self._core.num_kv_holding
        # Sessions waiting for input leave the engine idle.
        return running + waiting - self._core.num_waiting_for_input

    def has_finished_requests(self) -> bool:
        if self._has_finished or self._rejected:
            return True
        if self.connector is None:
            return False
        # Finished requests whose blocks a KV transfer holds stay in
        # ``requests``, out of the queues (vLLM's test).
        running, waiting = self._core.request_counts()
        return len(self.requests) > running + waiting

    @property
    def pause_state(self) -> PauseState:
        return PauseState(self._core.pause_state)

    def set_pause_state(self, pause_state: PauseState) -> None:
        self._core.pause_state = int(PauseState(pause_state))

    def reset_prefix_cache(
        self, reset_running_requests: bool = False, reset_connector: bool = False
    ) -> bool:
        running = [r for r in self.requests.values() if r.status == RequestStatus.RUNNING]
        done = self._core.reset_prefix_cache(reset_running_requests)
        failed = reset_running_requests and not done
        if self._take_kv_events:
            self._drain_kv_events()
        if reset_running_requests:
            now = time.monotonic()
            for r in reversed(running):
                self._mirror.preempted(r, now)
                self._encoder.forget(r.request_id)
                self._reset_preempted.add(r.request_id)
            # Preempted and resumed in one step: the runner must reinstall them.
            self._runner_data.prev_step_req_ids.clear()
        if failed:  # streaming sessions between turns hold blocks, as in vLLM
            raise RuntimeError(
                "Failed to reset KV cache even when all the running requests are "
                "preempted and moved to the waiting queue. This is likely due to "
                "the presence of running requests waiting for remote KV transfer, "
                "which is not supported yet."
            )
        if reset_connector:
            done = self.reset_connector_cache() and done
        if done and self._aux is not None:
            self._aux.reset()
        return done

    def reset_connector_cache(self) -> bool:
        """Reset the KV connector's cache (a missing connector counts as
        done, as in vLLM; so does a connector that answers None)."""
        if self.connector is None:
            return True
        if self.connector.reset_cache() is False:
            return False
        if self._bridge is not None and self._bridge.prefix_cache_stats is not None:
            self._bridge.prefix_cache_stats.reset = True
        return True

    def get_kv_connector(self) -> Any:
        return self.connector

    def get_ec_connector(self) -> Any:
        return self.ec_connector

    def has_requests(self) -> bool:
        """Whether the engine must keep stepping: unfinished or finished
        requests to report, or a connector with pushes still running."""
        return (
            self.has_unfinished_requests()
            or self.has_finished_requests()
            or (self.connector is not None and bool(self.connector.has_pending_push_work()))
            or (self.ec_connector is not None and bool(self.ec_connector.has_pending_push_work()))
        )

    def reset_encoder_cache(self) -> None:
        self._core.core.reset_encoder_cache()

    def get_request_counts(self) -> tuple[int, int]:
        return self._core.request_counts()

    def get_kv_cache_usage(self) -> float:
        return self._core.kv_cache_usage

    def make_stats(
        self,
        spec_decoding_stats: Any = None,
        kv_connector_stats: Any = None,
        cudagraph_stats: Any = None,
        perf_stats: Any = None,
        ec_connector_stats: Any = None,
    ) -> SchedulerStats | None:
        if not self.log_stats:
            return None
        stats = self._objects.scheduler_stats(
            self._core.core,
            kv_cache_eviction_events=self._kv_metrics.drain(),
            spec_decoding_stats=spec_decoding_stats,
            kv_connector_stats=kv_connector_stats.to_dict() if kv_connector_stats else None,
            cudagraph_stats=cudagraph_stats,
            perf_stats=perf_stats,
        )
        if self._bridge is not None:
            stats.num_kv_fetch_reqs_by_stage = self._bridge.fetch_counts.copy()
            stats.connector_prefix_cache_stats = self._bridge.take_prefix_cache_stats()
        if ec_connector_stats:
            stats.ec_connector_stats = ec_connector_stats.data
        return stats

    @property
    def kv_event_publisher(self) -> Any:
        """vLLM's publisher for this engine's KV-cache events (a no-op one
        unless ``kv_events_config`` enables them)."""
        return self._kv_events.publisher

    @kv_event_publisher.setter
    def kv_event_publisher(self, publisher: Any) -> None:
        self._kv_events.publisher = publisher

    def get_kv_event_publisher_config(self) -> Any:
        return self.kv_event_publisher.get_publisher_config()

    def shutdown(self) -> None:
        self._in_flight.clear()
        self.kv_event_publisher.shutdown()
        if self.connector is not None:
            self.connector.shutdown()
        if self.ec_connector is not None:
            self.ec_connector.shutdown()
