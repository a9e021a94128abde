"""The two engines behind ``Scheduler``: the Rust core and the Python twin,
adapted to one interface (add_request, schedule, update_from_output,
finish_requests, reset_prefix_cache, make_stats, debug_state)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ironbatch import reference
from ironbatch.config import CacheConfig, SchedulerConfig
from ironbatch.request import Request
from ironbatch.scheduler_output import (
    KIND_NAMES,
    SchedulerOutput,
    UpdateOutputs,
    model_runner_columns,
)
from ironbatch.scheduler_stats import SchedulerStats

# (flat tokens, offsets per scheduled row), or (one token per row, None)
# with -1 for none.
Sampled = tuple[np.ndarray, "np.ndarray | None"]


def _output(
    req_ids: list[str], columns: dict[str, np.ndarray], step: Any, lookup_request: Any
) -> SchedulerOutput:
    """A SchedulerOutput around a backend's step (kept as the update's handle)."""
    return SchedulerOutput(
        req_ids=req_ids,
        columns=columns,
        preempted_req_ids=set(step.preempted_req_ids),
        finished_req_ids=set(step.finished_req_ids),
        handle=step,
        lookup_request=lookup_request,
    )


class PythonBackend:
    """The plain-Python twin; columns are built from its per-request records."""

    def __init__(self, scheduler_config: SchedulerConfig, cache_config: CacheConfig) -> None:
        self.twin = reference.Scheduler(scheduler_config, cache_config)
        self.block_size = cache_config.block_size

    def add_request(self, request: Request) -> None:
        self.twin.add_request(request)

    def schedule(self, lookup_request: Callable[[str], Any]) -> SchedulerOutput:
        step = self.twin.schedule()
        rows = step.scheduled
        computed = [s.num_computed_tokens for s in rows]
        scheduled = [s.num_tokens for s in rows]
        block_offsets = np.zeros(len(rows) + 1, dtype=np.int32)
        np.cumsum([len(s.block_ids) for s in rows], out=block_offsets[1:])
        columns = {
            "req_slots": np.array([s.request.slot for s in rows], dtype=np.int32),
            "num_scheduled": np.array(scheduled, dtype=np.int32),
            "num_computed_tokens": np.array(computed, dtype=np.int32),
            "kinds": np.array([KIND_NAMES.index(s.kind) for s in rows], dtype=np.uint8),
            "samples": np.array([s.samples for s in rows], dtype=np.bool_),
            "num_output_tokens": np.array([s.num_output_tokens for s in rows], dtype=np.int32),
            "new_block_ids": np.array([b for s in rows for b in s.block_ids], dtype=np.int32),
            "new_block_offsets": block_offsets,
            **model_runner_columns(computed, scheduled, [s.table for s in rows], self.block_size),
        }
        return _output([s.request_id for s in rows], columns, step, lookup_request)

    def update_from_output(self, out: SchedulerOutput, sampled: Sampled) -> UpdateOutputs:
        flat, offsets = sampled
        if offsets is None:  # one token per row, -1 for none
            if flat.size and (flat.min() < -1 or flat.max() > 2**32 - 1):
                bad = int(np.flatnonzero((flat < -1) | (flat > 2**32 - 1))[0])
                raise ValueError(f"sampled[{bad}] = {flat[bad]} is neither -1 nor a token id")
            tokens = {rid: [int(t)] for rid, t in zip(out.req_ids, flat, strict=True) if t != -1}
        else:
            tokens = {
                rid: flat[offsets[i] : offsets[i + 1]].tolist()
                for i, rid in enumerate(out.req_ids)
                if offsets[i + 1] > offsets[i]
            }
        updates = self.twin.update_from_output(out._handle, tokens)
        token_offsets = np.zeros(len(updates) + 1, dtype=np.int64)
        np.cumsum([len(u.new_token_ids) for u in updates], out=token_offsets[1:])
        row = {rid: i for i, rid in enumerate(out.req_ids)}
        return UpdateOutputs(
            out.req_ids,
            np.array([row[u.request_id] for u in updates], dtype=np.int32),
            np.array([t for u in updates for t in u.new_token_ids], dtype=np.uint32),
            token_offsets,
            np.array([u.cached_tokens for u in updates], dtype=np.int64),
            [
                (i, u.finish_reason, u.stop_reason)
                for i, u in enumerate(updates)
                if u.finish_reason is not None
            ],
        )

    def finish_requests(self, request_ids: list[str], status: str) -> None:
        self.twin.finish_requests(request_ids, reference.RequestStatus[status])

    def reset_prefix_cache(self, reset_running_requests: bool) -> bool:
        return self.twin.reset_prefix_cache(reset_running_requests)

    def make_stats(self) -> SchedulerStats:
        s = self.twin.make_stats()
        return SchedulerStats(
            s.num_running_reqs,
            s.num_waiting_reqs,
            s.num_skipped_waiting_reqs,
            s.kv_cache_usage,
            s.prefix_cache_stats,
            s.num_preempted_reqs,
        )

    def num_free_blocks(self) -> int:
        return self.twin.kv.num_free_blocks

    def debug_state(self) -> dict[str, Any]:
        return self.twin.debug_state()


class RustBackend:
    """The Rust core (``ironbatch._core.Scheduler``)."""

    def __init__(self, scheduler_config: SchedulerConfig, cache_config: CacheConfig) -> None:
        from ironbatch import _core

        c = scheduler_config
        self.core = _core.Scheduler(
            max_num_seqs=c.max_num_seqs,
            max_num_batched_tokens=c.max_num_batched_tokens,
            max_model_len=c.max_model_len,
            enable_chunked_prefill=c.enable_chunked_prefill,
            long_prefill_token_threshold=c.long_prefill_token_threshold,
            policy=c.policy,
            scheduler_reserve_full_isl=c.scheduler_reserve_full_isl,
            num_blocks=cache_config.num_blocks,
            block_size=cache_config.block_size,
            enable_prefix_caching=cache_config.enable_prefix_caching,
            async_scheduling=c.async_scheduling,
        )

    def add_request(self, request: Request) -> None:
        p = request.sampling_params
        self.core.add_request(
            request.request_id,
            request.prompt_token_ids,
            p.max_tokens,
            p.min_tokens,
            None if p.ignore_eos else request.eos_token_id,
            p.stop_token_ids,
            request.priority,
            request.arrival_time,
            request.cache_salt,
        )

    def schedule(self, lookup_request: Callable[[str], Any]) -> SchedulerOutput:
        step = self.core.schedule()
        return _output(step.req_ids, step.columns(), step, lookup_request)

    def update_from_output(self, out: SchedulerOutput, sampled: Sampled) -> UpdateOutputs:
        flat, offsets = sampled
        return UpdateOutputs(out.req_ids, *self.core.update_from_output(out._handle, flat, offsets))

    def finish_requests(self, request_ids: list[str], status: str) -> None:
        self.core.finish_requests(request_ids, status)

    def reset_prefix_cache(self, reset_running_requests: bool) -> bool:
        return self.core.reset_prefix_cache(reset_running_requests)

    def make_stats(self) -> SchedulerStats:
        return SchedulerStats(*self.core.make_stats())

    def num_free_blocks(self) -> int:
        return self.core.num_free_blocks

    def debug_state(self) -> dict[str, Any]:
        return self.core.debug_state()
