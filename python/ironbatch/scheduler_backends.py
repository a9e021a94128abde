"""The two engines behind ``Scheduler``: the Rust core (through
``CoreScheduler``) and the Python twin, adapted to one interface
(add_request, schedule_step, apply_tokens, checker, finish_requests,
reset_prefix_cache, make_stats, num_free_blocks, debug_state). Both produce
the same step and update shapes (``StepHandle``, ``StepUpdate``), so the API
above them has one code path.

The two calls of every step, ``schedule_step`` and ``apply_tokens``, are the
core's own methods on the Rust backend, bound once: a step crosses no Python
frame of ours between the API and the core (taking the backend layers
away saved 1.1-1.4 µs of a 6-12 µs cold step at 1-64 running;
docs/architecture.md)."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ironbatch import reference
from ironbatch.config import CacheConfig, SchedulerConfig
from ironbatch.core_scheduler import CoreScheduler, EndOrder
from ironbatch.lora import lora_adapter
from ironbatch.multimodal import mm_inputs
from ironbatch.prompt_embeds import embeds_digests
from ironbatch.reference.args import draft_list
from ironbatch.reference.kv_connector import KvConnectorSetup, unraisable
from ironbatch.reference.kv_connector import kv_report as kv_transfer_report
from ironbatch.reference.request import NewRequest, Repetition, StopRules
from ironbatch.reference.scheduler.request_errors import ErrorGroups, RequestErrors
from ironbatch.reference.scheduler.update import accept_all as reference_accept_all
from ironbatch.reference.step import StepOutput, UpdateOutput
from ironbatch.request import Request
from ironbatch.scheduler_output import STEP_COLUMNS
from ironbatch.scheduler_stats import SchedulerStats

# (flat tokens, offsets per scheduled row), or (one token per row, None)
# with -1 for none.
Sampled = tuple[np.ndarray, "np.ndarray | None"]


@dataclass(frozen=True)
class DraftTokenIds:
    """Drafts for the requests' next steps, as columns: ``request_ids[i]``
    gets ``tokens[offsets[i]:offsets[i + 1]]``."""

    request_ids: list[str]
    tokens: list[int]
    offsets: list[int]

    @classmethod
    def of(cls, drafts: Mapping[str, Sequence[int]]) -> DraftTokenIds:
        request_ids, tokens, offsets = [], [], [0]
        for rid, ids in drafts.items():
            if not isinstance(rid, str):
                raise TypeError(f"draft_token_ids keys must be str, got {type(rid).__name__}")
            request_ids.append(rid)
            # Checked here, so that an error names the request as the
            # caller wrote it, not a position in the joined column.
            tokens.extend(draft_list(f"draft_token_ids[{rid!r}]", ids))
            offsets.append(len(tokens))
        return cls(request_ids, tokens, offsets)


# accept(request_id, kept_tokens): whether a structured-output request's
# grammar takes the tokens it kept.
Accept = Callable[[str, list[int]], bool]

logger = logging.getLogger("ironbatch")


def judge(accept: Accept, request_id: str, kept: list[int]) -> bool:
    """``accept``'s verdict; one that raises rejects the tokens (logged), so
    a failing grammar ends its own request, never the update."""
    try:
        return bool(accept(request_id, kept))
    except Exception:
        logger.exception("accept() raised for request %r; its tokens count as rejected", request_id)
        return False


def eos_token_id(request: Request) -> int | None:
    """The EOS the scheduler stops on: none when the request ignores it."""
    return None if request.sampling_params.ignore_eos else request.eos_token_id


def repetition(params: Any) -> Repetition | None:
    """The twin's rules from ``repetition_detection`` settings."""
    if params is None:
        return None
    return Repetition(params.min_pattern_size, params.max_pattern_size, params.min_count)


# schedule_step(throttle_prefills): the step's handle (``StepHandle``).
ScheduleStep = Callable[[bool], Any]
# apply_tokens(*, step, token_ids, offsets, accept): the update
# (``StepUpdate``); ``token_ids`` and ``offsets`` as ``Sampled`` holds them,
# ``accept`` as the backend's ``checker`` made it.
ApplyTokens = Callable[..., Any]


class RustBackend:
    """The Rust core."""

    def __init__(self, scheduler_config: SchedulerConfig, cache_config: CacheConfig) -> None:
        self.core = CoreScheduler(scheduler_config, cache_config)
        self.schedule_step: ScheduleStep = self.core.core.schedule
        # The core checks the tokens' count against the step and each value.
        self.apply_tokens: ApplyTokens = self.core.core.update_from_output

    def add_request(self, request: Request) -> None:
        p = request.sampling_params
        self.core.add_request(
            request_id=request.request_id,
            prompt_token_ids=request.prompt_token_ids,
            max_tokens=p.max_tokens,
            min_tokens=p.min_tokens,
            eos_token_id=eos_token_id(request),
            stop_token_ids=p.stop_token_ids,
            repetition_detection=p.repetition_detection,
            priority=request.priority,
            arrival_time=request.arrival_time,
            cache_salt=request.cache_salt,
            skip_reading_prefix_cache=p.skip_reading_prefix_cache,
            structured_output=request.structured_output,
            resumable=request.resumable,
            lora_request=request.lora_request,
            mm_features=request.mm_features or None,
            prompt_embeds_digests=self.core.digests_of(request.prompt_embeds),
        )

    def has_request(self, request_id: str) -> bool:
        return self.core.has_request(request_id)

    def apply_pooled(
        self,
        step: Any,
        pooled: list[bool],
        kv_connector_output: Any = None,
        errors: Sequence[str] = (),
        end_order: EndOrder | None = None,
    ) -> Any:
        return self.core.update_from_pooler_output(
            step, pooled, kv_connector_output, errors, end_order
        )

    def report_grammar(self, request_id: str, compiled: bool) -> None:
        self.core.report_grammar(request_id, compiled)

    def update_draft_token_ids(self, drafts: DraftTokenIds) -> None:
        self.core.update_draft_token_ids(drafts.request_ids, drafts.tokens, drafts.offsets)

    @staticmethod
    def checker(accept: Accept) -> Callable[[str, list[int], int], bool]:
        """``accept`` as the core asks it: by request id, with the count."""
        return lambda request_id, kept, _num_tokens: judge(accept, request_id, kept)

    def finish_requests(self, request_ids: list[str], status: str) -> None:
        self.core.finish_requests(request_ids, status)

    def set_kv_connector(self, connector: Any, setup: KvConnectorSetup) -> None:
        self.core.set_kv_connector(connector, setup)

    def set_ec_connector(self, connector: Any) -> None:
        self.core.set_ec_connector(connector)

    def pin_blocks(self, block_ids: Sequence[int]) -> None:
        self.core.pin_blocks(block_ids)

    def unpin_blocks(self, block_ids: Sequence[int]) -> None:
        self.core.unpin_blocks(block_ids)

    def pin_requests(self) -> Any:
        return self.core.pin_requests()

    def take_pin_errors(self) -> list[str]:
        return self.core.take_pin_errors()

    def reset_prefix_cache(self, reset_running_requests: bool) -> bool:
        return self.core.reset_prefix_cache(reset_running_requests)

    def make_stats(self) -> SchedulerStats:
        return self.core.make_stats()

    def num_free_blocks(self) -> int:
        return self.core.num_free_blocks

    def debug_state(self) -> dict[str, Any]:
        return self.core.debug_state()


@dataclass
class _TwinStep:
    """The twin's step in the shape of the core's ``_core.Step``
    (``scheduler_output.StepHandle``): columns as NumPy arrays with the
    core's dtypes, ids for slots."""

    step: StepOutput
    columns: dict[str, np.ndarray]
    req_ids: list[str]
    has_structured_output_requests: bool
    pending_structured_output_tokens: bool
    drafts_needed: bool
    grammar_released: list[str] = field(default_factory=list)
    grammar_failed: list[str] = field(default_factory=list)
    scheduled_encoder_inputs: list[tuple[str, list[int]]] = field(default_factory=list)
    free_encoder_mm_hashes: list[str] = field(default_factory=list)
    encoder_mismatch: list[str] = field(default_factory=list)

    @property
    def new_block_ids_to_zero(self) -> list[int]:
        return self.step.new_block_ids_to_zero

    @property
    def has_sync_kv_loads(self) -> bool:
        return self.step.has_sync_kv_loads

    @property
    def preempted_req_ids(self) -> list[str]:
        return self.step.preempted_req_ids

    @property
    def finished_req_ids(self) -> list[str]:
        return self.step.finished_req_ids

    def column(self, name: str) -> np.ndarray:
        return self.columns[name]


@dataclass
class _FinishedRecord:
    record: int
    request_id: str
    finish_reason: str
    stop_reason: int | None
    session_continues: bool


@dataclass
class _TwinUpdate:
    """The twin's ``UpdateOutput`` in the core's ``StepUpdate`` shape."""

    rows: np.ndarray
    tokens: np.ndarray
    token_offsets: np.ndarray
    cached_tokens: np.ndarray
    finished: list[_FinishedRecord]
    spec_decoding_stats: Any
    errored: list[str]

    def __len__(self) -> int:
        return len(self.rows)

    @classmethod
    def of(cls, out: UpdateOutput) -> _TwinUpdate:
        records = out.records
        return cls(
            rows=np.array([r.entry for r in records], dtype=np.int32),
            tokens=np.array(out.tokens, dtype=np.uint32),
            token_offsets=np.array([0] + [r.tokens_end for r in records], dtype=np.int64),
            cached_tokens=np.array([r.cached_tokens for r in records], dtype=np.int64),
            finished=[
                _FinishedRecord(
                    f.record,
                    f.request_id,
                    f.status.finish_reason or "error",
                    f.stop_reason,
                    f.session_continues,
                )
                for f in out.finished
            ],
            spec_decoding_stats=out.spec_decoding_stats,
            errored=[e.request_id for e in out.errored],
        )


class PythonBackend:
    """The plain-Python twin: the same calls, its columns made NumPy with
    the core's dtypes."""

    def __init__(self, scheduler_config: SchedulerConfig, cache_config: CacheConfig) -> None:
        self.twin = reference.Scheduler(scheduler_config, cache_config)

    def add_request(self, request: Request) -> None:
        p = request.sampling_params
        self.twin.add_request(
            NewRequest(
                request_id=request.request_id,
                prompt_token_ids=list(request.prompt_token_ids),
                stop=StopRules(
                    max_tokens=p.max_tokens,
                    min_tokens=p.min_tokens,
                    eos_token_id=eos_token_id(request),
                    stop_token_ids=list(p.stop_token_ids),
                    repetition=repetition(p.repetition_detection),
                ),
                priority=request.priority,
                arrival_time=request.arrival_time,
                cache_salt=request.cache_salt,
                skip_reading_prefix_cache=p.skip_reading_prefix_cache,
                structured_output=request.structured_output,
                resumable=request.resumable,
                lora=lora_adapter(request.lora_request),
                mm_inputs=mm_inputs(request.mm_features),
                prompt_embeds_digests=None
                if request.prompt_embeds is None
                else embeds_digests(
                    request.prompt_embeds,
                    self.twin.kv.hash_block_size,
                    self.twin.kv.hasher.lookahead,
                ),
            )
        )

    def has_request(self, request_id: str) -> bool:
        return self.twin.has_request(request_id)

    def report_grammar(self, request_id: str, compiled: bool) -> None:
        self.twin.report_grammar(request_id, compiled)

    def update_draft_token_ids(self, drafts: DraftTokenIds) -> None:
        self.twin.update_draft_token_ids(drafts.request_ids, drafts.tokens, drafts.offsets)

    def schedule_step(self, throttle_prefills: bool) -> _TwinStep:
        step: StepOutput = self.twin.schedule_throttled(throttle_prefills)
        columns = {
            name: np.array(getattr(step.columns, name), dtype=dtype)
            for name, dtype in STEP_COLUMNS.items()
        }
        name = self.twin.request
        return _TwinStep(
            step,
            columns,
            [name(e.slot).request_id for e in step.entries],
            step.has_structured_output_requests,
            step.pending_structured_output_tokens,
            step.drafts_needed,
            [name(slot).request_id for slot in step.grammar_released],
            [name(slot).request_id for slot in step.grammar_failed],
            [(name(x.slot).request_id, list(x.input_ids)) for x in step.scheduled_encoder_inputs],
            list(step.free_encoder_mm_hashes),
            [name(slot).request_id for slot in step.encoder_mismatch],
        )

    @staticmethod
    def checker(accept: Accept) -> Callable[[int, Any, list[int]], bool]:
        """``accept`` as the twin asks it: by slot and request."""
        return lambda _slot, request, kept: judge(accept, request.request_id, kept)

    def apply_tokens(
        self,
        *,
        step: _TwinStep,
        token_ids: np.ndarray,
        offsets: np.ndarray | None,
        accept: Callable[[int, Any, list[int]], bool] | None,
        kv_connector_output: Any = None,
        errors: Sequence[str] = (),
        end_order: EndOrder | None = None,
    ) -> _TwinUpdate:
        flat = token_ids
        if offsets is None:  # one token per row, -1 for none
            n = len(step.req_ids)
            if len(flat) != n:  # as the core words it
                raise ValueError(
                    f"sampled has {len(flat)} entries; the step scheduled {n} requests"
                )
            if flat.size and (flat.min() < -1 or flat.max() > 2**32 - 1):
                bad = int(np.flatnonzero((flat < -1) | (flat > 2**32 - 1))[0])
                raise ValueError(f"sampled[{bad}] = {flat[bad]} is neither -1 nor a token id")
            given = flat != -1
            tokens = flat[given].tolist()
            offsets = np.zeros(len(flat) + 1, dtype=np.int64)
            np.cumsum(given, out=offsets[1:])
        else:
            tokens = flat.tolist()
        report = kv_transfer_report(kv_connector_output)
        update = self.twin.update_with_kv_report(
            step.step,
            tokens,
            offsets.tolist(),
            accept or reference_accept_all,
            report,
            self._errors(errors, end_order),
        )
        return _TwinUpdate.of(update)

    def _errors(self, errors: Sequence[str], end_order: EndOrder | None) -> RequestErrors:
        """``errors`` and ``end_order`` as the twin takes them (refused as
        the core refuses them)."""
        if isinstance(errors, str):
            raise TypeError("errors must be a collection of request ids, got str")
        if end_order is not None and not callable(end_order):
            raise TypeError(f"end_order must be callable, got {type(end_order).__name__}")
        order = None if end_order is None else self._slot_order(end_order)
        return RequestErrors(list(errors), order)

    def _slot_order(self, end_order: EndOrder) -> Callable[[ErrorGroups], list[int]]:
        """``end_order`` (by request id) as the twin asks it (by slot). An
        answer that raises or names another request goes to
        ``sys.unraisablehook``, as the core reports it, and the twin's own
        order stands."""
        requests = self.twin.requests

        def by_slot(groups: ErrorGroups) -> list[int]:
            searches = (groups.whole, groups.loading, groups.running, groups.requested)
            slot_of = {requests[slot].request_id: slot for g in searches for slot in g}
            try:
                ids = end_order(*([requests[slot].request_id for slot in g] for g in searches))
                return [slot_of[rid] for rid in ids]
            except Exception as e:  # a caller's hook: reported, never raised through
                sys.unraisablehook(unraisable(e, end_order))
                return []

        return by_slot

    def apply_pooled(
        self,
        step: _TwinStep,
        pooled: list[bool],
        kv_connector_output: Any = None,
        errors: Sequence[str] = (),
        end_order: EndOrder | None = None,
    ) -> _TwinUpdate:
        report = kv_transfer_report(kv_connector_output)
        update = self.twin.update_pooled_with_kv_report(
            step.step, pooled, report, self._errors(errors, end_order)
        )
        return _TwinUpdate.of(update)

    def finish_requests(self, request_ids: list[str], status: str) -> None:
        self.twin.finish_requests(request_ids, reference.RequestStatus[status])

    def set_kv_connector(self, connector: Any, setup: KvConnectorSetup) -> None:
        self.twin.set_kv_connector(connector, setup)

    def set_ec_connector(self, connector: Any) -> None:
        self.twin.set_ec_connector(connector)

    def pin_blocks(self, block_ids: Sequence[int]) -> None:
        self.twin.pin_blocks(list(block_ids))

    def unpin_blocks(self, block_ids: Sequence[int]) -> None:
        self.twin.unpin_blocks(list(block_ids))

    def pin_requests(self) -> Any:
        return self.twin.pin_requests

    def take_pin_errors(self) -> list[str]:
        return self.twin.take_pin_errors()

    def reset_prefix_cache(self, reset_running_requests: bool) -> bool:
        return self.twin.reset_prefix_cache(reset_running_requests)

    def make_stats(self) -> SchedulerStats:
        return self.twin.make_stats()

    def num_free_blocks(self) -> int:
        return self.twin.kv.num_free_blocks

    def debug_state(self) -> dict[str, Any]:
        return self.twin.debug_state()
