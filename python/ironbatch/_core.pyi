"""Type stubs for ironbatch's Rust extension module (rust/src/python/)."""

from collections.abc import Sequence
from typing import Any, SupportsIndex

import numpy as np
from numpy.typing import NDArray

__version__: str
#: The largest size each field accepts (rust/src/limits.rs).
LIMITS: dict[str, int]

class PrefixCacheStats:
    """Prefix-cache counters since they were last taken (spec §7.10)."""

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
    """One schedule() decision: NumPy columns plus what update_from_output
    needs (use it through ``ironbatch.SchedulerOutput``)."""

    @property
    def req_ids(self) -> list[str]: ...
    @property
    def preempted_req_ids(self) -> list[str]: ...
    @property
    def finished_req_ids(self) -> list[str]: ...
    def columns(self) -> dict[str, NDArray[Any]]:
        """req_slots, num_scheduled, num_computed_tokens, kinds, samples,
        num_output_tokens, new_block_ids, new_block_offsets, positions, slot_mapping,
        query_start_loc, seq_lens."""
    def __len__(self) -> int: ...

# (each record's row in the step, tokens, token offsets, tokens in cached
# blocks per record, finished records as (record, finish reason, stop reason))
UpdateColumns = tuple[
    NDArray[np.int32],
    NDArray[np.uint32],
    NDArray[np.int64],
    NDArray[np.int64],
    list[tuple[int, str, int | None]],
]

class Scheduler:
    """vLLM 0.33's V1 scheduler in Rust (use it through ``ironbatch.Scheduler``)."""

    def __init__(
        self,
        *,
        max_num_seqs: SupportsIndex,
        max_num_batched_tokens: SupportsIndex,
        max_model_len: SupportsIndex,
        enable_chunked_prefill: bool,
        long_prefill_token_threshold: SupportsIndex,
        policy: str,
        scheduler_reserve_full_isl: bool,
        num_blocks: SupportsIndex,
        block_size: SupportsIndex,
        enable_prefix_caching: bool,
        async_scheduling: bool = False,
    ) -> None: ...
    def add_request(
        self,
        request_id: str,
        prompt_token_ids: Sequence[SupportsIndex],
        max_tokens: SupportsIndex,
        min_tokens: SupportsIndex,
        eos_token_id: int | None,
        stop_token_ids: Sequence[SupportsIndex],
        priority: int,
        arrival_time: float,
        cache_salt: str | None = None,
    ) -> int:
        """Queue a request; returns its slot (its stable row while it lives)."""
    def schedule(self) -> Step: ...
    def update_from_output(
        self,
        step: Step,
        token_ids: NDArray[np.int64],
        offsets: NDArray[np.int64] | None = None,
    ) -> UpdateColumns:
        """Apply a step's tokens (with ``offsets``: ragged; without: one per
        entry, -1 for none). Returns (each record's row in the step, tokens,
        token offsets, each record's tokens in hash-cached blocks, finished
        records as (record, finish reason, stop reason))."""
    def update_from_runner_output(
        self,
        step: Step,
        req_id_to_index: dict[str, int],
        sampled_token_ids: list[list[int]],
    ) -> tuple[UpdateColumns, list[tuple[list[int], int]]]:
        """Apply a vLLM ModelRunnerOutput's tokens (entry ``i`` gets
        ``sampled_token_ids[req_id_to_index[req_ids[i]]]``); returns what
        ``update_from_output`` does and each finished request's (tokens,
        num_computed_tokens)."""
    def request_state(self, slot: int) -> tuple[list[int], int]:
        """A live request's (tokens, num_computed_tokens), prompt first."""
    def finish_requests(
        self, request_ids: Sequence[str], status: str = "FINISHED_ABORTED"
    ) -> None: ...
    @property
    def pause_state(self) -> int:
        """vLLM's pause state: 0 unpaused, 1 no admissions, 2 nothing scheduled."""
    @pause_state.setter
    def pause_state(self, state: int) -> None: ...
    def get_request_counts(self) -> tuple[int, int]:
        """(running, waiting) request counts."""
    @property
    def kv_cache_usage(self) -> float: ...
    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool: ...
    def make_stats(self) -> tuple[int, int, int, float, PrefixCacheStats, int]:
        """(num_running_reqs, num_waiting_reqs, num_skipped_waiting_reqs,
        kv_cache_usage, prefix-cache stats, preemptions); takes the
        counters."""
    def get_num_unfinished_requests(self) -> int: ...
    def debug_state(self) -> dict[str, Any]: ...
    @property
    def num_free_blocks(self) -> int: ...
