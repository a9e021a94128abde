"""CoreScheduler: the one Python wrapper around the Rust core's scheduler.

Both users of the core go through it: ``ironbatch.Scheduler`` (its ``rust``
backend) and the vLLM drop-in (``ironbatch.vllm.Scheduler``). It builds the
core from the API's configurations, calls it with keyword arguments only,
and hands back the core's named types (``_core.Step``, ``_core.StepUpdate``)
and the API's ``SchedulerStats``. What only the drop-in calls (applying a
vLLM ``ModelRunnerOutput``, reading a request back) is in ``_core`` under
``vllm_*`` names and used from ``ironbatch.vllm``. The two calls of every
step are made on the built core itself (``.core``) by the façade's backend
and the drop-in's ``VllmObjects``: a Python frame between them and the
core cost 1-3 µs of a cold step."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ironbatch import _core
from ironbatch.config import CacheConfig, SchedulerConfig
from ironbatch.prompt_embeds import embeds_digests
from ironbatch.reference.attention_group import (
    ChunkedLocal,
    CrossAttention,
    GroupSpec,
    Mamba,
    SlidingWindow,
)
from ironbatch.reference.kv_cache_manager.config import hash_block_size
from ironbatch.reference.kv_connector import KvConnectorSetup
from ironbatch.reference.scheduler_config import settings
from ironbatch.scheduler_stats import SchedulerStats

# end_order(whole, loading, running, requested): the request ids an update
# ends with an error, by source (loads failed whole, loading and running
# requests with an invalid block, the caller's ``errors``), returned in the
# order to end them.
EndOrder = Callable[[list[str], list[str], list[str], list[str]], list[str]]

#: A KV-cache group as the binding takes it: ``(kind, size,
#: admission_cap_blocks, speculative_blocks, checkpoint_alignment)``.
BindingGroup = tuple[str, int, int | None, int, int | None, int | None]


def binding_groups(groups: Sequence[GroupSpec]) -> list[BindingGroup]:
    """Resolved KV-cache groups as the binding takes them."""
    out: list[BindingGroup] = []
    for g in groups:
        cap, own = g.admission_cap_blocks, g.block_size
        k = g.kind
        if isinstance(k, SlidingWindow):
            out.append(("sliding_window", k.window, cap, 0, None, own))
        elif isinstance(k, ChunkedLocal):
            out.append(("chunked_local", k.chunk, cap, 0, None, own))
        elif isinstance(k, CrossAttention):
            out.append(("cross_attention", 0, cap, 0, None, own))
        elif isinstance(k, Mamba):
            alignment = k.checkpoint_alignment
            out.append(("mamba", k.block_size, cap, k.speculative_blocks, alignment, own))
        else:
            out.append(("full", 0, cap, 0, None, own))
    return out


class CoreScheduler:
    """The Rust core's scheduler, built from the API's configurations."""

    def __init__(self, scheduler_config: SchedulerConfig, cache_config: CacheConfig) -> None:
        if cache_config.num_blocks is None:
            raise ValueError("num_blocks must be set to build a scheduler, got None")
        c = settings(scheduler_config, cache_config)  # defaults resolved as the twin does
        self._has_encoder = c.encoder is not None
        # What a prompt's embeddings are digested by: hash block by hash
        # block (the groups' greatest common divisor, docs/scheduling.md §7.16).
        self._hash_block_size = hash_block_size(
            c.kv_cache_groups, c.block_size, c.enable_prefix_caching
        )
        self._hash_lookahead = c.num_hash_lookahead_tokens
        self.core = _core.Scheduler(
            max_num_seqs=c.max_num_seqs,
            max_num_batched_tokens=c.max_num_batched_tokens,
            max_num_scheduled_tokens=c.max_num_scheduled_tokens,
            max_num_active_seqs=c.max_num_active_seqs,
            max_model_len=c.max_model_len,
            enable_chunked_prefill=c.enable_chunked_prefill,
            long_prefill_token_threshold=c.long_prefill_token_threshold,
            long_prefill_token_threshold_adaptive=c.long_prefill_token_threshold_adaptive,
            watermark_blocks=c.watermark_blocks,
            policy=scheduler_config.policy,
            scheduler_reserve_full_isl=c.scheduler_reserve_full_isl,
            async_scheduling=c.async_scheduling,
            prefill_schedule_interval=c.prefill_schedule_interval,
            decode_stagger=c.decode_stagger,
            num_speculative_tokens=c.num_speculative_tokens,
            num_lookahead_tokens=c.num_lookahead_tokens,
            num_hash_lookahead_tokens=c.num_hash_lookahead_tokens,
            drop_eagle_block=c.drop_eagle_block,
            eagle_groups=None if c.eagle_groups is None else list(c.eagle_groups),
            num_draft_slots=c.num_draft_slots,
            drafts_by_batch_size=None
            if c.drafts_by_batch_size is None
            else list(c.drafts_by_batch_size),
            num_blocks=c.num_blocks,
            block_size=c.block_size,
            enable_prefix_caching=c.enable_prefix_caching,
            kv_cache_groups=binding_groups(c.kv_cache_groups),
            sparse_retention=c.sparse_retention,
            retention_interval=c.retention_interval,
            mixed_precision=c.mixed_precision,
            max_loras=c.max_loras,
            encoder_compute_budget=None if c.encoder is None else c.encoder.compute_budget,
            encoder_cache_size=None if c.encoder is None else c.encoder.cache_size,
            disable_chunked_mm_input=c.encoder is not None and c.encoder.disable_chunked_mm_input,
            drafter_read_ahead=c.drafter_read_ahead,
            runner=c.runner.value,
        )

    def add_request(
        self,
        *,
        request_id: str,
        prompt_token_ids: Sequence[int],
        max_tokens: int,
        min_tokens: int,
        eos_token_id: int | None,
        stop_token_ids: Sequence[int],
        repetition_detection: Any,
        priority: int,
        arrival_time: float,
        cache_salt: str | None,
        skip_reading_prefix_cache: bool = False,
        structured_output: bool = False,
        report_hits: bool = False,
        resumable: bool = False,
        lora_request: Any = None,
        mm_features: Any = None,
        prompt_embeds_digests: list[bytes] | None = None,
    ) -> int:
        """Queue a request; returns its slot (its stable row while it
        lives). ``eos_token_id`` is None when there is none or it is
        ignored; ``repetition_detection`` is None or has vLLM's
        ``min_pattern_size``, ``max_pattern_size`` and ``min_count``;
        ``skip_reading_prefix_cache`` admits it without prefix hits;
        ``structured_output`` holds it until ``report_grammar`` says its
        grammar compiled (docs/scheduling.md §4.10); ``report_hits`` logs its
        prefix hits as KV-cache events (vLLM's ``kv_cache_report_mode="full"``);
        ``resumable`` makes it a streaming-input session, whose later chunks
        come under the same id (docs/scheduling.md §4.12); ``lora_request``
        (None, or anything with vLLM's ``LoRARequest`` fields) is its adapter
        (§4.14); ``mm_features`` (None, or items with vLLM's
        ``MultiModalFeatureSpec`` fields) its images (§4.15);
        ``prompt_embeds_digests`` (``digests_of``) its prompt embeddings, one
        digest per block (§7.4)."""
        return self.core.add_request(
            request_id=request_id,
            prompt_token_ids=prompt_token_ids,
            max_tokens=max_tokens,
            min_tokens=min_tokens,
            eos_token_id=eos_token_id,
            stop_token_ids=stop_token_ids,
            repetition_detection=repetition_detection,
            priority=priority,
            arrival_time=arrival_time,
            cache_salt=cache_salt,
            skip_reading_prefix_cache=skip_reading_prefix_cache,
            structured_output=structured_output,
            report_hits=report_hits,
            resumable=resumable,
            lora_request=lora_request,
            mm_features=mm_features,
            prompt_embeds_digests=prompt_embeds_digests,
        )

    def digests_of(self, prompt_embeds: Any) -> list[bytes] | None:
        """The per-block digests ``add_request`` takes for a prompt given as
        embeddings (None for a prompt of tokens)."""
        if prompt_embeds is None:
            return None
        return embeds_digests(prompt_embeds, self._hash_block_size, self._hash_lookahead)

    @property
    def has_encoder(self) -> bool:
        """Whether it schedules multimodal inputs (an encoder budget is set)."""
        return self._has_encoder

    def reset_encoder_cache(self) -> None:
        """Forget every encoder output (after a weight update; §4.15)."""
        self.core.reset_encoder_cache()

    def has_request(self, request_id: str) -> bool:
        """Whether ``request_id`` is a live request."""
        return self.core.has_request(request_id)

    def enable_kv_events(self) -> None:
        """Log KV-cache events from now on (docs/scheduling.md §7.12)."""
        self.core.enable_kv_events()

    def enable_block_lifecycle_events(self) -> None:
        """Log blocks' lives (handed out, hit) from now on, for residency
        metrics (docs/scheduling.md §7.12)."""
        self.core.enable_block_lifecycle_events()

    def enable_request_events(self) -> None:
        """Log each request's prefix lookups and block releases from now on,
        among the KV-cache events (docs/scheduling.md §7.12)."""
        self.core.enable_request_events()

    def enable_aux_outputs(self) -> None:
        """Follow auxiliary outputs (vLLM's ``--enable-return-routed-experts``)
        from now on: a prefix hit, local or a KV connector's, reaches only
        over blocks whose routing the workers hold (docs/scheduling.md
        §7.12)."""
        self.core.enable_aux_outputs()

    def take_boundary_states(self) -> list[tuple[str, int, int, int]]:
        """The cached states offered to the KV connector since last taken,
        as (request id, group, block id, tokens), oldest first (§4.19.2)."""
        return self.core.take_boundary_states()

    def take_kv_events(self) -> list[_core.KvEvent]:
        """The KV-cache events since last taken, oldest first."""
        return self.core.take_kv_events()

    def report_grammar(self, request_id: str, compiled: bool) -> None:
        """A structured-output request's grammar compiled (or failed); it
        counts when a waiting pass next reaches the request."""
        self.core.report_grammar(request_id=request_id, compiled=compiled)

    def update_draft_token_ids(
        self, request_ids: list[str], token_ids: list[int], offsets: list[int]
    ) -> None:
        """Drafts for the requests' next steps: ``request_ids[i]`` gets
        ``token_ids[offsets[i]:offsets[i + 1]]`` (docs/scheduling.md §4.13)."""
        self.core.update_draft_token_ids(
            request_ids=request_ids, token_ids=token_ids, offsets=offsets
        )

    def schedule(self, throttle_prefills: bool = False) -> _core.Step:
        """One step; ``throttle_prefills`` holds prefill work back (a
        data-parallel engine's prefill balancing, docs/scheduling.md §4.11)."""
        return self.core.schedule(throttle_prefills)

    def update_from_output(
        self,
        step: _core.Step,
        token_ids: np.ndarray,
        offsets: np.ndarray | None,
        accept: Callable[[str, list[int], int], bool] | None = None,
        kv_connector_output: Any = None,
        errors: Sequence[str] = (),
        end_order: EndOrder | None = None,
    ) -> _core.StepUpdate:
        """Apply a step's tokens: ragged with ``offsets`` (row ``i`` gets
        ``token_ids[offsets[i]:offsets[i+1]]``), else one per row, -1 for
        none. ``accept(request_id, kept, num_tokens)`` judges each
        structured-output request's kept tokens; False (or an exception)
        ends it with an error. ``kv_connector_output``: the worker's report
        of the step's KV transfers (§4.19). ``errors``: requests to end with
        an error after the output, with those a failed load ends;
        ``end_order`` orders them all."""
        return self.core.update_from_output(
            step=step,
            token_ids=token_ids,
            offsets=offsets,
            accept=accept,
            kv_connector_output=kv_connector_output,
            errors=list(errors),
            end_order=end_order,
        )

    def update_from_pooler_output(
        self,
        step: _core.Step,
        pooled: list[bool],
        kv_connector_output: Any = None,
        errors: Sequence[str] = (),
        end_order: EndOrder | None = None,
    ) -> _core.StepUpdate:
        """Apply a pooling runner's output: ``pooled[i]`` says whether row
        ``i`` got a pooled result, which finishes its request (§4.16);
        ``kv_connector_output``, ``errors`` and ``end_order`` as
        ``update_from_output`` takes them."""
        return self.core.update_from_pooler_output(
            step,
            pooled,
            kv_connector_output=kv_connector_output,
            errors=list(errors),
            end_order=end_order,
        )

    def finish_requests(self, request_ids: Sequence[str], status: str) -> None:
        self.core.finish_requests(request_ids=list(request_ids), status=status)

    def set_kv_connector(self, connector: Any, setup: KvConnectorSetup) -> None:
        """Attach a KV connector's scheduler side (docs/scheduling.md
        §4.19), before any request."""
        self.core.set_kv_connector(
            connector=connector,
            kv_load_failure_policy=setup.load_failure_policy.value,
            defer_block_free=setup.defer_block_free,
            requires_kv_delivery=setup.requires_kv_delivery,
            divergent_hybrid_hits=setup.divergent_hybrid_hits,
        )

    def set_ec_connector(self, connector: Any) -> None:
        """Attach an encoder-cache connector's scheduler side
        (docs/scheduling.md §4.20), before any request."""
        self.core.set_ec_connector(connector=connector)

    def pin_blocks(self, block_ids: Sequence[int]) -> None:
        self.core.pin_blocks(list(block_ids))

    def unpin_blocks(self, block_ids: Sequence[int]) -> None:
        self.core.unpin_blocks(list(block_ids))

    def pin_requests(self) -> _core.PinRequests:
        return self.core.pin_requests()

    def take_pin_errors(self) -> list[str]:
        return self.core.take_pin_errors()

    def reset_prefix_cache(self, reset_running_requests: bool) -> bool:
        return self.core.reset_prefix_cache(reset_running_requests=reset_running_requests)

    def make_stats(self) -> SchedulerStats:
        """Counts and usage; takes the prefix-cache and preemption counters."""
        s = self.make_core_stats()
        return SchedulerStats(
            num_running_reqs=s.num_running_reqs,
            num_waiting_reqs=s.num_waiting_reqs,
            num_skipped_waiting_reqs=s.num_skipped_waiting_reqs,
            kv_cache_usage=s.kv_cache_usage,
            prefix_cache_stats=s.prefix_cache_stats,
            num_preempted_reqs=s.num_preempted_reqs,
        )

    def make_core_stats(self) -> _core.SchedulerStats:
        """``make_stats`` as the core's own type (the same fields), for a
        caller that converts it anyway: the vLLM drop-in, every step."""
        return self.core.make_stats()

    @property
    def num_free_blocks(self) -> int:
        return self.core.num_free_blocks

    @property
    def kv_cache_usage(self) -> float:
        return self.core.kv_cache_usage

    @property
    def pause_state(self) -> int:
        """vLLM's pause state: 0 unpaused, 1 no admissions, 2 nothing scheduled."""
        return self.core.pause_state

    @pause_state.setter
    def pause_state(self, state: int) -> None:
        self.core.pause_state = state

    @property
    def num_waiting_for_input(self) -> int:
        """Streaming sessions waiting for their next input chunk."""
        return self.core.num_waiting_for_input

    @property
    def num_kv_holding(self) -> int:
        """Waiting requests that hold KV blocks (sessions between turns)."""
        return self.core.num_kv_holding

    def request_counts(self) -> tuple[int, int]:
        """(running, waiting) requests."""
        return self.core.get_request_counts()

    def num_unfinished_requests(self) -> int:
        return self.core.get_num_unfinished_requests()

    def debug_state(self) -> dict[str, Any]:
        return self.core.debug_state()
