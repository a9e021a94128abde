"""The scheduler's side of a KV connector (docs/scheduling.md §4.19): what
the scheduler asks a connector and tells it. The connector itself lives
outside the scheduler (vLLM's, or a caller's); the scheduler calls it at the
points vLLM 0.33's scheduler does, in its order.

``SafeConnector`` is how both backends call a connector written in Python
(the core through its binding): a call that raises or answers with the
wrong shape goes to ``sys.unraisablehook`` and counts as the safe answer
(ask again later, no hold, no pending frees), so a failing connector stalls
its own requests, never a step."""

from __future__ import annotations

import enum
import sys
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class ExternalHit:
    """A connector's answer to "how many tokens past the local hit can you
    supply?"."""

    #: Tokens past the local hit the connector supplies.
    num_tokens: int
    #: They arrive over later steps (the request waits for them), not in the
    #: step that schedules it.
    load_async: bool

    def fits(self, num_tokens: int, num_local: int) -> bool:
        """Whether the answer keeps the contract for a request of
        ``num_tokens`` with ``num_local`` hit locally: never past its
        tokens, an async load brings at least one, a synchronous one leaves
        one to compute. (vLLM asserts these; a broken answer counts as "ask
        again later", so one bad answer stalls only its request.)"""
        left = max(num_tokens - num_local, 0)
        if self.load_async:
            return 1 <= self.num_tokens <= left
        return self.num_tokens == 0 or self.num_tokens < left


NO_HIT = ExternalHit(0, False)


class LoadFailurePolicy(enum.Enum):
    """What becomes of a request whose KV load failed (vLLM's
    ``kv_load_failure_policy``)."""

    #: It ends with an error (vLLM's default).
    FAIL = "fail"
    #: It computes the tokens that did not arrive.
    RECOMPUTE = "recompute"


@dataclass(frozen=True)
class KvConnectorSetup:
    """How the scheduler works with its connector: vLLM's settings, which
    it derives from the deployment's ``kv_transfer_config``."""

    load_failure_policy: LoadFailurePolicy = LoadFailurePolicy.FAIL
    #: Blocks freed while a step in flight may still write them wait until
    #: that step's output is back (vLLM's ``defer_block_free``: a consumer
    #: role with more than one step in flight, where a load into reused
    #: blocks is not ordered against that write).
    defer_block_free: bool = False
    #: A preempted request's output in flight is dropped, not delivered
    #: (the connector's ``requires_kv_delivery``).
    requires_kv_delivery: bool = False
    #: It completes a hybrid's divergent local hits (the connector's
    #: ``supports_divergent_local_hybrid_hits``): beside cached recurrent
    #: states it is told full attention's own hit (§4.19.2).
    divergent_hybrid_hits: bool = False


@dataclass(frozen=True)
class KvTransferReport:
    """The worker's report of a step's KV transfers (vLLM's
    ``KVConnectorOutput``, the parts the scheduler reads)."""

    #: Loads done (or, for a request that finished meanwhile, over).
    finished_recving: tuple[str, ...] = ()
    #: Sends done: the requests' held blocks may go.
    finished_sending: tuple[str, ...] = ()
    #: Loads that failed whole.
    failed_recving: tuple[str, ...] = ()
    #: Blocks whose load failed.
    invalid_block_ids: tuple[int, ...] = ()

    def is_empty(self) -> bool:
        return not (
            self.finished_recving
            or self.finished_sending
            or self.failed_recving
            or self.invalid_block_ids
        )


NO_REPORT = KvTransferReport()


def load_failure_policy(name: str) -> LoadFailurePolicy:
    """The policy named ``name`` (ValueError for another)."""
    try:
        return LoadFailurePolicy(name)
    except ValueError:
        raise ValueError(
            f"kv_load_failure_policy must be 'fail' or 'recompute', got {name!r}"
        ) from None


def kv_report(obj: Any) -> KvTransferReport:
    """The worker's report of a step's KV transfers, read from any object
    with vLLM's ``KVConnectorOutput`` attributes (``finished_recving``,
    ``finished_sending``, ``failed_recving``, ``invalid_block_ids``; absent
    or None: empty), each iterated in its own order."""
    if obj is None:
        return NO_REPORT

    def ids(name: str) -> tuple[str, ...]:
        value = getattr(obj, name, None)
        if value is None:
            return ()
        if isinstance(value, str):
            raise TypeError(
                f"kv_connector_output.{name} must be a collection of request ids, got str"
            )
        out = tuple(value)
        if not all(isinstance(rid, str) for rid in out):
            raise TypeError(f"kv_connector_output.{name} must hold str")
        return out

    blocks = getattr(obj, "invalid_block_ids", None) or ()
    invalid: list[int] = []
    for b in blocks:
        if isinstance(b, bool) or not isinstance(b, int) or not 0 <= b < 2**32:
            raise ValueError(f"kv_connector_output.invalid_block_ids: {b} is not a block id")
        invalid.append(b)
    return KvTransferReport(
        finished_recving=ids("finished_recving"),
        finished_sending=ids("finished_sending"),
        failed_recving=ids("failed_recving"),
        invalid_block_ids=tuple(invalid),
    )


@dataclass(frozen=True)
class RequestState:
    """A request as vLLM's scheduler holds it at the moment of a connector
    call: what a connector reading vLLM's ``Request`` and ``KVCacheBlocks``
    would see (its tokens, its computed count and status before the call's
    admission changes them, and which of its blocks hold cached KV, i.e.
    have a block hash)."""

    request_id: str
    token_ids: list[int]
    num_computed_tokens: int
    status: str  # as vLLM spells it
    #: Per KV-cache group, the positions in its table whose block has a
    #: block hash (a window's nulls have none).
    cached_blocks: list[list[int]]


class KvConnector(Protocol):
    """The scheduler's calls into a KV connector (request ids, token counts
    and block ids per KV-cache group)."""

    def get_num_new_matched_tokens(
        self, request_id: str, num_tokens: int, num_computed_tokens: int
    ) -> tuple[int | None, bool]: ...

    def update_state_after_alloc(
        self, request_id: str, block_ids: list[list[int]], num_external_tokens: int
    ) -> None: ...

    def request_finished(
        self, request_id: str, block_ids: list[list[int]], status: str
    ) -> bool: ...


class SafeConnector:
    """A ``KvConnector`` called so that its failures stay its own."""

    def __init__(self, connector: Any) -> None:
        self.connector = connector
        # Optional; looked up once: it is called before each call that
        # names a request.
        self.observes = hasattr(connector, "observe_request")
        self.hears_reconciled = hasattr(connector, "local_hit_reconciled")
        self.hears_settled = hasattr(connector, "external_hit_settled")

    def observe_request(self, r: RequestState) -> None:
        """The request the next call names, as vLLM's scheduler holds it then
        (the vLLM drop-in brings vLLM's ``Request`` up to date from it)."""
        if self.observes:
            args = (
                r.request_id,
                list(r.token_ids),
                r.num_computed_tokens,
                r.status,
                [list(p) for p in r.cached_blocks],
            )
            self._call("observe_request", args, lambda _: None, None)

    def _call(self, name: str, args: tuple[Any, ...], read: Any, fallback: Any) -> Any:
        try:
            return read(getattr(self.connector, name)(*args))
        except Exception as e:  # noqa: BLE001 (reported, then the safe answer)
            sys.unraisablehook(unraisable(e, self.connector))
            return fallback

    def get_num_new_matched_tokens(
        self, request_id: str, num_tokens: int, num_computed_tokens: int
    ) -> ExternalHit | None:
        def read(answer: Any) -> ExternalHit | None:
            if not isinstance(answer, tuple) or len(answer) != 2:
                raise TypeError(f"the answer must be a tuple (tokens, load_async), got {answer!r}")
            n, load_async = answer
            if n is None:
                return None
            if not isinstance(n, int) or n < 0:
                raise TypeError(f"the external token count must be an int >= 0, got {n!r}")
            if not isinstance(load_async, bool):
                raise TypeError(f"load_async must be a bool, got {load_async!r}")
            return ExternalHit(int(n), load_async)

        args = (request_id, num_tokens, num_computed_tokens)
        return self._call("get_num_new_matched_tokens", args, read, None)

    def update_state_after_alloc(
        self, request_id: str, block_ids: list[list[int]], num_external_tokens: int
    ) -> None:
        args = (request_id, block_ids, num_external_tokens)
        self._call("update_state_after_alloc", args, lambda _: None, None)

    def local_hit_reconciled(self, request_id: str, num_computed_tokens: int) -> None:
        """The local hit found again after the connector answered no tokens
        for a divergent hybrid hit (§4.19.2): the request takes
        ``num_computed_tokens``, fewer than it was asked with (vLLM's
        scheduler counts its stats from this hit)."""
        if self.hears_reconciled:
            args = (request_id, num_computed_tokens)
            self._call("local_hit_reconciled", args, lambda _: None, None)

    def external_hit_settled(self, request_id: str, hit: ExternalHit) -> None:
        """The external hit ``request_id``'s admission takes, as it stands
        once routed experts capped it (§7.12) and no encoder output it needs
        is still in transit (§4.20): where vLLM's scheduler sets the
        request's load stage."""
        if self.hears_settled:
            args = (request_id, hit.num_tokens, hit.load_async)
            self._call("external_hit_settled", args, lambda _: None, None)

    def request_finished(self, request_id: str, block_ids: list[list[int]], status: str) -> bool:
        args = (request_id, block_ids, status)
        return self._call("request_finished", args, bool, False)

    def loaded_groups(self, request_id: str, num_groups: int) -> list[int]:
        """The KV-cache groups (of ``num_groups``) an asynchronous load of
        ``request_id`` writes (vLLM's ``get_loaded_kv_cache_group_ids``):
        their blocks for the external tokens are not listed for zeroing,
        which would race the load. Every group unless the connector says."""
        every = list(range(num_groups))
        if not hasattr(self.connector, "get_loaded_kv_cache_group_ids"):
            return every

        def read(groups: Any) -> list[int]:
            # As the core reads them: ints >= 0, nothing else (a float or a
            # bool is refused, and the safe answer stands).
            out = list(groups)
            if any(type(g) is not int or g < 0 for g in out):
                raise TypeError(f"group ids must be ints >= 0, got {groups!r}")
            return out

        return self._call("get_loaded_kv_cache_group_ids", (request_id,), read, every)

    def has_pending_block_frees(self) -> bool:
        if not hasattr(self.connector, "has_pending_block_frees"):
            return False
        return self._call("has_pending_block_frees", (), bool, False)


def unraisable(e: BaseException, obj: Any) -> Any:
    """What ``sys.unraisablehook`` takes."""

    class Unraisable:
        exc_type = type(e)
        exc_value = e
        exc_traceback = e.__traceback__
        err_msg = None
        object = obj

    return Unraisable()
