"""Type stubs for ironbatch's Rust extension module (rust/src/python/)."""

from collections.abc import Callable, Iterable, Sequence
from typing import Any, SupportsIndex

import numpy as np
from numpy.typing import NDArray

__version__: str
#: The largest size each field accepts (rust/src/limits.rs).
LIMITS: dict[str, int]
#: The step's column names and NumPy dtypes, in order (rust/src/step.rs).
STEP_COLUMNS: dict[str, str]

class PrefixCacheStats:
    """Prefix-cache counters since they were last taken (docs/scheduling.md §7.10)."""

    @property
    def reset(self) -> bool: ...
    @property
    def requests(self) -> int: ...
    @property
    def queries(self) -> int: ...
    @property
    def hits(self) -> int: ...
    @property
    def preempted_requests(self) -> int: ...
    @property
    def preempted_queries(self) -> int: ...
    @property
    def preempted_hits(self) -> int: ...

class BlockPool:
    """All KV-cache blocks and their free queue; block 0 is the reserved
    null block. Freed blocks go to the head of the queue (reused first)."""

    def __init__(self, num_blocks: SupportsIndex) -> None: ...
    def get_new_blocks(self, num_blocks: SupportsIndex) -> list[int]:
        """Take blocks from the head of the free queue (ValueError if too few)."""
    def free_blocks(self, block_ids: Sequence[SupportsIndex]) -> None:
        """Drop one reference per listed block, in the order given."""
    def touch(self, block_ids: Sequence[SupportsIndex]) -> None:
        """Add one reference per listed block, taking free ones off the queue."""
    def reset_prefix_cache(self) -> bool:
        """Forget all cached hashes; refused (False) while any block is held."""
    def free_block_ids(self) -> list[int]:
        """The free queue, head (next to reuse) first."""
    def block_ref_cnts(self) -> list[int]:
        """Every block's reference count, indexed by block id."""
    @property
    def num_blocks(self) -> int: ...
    @property
    def num_free_blocks(self) -> int: ...
    @property
    def usage(self) -> float: ...

class KVCacheManager:
    """The paged KV cache's bookkeeping for the requests registered with
    ``add_request``: prefix lookups, slot allocation (with the full-prompt
    admission gate), hash caching at allocation time and freeing, making
    vLLM 0.33's decisions. Bad input raises ValueError/TypeError and changes
    nothing."""

    def __init__(
        self,
        num_blocks: SupportsIndex,
        block_size: SupportsIndex,
        max_model_len: SupportsIndex,
        enable_prefix_caching: bool = True,
    ) -> None: ...
    def add_request(
        self,
        request_id: str,
        prompt_token_ids: Sequence[SupportsIndex],
        cache_salt: str | None = None,
    ) -> None:
        """Register a request's prompt and hash its full blocks."""
    def append_token_ids(self, request_id: str, token_ids: Sequence[SupportsIndex]) -> None:
        """Append output tokens, hashing each block they complete."""
    def remove_request(self, request_id: str) -> None:
        """Free the request's blocks and forget it."""
    def get_computed_blocks(self, request_id: str) -> tuple[list[int], int]:
        """The longest cached prefix: (hit block ids, hit tokens); whole
        blocks, at most ``num_tokens - 1`` tokens. Changes nothing."""
    def allocate_slots(
        self,
        request_id: str,
        num_new_tokens: SupportsIndex,
        num_new_computed_tokens: SupportsIndex | None = None,
        new_computed_blocks: Sequence[SupportsIndex] | None = None,
        full_sequence_must_fit: bool = False,
    ) -> list[int] | None:
        """Make room for ``num_new_tokens`` more tokens after taking the
        prefix hits; the new block ids, or None (nothing changed) when too
        few blocks are free."""
    def free(self, request_id: str) -> None:
        """Release the request's blocks, last block first; it stays
        registered with no computed tokens (as after a preemption)."""
    def get_block_ids(self, request_id: str) -> list[int]: ...
    def num_cached_blocks(self, request_id: str) -> int: ...
    def num_tokens(self, request_id: str) -> int: ...
    def num_computed_tokens(self, request_id: str) -> int: ...
    def set_num_computed_tokens(self, request_id: str, num_computed_tokens: SupportsIndex) -> None:
        """Set what the scheduler computed: at most the request's known
        tokens and the tokens its table has slots for."""
    def block_hashes(self, request_id: str) -> list[int]:
        """One 128-bit hash per full block of the request."""
    def record_prefix_cache_stats(
        self, request_id: str, num_hit_tokens: SupportsIndex, preempted: bool = False
    ) -> None:
        """Count one admission (only with prefix caching on)."""
    def make_prefix_cache_stats(self) -> PrefixCacheStats:
        """Take the counters, leaving zeros."""
    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash; refused (False) while any block is held."""
    def free_block_ids(self) -> list[int]:
        """The free queue, head (next to reuse or evict) first."""
    def block_ref_cnts(self) -> list[int]: ...
    def block_hash(self, block_id: SupportsIndex) -> int | None: ...
    def cached_blocks(self) -> dict[int, list[int]]:
        """The prefix-cache map: hash -> block ids in insertion order."""
    def __contains__(self, request_id: str) -> bool: ...
    def __len__(self) -> int: ...
    @property
    def num_blocks(self) -> int: ...
    @property
    def block_size(self) -> int: ...
    @property
    def max_model_len(self) -> int: ...
    @property
    def enable_prefix_caching(self) -> bool: ...
    @property
    def num_free_blocks(self) -> int: ...
    @property
    def usage(self) -> float: ...

class Step:
    """One step's decisions (``ironbatch.core_scheduler`` wraps it)."""

    @property
    def req_ids(self) -> list[str]: ...
    @property
    def preempted_req_ids(self) -> list[str]: ...
    @property
    def finished_req_ids(self) -> list[str]: ...
    def columns(self) -> dict[str, NDArray[Any]]:
        """The step's NumPy columns, named and typed by ``STEP_COLUMNS``
        (made on the first call, then the same dict)."""
    def column(self, name: str) -> NDArray[Any]:
        """One column as a fresh array; KeyError for an unknown name."""
    def __len__(self) -> int: ...
    @property
    def has_structured_output_requests(self) -> bool:
        """A structured-output request samples this step."""
    @property
    def pending_structured_output_tokens(self) -> bool:
        """Async: one of them still has its previous token in flight."""
    @property
    def drafts_needed(self) -> bool:
        """A request scheduled this step may verify drafts proposed after it."""
    @property
    def has_sync_kv_loads(self) -> bool:
        """An admission takes external tokens a KV connector loads in the step."""
    @property
    def grammar_released(self) -> list[str]:
        """Ids the waiting pass found compiled (released), in order reached."""
    @property
    def grammar_failed(self) -> list[str]:
        """Ids the waiting pass found failed (still held), in order reached."""
    @property
    def scheduled_encoder_inputs(self) -> list[tuple[str, list[int]]]:
        """Per request scheduled with encoder inputs: its id and their indices."""
    @property
    def free_encoder_mm_hashes(self) -> list[str]:
        """Encoder-cache entries evicted since the previous step."""
    @property
    def new_block_ids_to_zero(self) -> list[int]:
        """Attention blocks handed out during the step, for the runner to
        zero (vLLM's ``new_block_ids_to_zero``; empty without recurrent
        groups)."""
    @property
    def encoder_mismatch(self) -> list[str]:
        """Ids whose item reuses a cached identifier with other embeddings."""

class KvEvent:
    """One KV-cache event (docs/scheduling.md §7.12)."""

    @property
    def kind(self) -> str:
        """ "stored", "stored_key", "hit", "removed", "cleared", "allocated",
        "accessed", "evicted", "lookup", "released" or "loading"."""
    @property
    def slot(self) -> int | None:
        """The request's slot ("stored", "stored_key", "hit", "lookup",
        "released", "loading")."""
    @property
    def group(self) -> int:
        """The KV-cache group ("stored", "stored_key")."""
    @property
    def first_block(self) -> int:
        """The first block stored ("stored")."""
    @property
    def block_ids(self) -> list[int]:
        """The blocks stored, the one keyed ("stored_key"), or the one
        removed."""
    @property
    def num_blocks(self) -> int:
        """Blocks stored ("stored"), hash blocks found cached ("hit") or the
        hash blocks a key covers ("stored_key")."""
    @property
    def num_computed_tokens(self) -> int:
        """The tokens the request had computed ("released"), or will have
        once loaded ("loading")."""

class PinRequests:
    """Pins and unpins asked for while the scheduler may be busy; applied
    right after the connector call that asked, or at the next step."""

    def pin(self, block_ids: Sequence[SupportsIndex]) -> None: ...
    def unpin(self, block_ids: Sequence[SupportsIndex]) -> None: ...

class ErroredRequest:
    """A request an update ended with an error (already freed)."""

    @property
    def request_id(self) -> str: ...
    @property
    def token_ids(self) -> list[int]:
        """All its tokens, prompt first, as it ended."""
    @property
    def num_computed_tokens(self) -> int: ...

class FinishedRequest:
    """A request that finished in an update (already freed)."""

    @property
    def record(self) -> int: ...
    @property
    def request_id(self) -> str: ...
    @property
    def finish_reason(self) -> str:
        """ "stop", "length", "abort" or "error"."""
    @property
    def stop_reason(self) -> int | str | None:
        """The stop token, or \"repetition_detected\"."""
    @property
    def token_ids(self) -> list[int]:
        """All its tokens, prompt first, as it ended."""
    @property
    def num_tokens(self) -> int:
        """``len(token_ids)``."""
    def token_ids_from(self, start: int) -> list[int]:
        """``token_ids[start:]``, without making the whole list."""
    @property
    def num_computed_tokens(self) -> int: ...
    @property
    def session_continues(self) -> bool:
        """Only a streaming session's turn ended: the request lives on."""

class StepUpdate:
    """What one update_from_output reported: one record per request that
    got tokens, in scheduling order (its arrays made when first read)."""

    def __len__(self) -> int:
        """The number of records."""

    @property
    def rows(self) -> NDArray[np.int32]:
        """Each record's row in the step."""
    @property
    def tokens(self) -> NDArray[np.uint32]: ...
    @property
    def token_offsets(self) -> NDArray[np.int64]:
        """Record ``i`` owns ``tokens[token_offsets[i]:token_offsets[i+1]]``."""
    @property
    def cached_tokens(self) -> NDArray[np.int64]:
        """Each record's tokens in hash-cached blocks after the output."""
    @property
    def finished(self) -> list[FinishedRequest]: ...
    @property
    def spec_decoding_stats(self) -> SpecDecodingStats | None:
        """Drafts verified in this output; None when none were."""
    @property
    def errored(self) -> list[str]:
        """Requests the update ended with an error (failed loads, the
        caller's ``errors``), in the order ended."""

class VllmStepRows:
    """What the vLLM drop-in reads of a step, as lists (made when first
    read): running rows first, then admissions (first ones and resumed
    ones, in scheduling order)."""

    def __init__(self, step: Step, num_groups: int) -> None: ...
    @property
    def req_ids(self) -> list[str]: ...
    @property
    def slots(self) -> list[int]: ...
    @property
    def num_scheduled(self) -> list[int]: ...
    @property
    def computed(self) -> list[int]:
        """``num_computed_tokens`` before the step (the hit for admissions)."""
    @property
    def num_output_tokens(self) -> list[int]:
        """Output tokens before the step, placeholders included."""
    @property
    def num_running(self) -> int:
        """Rows ``[0, num_running)`` continue; the rest are admissions."""
    @property
    def admitted(self) -> range: ...
    @property
    def new(self) -> list[int]:
        """Rows admitted for the first time."""
    @property
    def resumed(self) -> list[int]:
        """Rows admitted again after a preemption."""
    @property
    def running_grown(self) -> list[int]:
        """Running rows whose block table grew this step."""
    @property
    def num_scheduled_tokens(self) -> dict[str, int]: ...
    @property
    def total_num_scheduled_tokens(self) -> int: ...
    @property
    def num_groups(self) -> int: ...
    @property
    def step(self) -> Step: ...
    @property
    def output(self) -> Any:
        """vLLM's SchedulerOutput, when ``VllmObjects.schedule`` made the rows."""
    @property
    def has_news(self) -> bool:
        """An admission, a preemption, or a grammar released or failed."""
    def block_ids(self, i: int) -> tuple[list[int], ...]:
        """Row ``i``'s blocks, one list per KV-cache group."""
    def spec_decode_tokens(self) -> dict[str, list[int]]:
        """Each row with drafts: its drafts (-1 for a placeholder)."""

class VllmObjects:
    """vLLM's per-step objects for one drop-in (SchedulerOutput with its
    CachedRequestData, EngineCoreOutputs, SchedulerStats), made from the
    core's step: vLLM's classes, and the shape its model runner is sent."""

    def __init__(
        self,
        *,
        scheduler_output: type,
        cached_request_data: type,
        scheduler_stats: type,
        prefix_cache_stats: type,
        engine_core_output: Callable[[str, list[int]], Any],
        kv_fetch_stages: Iterable[str],
        num_kv_cache_groups: int,
        model_runner_v2: bool,
        send_token_ids: bool,
        num_speculative_tokens: int,
        can_skip_drafts: bool,
    ) -> None: ...
    def schedule(self, scheduler: Scheduler, throttle_prefills: bool = False) -> VllmStepRows:
        """The core's next step; ``.output`` is vLLM's SchedulerOutput, all
        but the admissions' NewRequestData (and V1's all_token_ids)."""
    def update(
        self,
        scheduler: Scheduler,
        *,
        step: Step,
        req_id_to_index: dict[str, int],
        sampled_token_ids: list[list[int]],
        accept: Callable[[str, list[int], int], bool] | None = None,
        kv_connector_output: Any = None,
        errors: Sequence[str] | None = None,
        end_order: Callable[[list[str], list[str], list[str], list[str]], list[str]] | None = None,
    ) -> VllmStepUpdate:
        """``vllm_update_from_runner_output``, each record's output made, with
        the worker's report of the step's KV transfers; ``errors``: request
        ids to end with an error after the output, with those the "fail"
        policy ends; ``end_order(whole, loading, running, requested)``
        orders them all."""
    def update_pooled(
        self,
        scheduler: Scheduler,
        *,
        step: Step,
        req_id_to_index: dict[str, int],
        pooler_output: list[Any],
        kv_connector_output: Any = None,
        errors: Sequence[str] | None = None,
        end_order: Callable[[list[str], list[str], list[str], list[str]], list[str]] | None = None,
    ) -> VllmStepUpdate:
        """A pooling runner's output: a row whose ``pooler_output`` entry is
        not None finishes; each record's output is made with no tokens.
        ``kv_connector_output``, ``errors`` and ``end_order`` as ``update``
        takes them."""
    def scheduler_stats(
        self,
        scheduler: Scheduler,
        *,
        kv_cache_eviction_events: list[Any],
        spec_decoding_stats: Any,
        kv_connector_stats: dict[str, Any] | None,
        cudagraph_stats: Any,
        perf_stats: Any,
    ) -> Any:
        """vLLM's SchedulerStats; takes (zeroes) the core's counters."""

class VllmStepUpdate:
    """The vLLM drop-in's update: one record per request that got tokens,
    in scheduling order, as lists."""

    @property
    def rows(self) -> list[int]:
        """Each record's row in the step."""
    @property
    def slots(self) -> list[int]:
        """Each record's slot."""
    @property
    def req_ids(self) -> list[str]: ...
    @property
    def new_token_ids(self) -> list[list[int]]:
        """Each record's tokens (the runner's own list where all were kept)."""
    @property
    def outputs(self) -> list[Any] | None:
        """Each record's EngineCoreOutput, when ``VllmObjects.update`` made it."""
    @property
    def cached_tokens(self) -> list[int]: ...
    @property
    def finished(self) -> list[FinishedRequest]: ...
    @property
    def spec_decoding_stats(self) -> SpecDecodingStats | None: ...
    @property
    def errored(self) -> list[ErroredRequest]:
        """Requests the update ended with an error (the "fail" policy's,
        the caller's ``errors``), in the order ended; the ending adds no
        record."""
    def records_of(self, slots: list[int]) -> list[int]:
        """The records whose slot is among ``slots``, in record order."""

class SpecDecodingStats:
    """vLLM's SpecDecodingStats for one update."""

    @property
    def num_spec_tokens(self) -> int: ...
    @property
    def num_drafts(self) -> int: ...
    @property
    def num_draft_tokens(self) -> int: ...
    @property
    def num_accepted_tokens(self) -> int: ...
    @property
    def num_accepted_tokens_per_pos(self) -> list[int]: ...
    @property
    def num_draft_tokens_per_pos(self) -> list[int]: ...

class SchedulerStats:
    """Counts and usage; taking them zeroes the counters."""

    @property
    def num_running_reqs(self) -> int: ...
    @property
    def num_waiting_reqs(self) -> int: ...
    @property
    def num_skipped_waiting_reqs(self) -> int: ...
    @property
    def kv_cache_usage(self) -> float: ...
    @property
    def prefix_cache_stats(self) -> PrefixCacheStats: ...
    @property
    def num_preempted_reqs(self) -> int: ...

class Scheduler:
    """vLLM 0.33's V1 scheduler in Rust (use it through
    ``ironbatch.core_scheduler.CoreScheduler``). Keyword arguments only."""

    def __init__(
        self,
        *,
        max_num_seqs: SupportsIndex,
        max_num_batched_tokens: SupportsIndex,
        max_num_scheduled_tokens: SupportsIndex,
        max_num_active_seqs: SupportsIndex,
        max_model_len: SupportsIndex,
        enable_chunked_prefill: bool,
        long_prefill_token_threshold: SupportsIndex,
        long_prefill_token_threshold_adaptive: bool,
        watermark_blocks: SupportsIndex,
        policy: str,
        scheduler_reserve_full_isl: bool,
        num_blocks: SupportsIndex,
        block_size: SupportsIndex,
        enable_prefix_caching: bool,
        async_scheduling: bool,
        prefill_schedule_interval: SupportsIndex,
        decode_stagger: SupportsIndex,
        num_speculative_tokens: SupportsIndex | None = None,
        num_lookahead_tokens: SupportsIndex | None = None,
        num_hash_lookahead_tokens: SupportsIndex | None = None,
        drop_eagle_block: bool = False,
        eagle_groups: Sequence[int] | None = None,
        num_draft_slots: SupportsIndex | None = None,
        drafts_by_batch_size: Sequence[int] | None = None,
        kv_cache_groups: Sequence[tuple[str, int, int | None, int, int | None, int | None]]
        | None = None,
        sparse_retention: bool = True,
        retention_interval: SupportsIndex | None = None,
        mixed_precision: bool = False,
        max_loras: SupportsIndex | None = None,
        encoder_compute_budget: SupportsIndex | None = None,
        encoder_cache_size: SupportsIndex | None = None,
        disable_chunked_mm_input: bool = False,
        drafter_read_ahead: SupportsIndex | None = None,
        runner: str = "generate",
    ) -> None:
        """``max_loras``: distinct LoRA adapters a step's batch may hold
        (None: no cap). ``encoder_compute_budget`` and ``encoder_cache_size``
        (both or neither): a multimodal model's encoder limits, in
        embeddings (docs/scheduling.md §4.15). ``kv_cache_groups``: the
        KV-cache groups in vLLM's order, each
        ``(kind, size, admission_cap_blocks, speculative_blocks,
        checkpoint_alignment, block_size)`` with kind "full" or
        "cross_attention" (size ignored), "sliding_window" (size: the
        window), "chunked_local" (size: the chunk), of ``block_size`` unless a
        full or window group gives its own (a mixed-precision hybrid, §7.16),
        or "mamba" (size: its own tokens
        per state block, ``block_size`` with prefix caching on;
        speculative_blocks: scratch states for drafts; checkpoint_alignment:
        prefill checkpoints written inside a chunk, or None),
        sharing the pool; None is one full-attention group, an empty list none (a
        model without a KV cache). ``sparse_retention``: sliding-window
        groups cache only the blocks a later request can resume from (vLLM's
        default ``prefix_cache_retention_interval=0``), with
        ``retention_interval`` above 0 also each segment's tail.
        ``mixed_precision``: new attention blocks are listed for zeroing
        (vLLM's ``has_mixed_precision_kv_cache``). ``drop_eagle_block``: a
        prefix hit gives up its last block (EAGLE
        without lookahead hashes, §7.4), in the ``eagle_groups`` (None:
        every group; §7.13). ``drafter_read_ahead``: prompt
        tokens an EAGLE-style drafter reads past a step (vLLM's
        ``num_prefill_lookahead_tokens``, §4.13). ``runner``:
        "generate", "pooling" or "encoder_only" (docs/scheduling.md §4.16,
        §4.18)."""
    def add_request(
        self,
        *,
        request_id: str,
        prompt_token_ids: Sequence[SupportsIndex],
        max_tokens: SupportsIndex,
        min_tokens: SupportsIndex,
        eos_token_id: int | None,
        stop_token_ids: Sequence[SupportsIndex],
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
        prompt_embeds_digests: Sequence[bytes] | None = None,
    ) -> int:
        """Queue a request; returns its slot (its stable row while it lives).
        ``lora_request``: None, or anything with vLLM's ``LoRARequest``
        fields (``lora_int_id`` >= 1, ``lora_name``, ``lora_path``).
        ``mm_features``: None, or items with vLLM's ``MultiModalFeatureSpec``
        fields (``identifier``; ``mm_position`` with ``offset``, ``length``,
        ``is_embed``) or ``ironbatch.MultimodalInput``'s.
        ``prompt_embeds_digests``: a prompt given as embeddings, one digest
        per block it overlaps."""
    def schedule(self) -> Step: ...
    def update_from_output(
        self,
        *,
        step: Step,
        token_ids: NDArray[np.int64],
        offsets: NDArray[np.int64] | None,
        accept: Callable[[str, list[int], int], bool] | None = None,
        kv_connector_output: Any = None,
        errors: Sequence[str] | None = None,
        end_order: Callable[[list[str], list[str], list[str], list[str]], list[str]] | None = None,
    ) -> StepUpdate:
        """Apply a step's tokens (with ``offsets``: ragged; without: one per
        entry, -1 for none). ``accept(request_id, kept, num_tokens)`` judges each
        structured-output request's kept tokens; False or an exception ends
        it with an error. ``errors``: request ids to end with an error after
        the output (unknown and finished ones skipped), with those a failed
        KV load ends ("fail" policy); ``end_order(whole, loading, running,
        requested)`` orders them all; an answer that is not those ids goes
        to ``sys.unraisablehook`` and the core's order stands."""
    def update_from_pooler_output(
        self,
        step: Step,
        pooled: list[bool],
        *,
        kv_connector_output: Any = None,
        errors: Sequence[str] | None = None,
        end_order: Callable[[list[str], list[str], list[str], list[str]], list[str]] | None = None,
    ) -> StepUpdate:
        """A pooling runner's output: ``pooled[i]`` finishes row ``i``'s
        request (stopped); refused for a row whose step ended in its prompt.
        ``kv_connector_output``, ``errors`` and ``end_order`` as
        ``update_from_output`` takes them."""
    def has_request(self, request_id: str) -> bool:
        """Whether ``request_id`` is a live request."""
    def is_prefill_chunk(self, request_id: str) -> bool | None:
        """Whether its last step left tokens to compute (None: not live)."""
    @property
    def num_kv_holding(self) -> int:
        """Waiting requests that hold KV blocks (sessions between turns)."""
    @property
    def num_waiting_for_input(self) -> int:
        """Streaming sessions waiting for their next input chunk."""
    def enable_kv_events(self) -> None:
        """Log KV-cache events from now on; ValueError beside KV-cache
        groups of different block sizes (not modelled, §7.16)."""
    def enable_block_lifecycle_events(self) -> None:
        """Log blocks' lives (handed out, hit) for residency metrics."""
    def enable_request_events(self) -> None:
        """Log requests' prefix lookups and block releases among the events."""
    def enable_aux_outputs(self) -> None:
        """Cap prefix hits where the workers hold no routed experts (§7.12)."""
    def take_boundary_states(self) -> list[tuple[str, int, int, int]]:
        """Cached states offered to the KV connector: (request, group, block, tokens)."""
    def take_kv_events(self) -> list[KvEvent]:
        """The KV-cache events since last taken, oldest first."""
    def update_draft_token_ids(
        self,
        *,
        request_ids: Sequence[str],
        token_ids: Sequence[SupportsIndex],
        offsets: Sequence[int],
    ) -> None:
        """Drafts for the requests' next steps: ``request_ids[i]`` gets
        ``token_ids[offsets[i]:offsets[i+1]]``, replacing what it had."""
    def report_grammar(self, *, request_id: str, compiled: bool) -> None:
        """A structured-output request's grammar compiled (or failed)."""
    def finish_requests(self, *, request_ids: Sequence[str], status: str) -> None: ...
    def set_ec_connector(self, *, connector: Any) -> None:
        """Attach an encoder-cache connector (docs/scheduling.md §4.20):
        ``has_cache_item(identifier)``, ``ensure_cache_available(request_id,
        num_computed_tokens)``, ``update_state_after_alloc(request_id,
        input_id)``, ``update_state_after_free(request_id, input_id)``,
        ``request_finished(request_id) -> hold``."""
    def set_kv_connector(
        self,
        *,
        connector: Any,
        kv_load_failure_policy: str,
        defer_block_free: bool,
        requires_kv_delivery: bool,
        divergent_hybrid_hits: bool = False,
    ) -> None:
        """Attach a KV connector's scheduler side (docs/scheduling.md
        §4.19): ``get_num_new_matched_tokens(request_id, num_tokens,
        num_computed_tokens)``, ``update_state_after_alloc(request_id,
        block_ids, num_external_tokens)``, ``request_finished(request_id,
        block_ids, status)``, optionally ``has_pending_block_frees()``,
        ``get_loaded_kv_cache_group_ids(request_id)`` (the groups an async
        load writes: not zeroed; every group without it) and
        ``local_hit_reconciled(request_id, num_computed_tokens)`` and
        ``external_hit_settled(request_id, num_tokens, load_async)``;
        ``kv_load_failure_policy``: ``"fail"`` or ``"recompute"``; frees
        fenced by steps in flight with ``defer_block_free``; a preempted
        request's output dropped with ``requires_kv_delivery``; full
        attention's own hit told beside cached recurrent states with
        ``divergent_hybrid_hits`` (§4.19.2)."""
    @property
    def pause_state(self) -> int:
        """vLLM's pause state: 0 unpaused, 1 no admissions, 2 nothing scheduled."""
    @pause_state.setter
    def pause_state(self, state: int) -> None: ...
    def get_request_counts(self) -> tuple[int, int]:
        """(running, waiting) request counts."""
    @property
    def kv_cache_usage(self) -> float: ...
    def reset_prefix_cache(self, *, reset_running_requests: bool) -> bool: ...
    def pin_blocks(self, block_ids: Sequence[SupportsIndex]) -> None:
        """Pin each listed block once from outside any request (a KV
        connector's ``touch``); the null block is passed over."""
    def unpin_blocks(self, block_ids: Sequence[SupportsIndex]) -> None:
        """Drop one pin per listed block, in the order given; refused past
        a block's pins."""
    def pin_requests(self) -> PinRequests:
        """A handle to ask for pins on from inside a connector's call."""
    def take_pin_errors(self) -> list[str]:
        """The asks on ``pin_requests`` refused since the last call."""
    def reset_encoder_cache(self) -> None:
        """Forget every encoder output (after a weight update)."""
    def make_stats(self) -> SchedulerStats: ...
    def get_num_unfinished_requests(self) -> int: ...
    def debug_state(self) -> dict[str, Any]: ...
    @property
    def num_free_blocks(self) -> int: ...

def vllm_update_from_runner_output(
    scheduler: Scheduler,
    *,
    step: Step,
    req_id_to_index: dict[str, int],
    sampled_token_ids: list[list[int]],
    accept: Callable[[str, list[int], int], bool] | None = None,
) -> VllmStepUpdate:
    """The vLLM drop-in's update: entry ``i`` gets
    ``sampled_token_ids[req_id_to_index[req_ids[i]]]``."""

def vllm_request_state(scheduler: Scheduler, slot: int) -> tuple[list[int], int]:
    """A live request's (tokens, num_computed_tokens), prompt first (for the
    vLLM drop-in)."""

def vllm_request_tail(scheduler: Scheduler, slot: int, start: int) -> tuple[list[int], int, str]:
    """A live request's tokens from ``start`` on, its num_computed_tokens and
    its status as vLLM spells it (for a KV connector's view)."""

def vllm_shared_prefix_boundary(scheduler: Scheduler, slot: int) -> int:
    """A live request's shared-prefix boundary as its last prefix-cache
    lookup set it (vLLM's ``Request.shared_prefix_boundary``)."""

def vllm_block_ids(scheduler: Scheduler, slot: int) -> list[list[int]]:
    """A live request's block ids, one list per KV-cache group."""

def vllm_confirmed_tokens(scheduler: Scheduler, slot: int) -> int:
    """A live request's num_computed_tokens less its tokens in flight."""

def vllm_encoder_cache_state(scheduler: Scheduler) -> dict[str, Any]:
    """The encoder cache as vLLM's EncoderCacheManager holds it (tests)."""

# --- ironbatch simulate (rust/src/python/simulate.rs) ---

class SimWorkload:
    """A workload's columns for the simulation loop (see
    ``ironbatch.simulation.workload``)."""

    def __init__(
        self,
        *,
        arrival_s: NDArray[np.float64],
        output_tokens: NDArray[np.int64],
        segment_offsets: NDArray[np.int64],
        segment_keys: NDArray[np.uint64],
        segment_lengths: NDArray[np.int64],
        literal_offsets: NDArray[np.int64],
        literal_tokens: NDArray[np.int64],
        vocab_size: int,
    ) -> None: ...
    def __len__(self) -> int: ...
    def prompt_token_ids(self, index: int) -> list[int]:
        """Request ``index``'s prompt, as the simulation adds it."""
    def prompt_lengths(self) -> NDArray[np.int64]: ...

class StepTimeModel:
    """The simulation's clock: a step model and the engine's CPU overhead."""

    @staticmethod
    def linear(
        *,
        intercept_s: float = 0.0,
        per_request_s: float = 0.0,
        per_prefill_request_s: float = 0.0,
        per_prefill_token_s: float = 0.0,
        per_decode_token_s: float = 0.0,
        per_sampled_s: float = 0.0,
        per_context_token_s: float = 0.0,
        per_attention_pair_s: float = 0.0,
        overhead_per_step_s: float = 0.0,
        overhead_per_request_s: float = 0.0,
    ) -> StepTimeModel: ...
    @staticmethod
    def roofline(
        *,
        weight_bytes: float,
        kv_bytes_per_token: float,
        flops_per_token: float,
        flops_per_attention_pair: float,
        flops_per_sampled: float,
        bytes_per_s: float,
        flops_per_s: float,
        fixed_s: float,
        overhead_per_step_s: float = 0.0,
        overhead_per_request_s: float = 0.0,
    ) -> StepTimeModel: ...
    def model_s(
        self,
        *,
        num_requests: int,
        num_prefill_requests: int,
        num_prefill_tokens: int,
        num_decode_tokens: int,
        num_sampled: int,
        context_tokens: int,
        attention_pairs: float,
    ) -> float:
        """The model's seconds for a batch of this shape (0 when empty)."""
    def overhead_s(self, num_requests: int) -> float:
        """The engine's CPU seconds around a step of ``num_requests``."""

def simulate(
    *,
    scheduler: Scheduler,
    workload: SimWorkload,
    step_model: StepTimeModel,
    sampled_token: int = 5,
    record_steps: bool = True,
    record_decisions: bool = False,
    max_steps: int | None = None,
    trace_path: str | None = None,
) -> dict[str, Any]:
    """The whole run in Rust (GIL released): ``requests``, ``steps`` and
    ``decisions`` as dicts of NumPy columns, ``num_steps``, ``end_s``,
    ``finished``."""
