"""Scheduler: vLLM 0.33's V1 decisions behind a vLLM-shaped API, on the Rust
core (``backend="rust"``) or on the plain-Python twin (``backend="python"``).

Both backends are driven the same way and must decide the same; the façade
validates input once, so both reject it alike and neither changes state.

A Scheduler is single-threaded, like vLLM's: one caller at a time (an
engine serializes its threads' calls; ``LLMEngine`` does). A call made while
another thread is inside raises ``RuntimeError`` and changes nothing, on
either backend."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

from ironbatch.config import CacheConfig, SchedulerConfig, check_fits
from ironbatch.core_scheduler import EndOrder
from ironbatch.reference.args import u32_list
from ironbatch.reference.kv_connector import KvConnectorSetup, load_failure_policy
from ironbatch.reference.request import FINISHED_STATUS_NAMES
from ironbatch.request import Request
from ironbatch.scheduler_backends import (
    Accept,
    DraftTokenIds,
    PythonBackend,
    RustBackend,
    Sampled,
)
from ironbatch.scheduler_output import SchedulerOutput, UpdateOutputs
from ironbatch.scheduler_stats import SchedulerStats

BACKENDS = {"rust": RustBackend, "python": PythonBackend}
_INT64 = np.dtype(np.int64)


F = TypeVar("F", bound=Callable[..., Any])


#: No errors to end (``update_from_output``'s default, known by identity).
_NO_ERRORS: tuple[str, ...] = ()


def _exclusive(method: F) -> F:
    """Refuse a call while another thread is inside this scheduler: the core
    and the façade's request map change together or not at all."""

    @functools.wraps(method)
    def call(self: Scheduler, *args: Any, **kwargs: Any) -> Any:
        if not self._in_use.acquire(blocking=False):
            raise _concurrent_call(method.__name__)
        try:
            return method(self, *args, **kwargs)
        finally:
            self._in_use.release()

    return call  # type: ignore[return-value]


def _concurrent_call(name: str) -> RuntimeError:
    return RuntimeError(
        f"Scheduler.{name}() was called while another thread is inside this Scheduler; "
        "a Scheduler is single-threaded (serialize its calls, as LLMEngine does). "
        "Nothing was changed."
    )


class Scheduler:
    def __init__(
        self,
        scheduler_config: SchedulerConfig,
        cache_config: CacheConfig,
        backend: str = "rust",
    ) -> None:
        if not isinstance(scheduler_config, SchedulerConfig):
            raise TypeError(
                f"scheduler_config must be a SchedulerConfig, got {type(scheduler_config).__name__}"
            )
        if not isinstance(cache_config, CacheConfig):
            raise TypeError(
                f"cache_config must be a CacheConfig, got {type(cache_config).__name__}"
            )
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {sorted(BACKENDS)}, got {backend!r}")
        check_fits(scheduler_config, cache_config)
        self.scheduler_config = scheduler_config
        self.cache_config = cache_config
        self.backend = backend
        self._core = BACKENDS[backend](scheduler_config, cache_config)
        # A step's two calls, bound once (the core's own methods on "rust").
        self._schedule_step = self._core.schedule_step
        self._apply_tokens = self._core.apply_tokens
        self._num_kv_cache_groups = cache_config.num_kv_cache_groups
        self.requests: dict[str, Request] = {}  # unfinished requests, by id
        self._lookup_request = self.requests.__getitem__  # made once: schedule() is hot
        self._in_use = threading.Lock()

    @_exclusive
    def add_request(self, request: Request) -> None:
        """Queue a request. ``Request`` checked its own fields; the backend
        refuses (ValueError, nothing changed) a live duplicate id, or a
        prompt that leaves no room for one output token within
        max_model_len. Under the id of a live streaming session (a request
        added with ``resumable=True``) it is the session's next chunk: it
        continues the session when its turn is over, and one that is not
        resumable ends the input (docs/scheduling.md §4.12)."""
        if not isinstance(request, Request):
            raise TypeError(f"request must be an ironbatch.Request, got {type(request).__name__}")
        rid = request.request_id
        self._core.add_request(request)
        if rid not in self.requests:
            self.requests[rid] = request
        elif not self._core.has_request(rid):
            del self.requests[rid]  # its end of input ended a waiting session

    def schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:
        """One step. ``throttle_prefills`` holds prefill work back this step,
        as a data-parallel engine asks its ranks to (docs/scheduling.md
        §4.11)."""
        if throttle_prefills is not False and throttle_prefills is not True:
            # Both backends alike (the twin would take any truthy value).
            raise TypeError(
                f"throttle_prefills must be a bool, got {type(throttle_prefills).__name__}"
            )
        # The guard inline, not through _exclusive: this is the hot path.
        if not self._in_use.acquire(blocking=False):
            raise _concurrent_call("schedule")
        try:
            return SchedulerOutput(
                self._schedule_step(throttle_prefills),
                self._lookup_request,
                self._num_kv_cache_groups,
            )
        finally:
            self._in_use.release()

    @_exclusive
    def report_grammar(self, request_id: str, compiled: bool = True) -> None:
        """A structured-output request's grammar compiled (or, with
        ``compiled=False``, failed). It counts when a waiting pass next
        reaches the request, as in vLLM: a compiled one is then released
        (``SchedulerOutput.grammar_released_req_ids``), a failed one is
        reported (``grammar_failed_req_ids``) and stays held until
        ``finish_requests([id], "FINISHED_ERROR")``. Refused (ValueError,
        nothing changed) for an unknown id, a request without
        ``structured_output``, or one already released."""
        if not isinstance(request_id, str):
            raise TypeError(f"request_id must be a str, got {type(request_id).__name__}")
        if not isinstance(compiled, bool):
            raise TypeError(f"compiled must be a bool, got {type(compiled).__name__}")
        self._core.report_grammar(request_id, compiled)

    @_exclusive
    def update_draft_token_ids(self, draft_token_ids: Mapping[str, Sequence[int]]) -> None:
        """Drafts for the requests' next steps (speculative decoding, with
        ``SchedulerConfig.num_speculative_tokens`` > 0; docs/scheduling.md
        §4.13), as vLLM's engine hands them over after each step's output:
        each replaces what its request had; ids that finished meanwhile are
        skipped, and a request whose last step was a prefill chunk gets
        none. A token is an id, or -1 for a slot the proposer left empty
        (vLLM's ``ngram_gpu`` padding: scheduled and counted as a draft,
        always rejected). Refused (ValueError, nothing changed) for more
        than ``num_speculative_tokens`` drafts or any other token."""
        if not isinstance(draft_token_ids, Mapping):
            raise TypeError(
                f"draft_token_ids must be a mapping, got {type(draft_token_ids).__name__}"
            )
        self._core.update_draft_token_ids(DraftTokenIds.of(draft_token_ids))

    def update_from_output(
        self,
        scheduler_output: SchedulerOutput,
        sampled: Mapping[str, Sequence[int]] | np.ndarray | Sequence[int],
        accept: Accept | None = None,
        kv_connector_output: Any = None,
        end_order: EndOrder | None = None,
        errors: Iterable[str] = _NO_ERRORS,
    ) -> UpdateOutputs:
        """Apply a step's sampled tokens: ``{request_id: [token, ...]}``, or
        one token per scheduled request in scheduling order (-1 = none).
        ``accept(request_id, kept)`` is asked about the tokens each
        structured-output request kept (after the stop check); False, or an
        exception (logged), ends it with ``"error"``, as vLLM does when its
        grammar rejects them. ``kv_connector_output`` is the worker's report
        of the step's KV transfers, anything with vLLM's
        ``KVConnectorOutput`` attributes (``finished_recving``,
        ``finished_sending``, ``failed_recving``, ``invalid_block_ids``;
        docs/scheduling.md §4.19); a report naming a request in no state for
        it, or a block outside the pool, is refused (``ValueError``) with
        nothing changed. ``errors`` names requests to end with an error
        after the output (a grammar that failed to compile, an encoder
        input gone); unknown and finished ones are skipped. They end with
        those a failed load ends under the ``"fail"`` policy, before
        finished loads and sends settle, as vLLM ends them: in one Python
        set's order, which a trace records. ``end_order(whole, loading,
        running, requested)`` gives that order: it gets each source's
        request ids and returns them all in the order to end them; an
        answer that raises or is not those ids is reported
        (``sys.unraisablehook``) and the scheduler's own order stands.
        Returns one record per request that got tokens, in scheduling order;
        ``errored`` names the requests the update ended with an error."""
        if not self._in_use.acquire(blocking=False):  # inline: the hot path
            raise _concurrent_call("update_from_output")
        try:
            if not isinstance(scheduler_output, SchedulerOutput):
                raise TypeError(
                    "scheduler_output must be a SchedulerOutput, got "
                    f"{type(scheduler_output).__name__}"
                )
            check = None
            if accept is not None:
                if not callable(accept):
                    raise TypeError(f"accept must be callable, got {type(accept).__name__}")
                check = self._core.checker(accept)
            if type(sampled) is np.ndarray and sampled.dtype is _INT64 and sampled.ndim == 1:
                # A model runner's own array, as the backends take it (they
                # check its length and values).
                flat, offsets = sampled, None
            else:
                flat, offsets = _sampled(scheduler_output, sampled)
            if end_order is not None and not callable(end_order):
                raise TypeError(f"end_order must be callable, got {type(end_order).__name__}")
            # (The default skips the check: this runs every step.)
            error_ids: Sequence[str] = (
                _NO_ERRORS if errors is _NO_ERRORS else _request_ids("errors", errors)
            )
            if kv_connector_output is None and not error_ids:  # the hot path
                update = self._apply_tokens(
                    step=scheduler_output._handle, token_ids=flat, offsets=offsets, accept=check
                )
            else:
                update = self._apply_tokens(
                    step=scheduler_output._handle,
                    token_ids=flat,
                    offsets=offsets,
                    accept=check,
                    kv_connector_output=kv_connector_output,
                    errors=error_ids,
                    end_order=end_order,
                )
            updates = UpdateOutputs(scheduler_output.req_ids, update)
            for rid in updates.finished_req_ids:  # usually none
                self.requests.pop(rid, None)
            for rid in update.errored:
                self.requests.pop(rid, None)
            return updates
        finally:
            self._in_use.release()

    @_exclusive
    def update_from_pooler_output(
        self,
        scheduler_output: SchedulerOutput,
        pooled: Iterable[str],
        kv_connector_output: Any = None,
        end_order: EndOrder | None = None,
        errors: Iterable[str] = (),
    ) -> UpdateOutputs:
        """Apply a pooling runner's step (``SchedulerConfig.runner =
        "pooling"``; docs/scheduling.md §4.16): ``pooled`` names the
        scheduled requests whose pooled result came back, each of which
        finishes (``"stop"``); the others ran a chunk of their prompt.
        ``kv_connector_output``, ``end_order`` and ``errors`` as
        ``update_from_output`` takes them (a request a failed load cut back
        gets no result).
        Refused (ValueError, nothing changed) for a request whose step ended
        inside its prompt, an id the step did not schedule, or a generating
        scheduler. Returns one record per finished request, with no tokens."""
        if not isinstance(scheduler_output, SchedulerOutput):
            raise TypeError(
                f"scheduler_output must be a SchedulerOutput, got {type(scheduler_output).__name__}"
            )
        if isinstance(pooled, str) or not isinstance(pooled, Iterable):
            raise TypeError(
                f"pooled must be an iterable of request ids, got {type(pooled).__name__}"
            )
        wanted = set(pooled)
        row_ids = scheduler_output.req_ids
        if unknown := wanted.difference(row_ids):
            raise ValueError(f"pooled: {sorted(map(str, unknown))} were not scheduled in this step")
        rows = [rid in wanted for rid in row_ids]
        if end_order is not None and not callable(end_order):
            raise TypeError(f"end_order must be callable, got {type(end_order).__name__}")
        update = self._core.apply_pooled(
            scheduler_output._handle,
            rows,
            kv_connector_output=kv_connector_output,
            errors=_request_ids("errors", errors),
            end_order=end_order,
        )
        updates = UpdateOutputs(row_ids, update)
        for rid in updates.finished_req_ids:
            self.requests.pop(rid, None)
        for rid in update.errored:
            self.requests.pop(rid, None)
        return updates

    @_exclusive
    def finish_requests(
        self, request_ids: str | Iterable[str], status: str = "FINISHED_ABORTED"
    ) -> None:
        """End requests from outside (an abort, or ``FINISHED_STOPPED`` for a
        stop string), freeing them in the order given; unknown and finished
        ids are ignored."""
        if isinstance(request_ids, str):
            ids = [request_ids]
        elif isinstance(request_ids, Iterable):
            ids = list(request_ids)
        else:
            raise TypeError(
                "request_ids must be a request id or an iterable of them, got "
                f"{type(request_ids).__name__}"
            )
        for rid in ids:
            if not isinstance(rid, str):
                raise TypeError(f"request_ids must hold str, got {type(rid).__name__}")
        if status not in FINISHED_STATUS_NAMES:
            raise ValueError(f"status must be one of {FINISHED_STATUS_NAMES}, got {status!r}")
        self._core.finish_requests(ids, status)
        for rid in ids:
            self.requests.pop(rid, None)

    @_exclusive
    def set_kv_connector(
        self,
        connector: Any,
        kv_load_failure_policy: str = "fail",
        *,
        defer_block_free: bool = False,
        requires_kv_delivery: bool = False,
        divergent_hybrid_hits: bool = False,
    ) -> None:
        """Attach a KV connector's scheduler side, before any request
        (docs/scheduling.md §4.19). ``connector`` answers by request id:
        ``get_num_new_matched_tokens(request_id, num_tokens,
        num_computed_tokens) -> (tokens | None, load_async)``,
        ``update_state_after_alloc(request_id, block_ids,
        num_external_tokens)``, ``request_finished(request_id, block_ids,
        status) -> hold``, and optionally ``has_pending_block_frees()``,
        ``get_loaded_kv_cache_group_ids(request_id)`` (the groups an
        asynchronous load writes, whose blocks are not zeroed; every group
        without it) and ``local_hit_reconciled(request_id,
        num_computed_tokens)`` (with ``divergent_hybrid_hits``: the local hit
        a request takes after the connector answered no tokens, fewer than
        it was asked with) and ``external_hit_settled(request_id, num_tokens,
        load_async)`` (the external hit an admission takes, once routed
        experts capped it and no encoder output it needs is in transit:
        where vLLM sets a request's load stage). A call that raises is
        reported (``sys.unraisablehook``) and counts as the safe answer.
        ``kv_load_failure_policy`` is vLLM's: a request whose load failed
        ends with an error (``"fail"``) or computes what
        did not arrive (``"recompute"``). ``defer_block_free`` fences frees:
        a request's blocks freed while a step in flight may still write them
        wait for that step's output, and such a request is not preempted
        (vLLM sets it for a consumer role with more than one step in
        flight). ``requires_kv_delivery`` drops a preempted request's output
        in flight (the connector's own flag). ``divergent_hybrid_hits``: the
        connector completes a hybrid's divergent local hits (vLLM's
        ``supports_divergent_local_hybrid_hits``, NIXL's): beside cached
        recurrent states it is told full attention's own hit (§4.19.2).
        Refused (``ValueError``) where vLLM takes no connector: cross-attention
        KV-cache groups, a model without a KV cache.
        The worker's reports come with each step's output
        (``update_from_output(kv_connector_output=...)``)."""
        for name, flag in (
            ("defer_block_free", defer_block_free),
            ("requires_kv_delivery", requires_kv_delivery),
            ("divergent_hybrid_hits", divergent_hybrid_hits),
        ):
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be a bool, got {type(flag).__name__}")
        setup = KvConnectorSetup(
            load_failure_policy=load_failure_policy(kv_load_failure_policy),
            defer_block_free=defer_block_free,
            requires_kv_delivery=requires_kv_delivery,
            divergent_hybrid_hits=divergent_hybrid_hits,
        )
        self._core.set_kv_connector(connector, setup)

    @_exclusive
    def set_ec_connector(self, connector: Any) -> None:
        """Attach an encoder-cache connector's scheduler side, before any
        request (docs/scheduling.md §4.20): encoder outputs moved between
        instances (encoder/prefill/decode disaggregation). ``connector``
        answers by request id: ``has_cache_item(identifier) -> bool`` (it
        supplies that encoder output: loaded into the encoder cache, not
        run, so it takes cache space and no encoder budget),
        ``ensure_cache_available(request_id, num_computed_tokens) -> bool``
        (false: an output the request needs is in transit, and it waits a
        step), ``update_state_after_alloc(request_id, input_id)``,
        ``update_state_after_free(request_id, input_id)`` and
        ``request_finished(request_id) -> hold`` (true keeps the request's
        KV blocks until a KV report names its send done). A call that
        raises is reported (``sys.unraisablehook``) and counts as the safe
        answer. Refused (``ValueError``) for a scheduler without an encoder
        whose outputs are shared by identifier (``encoder_compute_budget``),
        or after the first request."""
        self._core.set_ec_connector(connector)

    @_exclusive
    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        return self._core.reset_prefix_cache(reset_running_requests)

    @_exclusive
    def pin_blocks(self, block_ids: Iterable[int]) -> None:
        """Pin each listed block once, from outside any request: a KV
        connector that copies blocks out of the pool holds them so (vLLM's
        ``BlockPool.touch``; docs/scheduling.md §4.19). A pinned block is
        held: it leaves the free queue and a prefix-cache reset is refused.
        The null block (0) is passed over; any other id outside the pool is
        refused (``ValueError``, nothing changed)."""
        self._core.pin_blocks(_block_ids(block_ids))

    @_exclusive
    def unpin_blocks(self, block_ids: Iterable[int]) -> None:
        """Drop one pin per listed block, in the order given (vLLM's
        ``BlockPool.free_blocks``): a block nothing else holds goes back to
        the free queue, a cached one to its tail. Refused (``ValueError``,
        nothing changed) for a block listed more often than it is pinned."""
        self._core.unpin_blocks(_block_ids(block_ids))

    def pin_requests(self) -> Any:
        """A handle with ``pin(block_ids)`` and ``unpin(block_ids)`` that a
        KV connector may call from inside the scheduler's calls to it, where
        the scheduler cannot be called: the asks apply, in order, right
        after that call returns, or at the next ``schedule``, update,
        ``finish_requests`` or reset for asks made between calls. An ask
        that is refused changes nothing and is kept for
        ``take_pin_errors``."""
        return self._core.pin_requests()

    @_exclusive
    def take_pin_errors(self) -> list[str]:
        """Messages for the ``pin_requests`` asks refused since the last
        call, oldest first."""
        return self._core.take_pin_errors()

    @_exclusive
    def make_stats(self) -> SchedulerStats:
        return self._core.make_stats()

    @property
    @_exclusive
    def num_free_blocks(self) -> int:
        """Free KV-cache blocks (cached-but-unreferenced ones included)."""
        return self._core.num_free_blocks()

    def get_num_unfinished_requests(self) -> int:
        return len(self.requests)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    @_exclusive
    def debug_state(self) -> dict[str, Any]:
        """Everything the two backends must agree on, for differential tests."""
        return self._core.debug_state()


def _sampled(
    out: SchedulerOutput, sampled: Mapping[str, Sequence[int]] | np.ndarray | Sequence[int]
) -> Sampled:
    """Sampled tokens: a mapping becomes (flat tokens, offsets per scheduled
    row), checked; an aligned sequence becomes an int64 array (-1 = none)."""
    n = len(out.req_ids)
    if isinstance(sampled, Mapping):
        row = {rid: i for i, rid in enumerate(out.req_ids)}
        per_row: list[list[int]] = [[] for _ in range(n)]
        for rid, tokens in sampled.items():
            if rid not in row:
                raise ValueError(f"sampled: request {rid!r} was not scheduled in this step")
            per_row[row[rid]] = u32_list(f"sampled[{rid!r}]", tokens)
            # The backends check this too, by row; here it names the request.
            drafts = int(out.num_spec_tokens[row[rid]])
            if len(per_row[row[rid]]) > drafts + 1:
                raise ValueError(
                    f"sampled[{rid!r}]: {len(per_row[row[rid]])} tokens, but the step "
                    f"scheduled {drafts} drafts for it, so it samples at most {drafts + 1}"
                )
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum([len(t) for t in per_row], out=offsets[1:])
        flat = np.fromiter(
            (t for ts in per_row for t in ts), dtype=np.int64, count=int(offsets[-1])
        )
        return flat, offsets
    arr = np.asarray(sampled)
    if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
        raise TypeError(
            f"sampled must be a mapping or a 1-D int array, got {arr.dtype}[{arr.ndim}-D]"
        )
    # Its length against the step is the backend's check, as for a runner's
    # own int64 array.
    return arr.astype(np.int64, copy=False), None


def _request_ids(name: str, ids: Iterable[str]) -> list[str]:
    """``ids`` as a list of request ids, refused (TypeError) when it is a
    str (not read as its characters) or holds anything else."""
    if isinstance(ids, str) or not isinstance(ids, Iterable):
        raise TypeError(f"{name} must be an iterable of request ids, got {type(ids).__name__}")
    out = list(ids)
    for rid in out:
        if not isinstance(rid, str):
            raise TypeError(f"{name} must hold request ids (str), got {type(rid).__name__}")
    return out


def _block_ids(ids: Iterable[int]) -> list[int]:
    """``ids`` as a list of block ids (the backends check each value)."""
    if isinstance(ids, str | bytes) or not isinstance(ids, Iterable):
        raise TypeError(f"block_ids must be an iterable of block ids, got {type(ids).__name__}")
    return list(ids)
