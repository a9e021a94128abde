"""KV connectors in an ironbatch-trace/1 trace (``docs/trace-format.md``
§3.7): the scheduler's calls to its connector, each with the connector's
answer, and the worker's report of each step's transfers.

A connector's answers are not decisions of the scheduler; they are inputs,
as sampled tokens are. The replay therefore needs no connector: a
``TraceConnector`` answers each call from the record and logs the calls it
got, so a replay whose scheduler asks something else, or tells the
connector other blocks, differs at that call. The recorder
(``benches/record_vllm.py --connector``) writes the same entries from the
calls vLLM's scheduler made, through ``matched_call``, ``allocated_call``
and ``finished_call``, so the two sides share one shape."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Optional keys (the growth rule): a trace without them has no connector.
CONNECTOR = "kv_connector"  # in "config": the scheduler's connector settings
CALLS = "connector_calls"  # on the step line: the calls, in order, answered
REPORT = "kv_connector_output"  # on the step line: the worker's report

POLICIES = ("fail", "recompute")
REPORT_FIELDS = ("finished_recving", "finished_sending", "failed_recving", "invalid_block_ids")


def load_failure_policy(config: dict[str, Any]) -> str | None:
    """The config's connector setting (its ``kv_load_failure_policy``,
    vLLM's default ``"fail"`` where missing); None: no connector."""
    settings = config.get(CONNECTOR)
    if settings is None:
        return None
    if not isinstance(settings, dict):
        raise TypeError(f"{CONNECTOR} must be an object or null, got {type(settings).__name__}")
    policy = settings.get("kv_load_failure_policy", "fail")
    if policy not in POLICIES:
        raise ValueError(
            f"{CONNECTOR}.kv_load_failure_policy must be one of {POLICIES}, got {policy!r}"
        )
    return policy


def matched_call(
    request_id: str, num_computed_tokens: int, num_external_tokens: int | None, load_async: bool
) -> list[Any]:
    """``get_num_new_matched_tokens`` asked past ``num_computed_tokens``
    local tokens, and the answer (None tokens: ask again later)."""
    return ["matched", request_id, num_computed_tokens, num_external_tokens, load_async]


def allocated_call(request_id: str, block_ids: list[int], num_external_tokens: int) -> list[Any]:
    """``update_state_after_alloc``: the request's blocks after admission,
    and the external tokens it takes."""
    return ["allocated", request_id, block_ids, num_external_tokens]


def finished_call(request_id: str, block_ids: list[int], delay_free: bool) -> list[Any]:
    """``request_finished``: the blocks handed over, and whether the
    connector holds them (frees them when its send is reported done)."""
    return ["finished", request_id, block_ids, delay_free]


# Each kind's fields after the request id, with the types they must have.
_SHAPES: dict[str, tuple[tuple[str, Any], ...]] = {
    "matched": (
        ("num_computed_tokens", int),
        ("num_external_tokens", (int, type(None))),
        ("load_async", bool),
    ),
    "allocated": (("block_ids", list), ("num_external_tokens", int)),
    "finished": (("block_ids", list), ("delay_free", bool)),
}


def check_calls(calls: Any) -> list[list[Any]]:
    """A step line's ``connector_calls``, checked: a list of entries, each
    ``[kind, request_id, ...]`` in its kind's shape."""
    if not isinstance(calls, list):
        raise TypeError(f"{CALLS} must be a list, got {type(calls).__name__}")
    for i, call in enumerate(calls):
        where = f"{CALLS}[{i}]"
        if not isinstance(call, list) or len(call) < 2 or call[0] not in _SHAPES:
            kinds = tuple(_SHAPES)
            raise ValueError(f"{where} must be [kind, request_id, ...], kind one of {kinds}")
        shape = _SHAPES[call[0]]
        if len(call) != 2 + len(shape):
            names = ", ".join(name for name, _ in shape)
            raise ValueError(f"{where}: a {call[0]!r} entry is [kind, request_id, {names}]")
        if not isinstance(call[1], str):
            raise TypeError(f"{where}: request_id must be a string")
        for (name, kind), value in zip(shape, call[2:], strict=True):
            wrong_int = kind is int and isinstance(value, bool)
            if not isinstance(value, kind) or wrong_int or (kind is list and not _ints(value)):
                raise TypeError(f"{where}: {name} has the wrong type ({value!r})")
    return calls


def _ints(values: list[Any]) -> bool:
    return all(isinstance(v, int) and not isinstance(v, bool) for v in values)


@dataclass(frozen=True)
class TraceReport:
    """A step's recorded worker report, with the fields of vLLM's
    ``KVConnectorOutput`` that the scheduler reads, in recorded order."""

    finished_recving: list[str]
    finished_sending: list[str]
    failed_recving: list[str]
    invalid_block_ids: list[int]

    @classmethod
    def of(cls, record: Any) -> TraceReport | None:
        """A step line's ``kv_connector_output`` (an object of lists, fields
        absent or null: empty; null: no report)."""
        if record is None:
            return None
        if not isinstance(record, dict):
            raise TypeError(f"{REPORT} must be an object or null, got {type(record).__name__}")
        fields = {}
        for name in REPORT_FIELDS:
            value = record.get(name) or []
            if not isinstance(value, list):
                raise TypeError(f"{REPORT}.{name} must be a list, got {type(value).__name__}")
            fields[name] = value
        return cls(**fields)


def report_record(output: Any) -> dict[str, list[Any]] | None:
    """What a step line records of a worker report (anything with vLLM's
    ``KVConnectorOutput`` fields): each field as a list in the order the
    scheduler iterates it (vLLM's are sets, whose order a later process
    cannot rebuild), empty fields left out; None: no report, or an empty
    one."""
    if output is None:
        return None
    record = {}
    for name in REPORT_FIELDS:
        if values := list(getattr(output, name, None) or ()):
            record[name] = values
    return record or None


class TraceConnector:
    """The replay's connector: answers each call from the step's recorded
    calls and logs the calls it got (``calls``), in the trace's shape. A
    call that is not the recorded one at its place gets the safe answer (no
    external tokens, no hold); the replay then reports where they part."""

    def __init__(self) -> None:
        self.recorded: list[list[Any]] = []
        self.calls: list[list[Any]] = []

    def begin_step(self, recorded: list[list[Any]]) -> None:
        self.recorded = recorded
        self.calls = []

    def _recorded(self, kind: str, request_id: str) -> list[Any] | None:
        i = len(self.calls)
        if i < len(self.recorded) and self.recorded[i][:2] == [kind, request_id]:
            return self.recorded[i]
        return None

    def get_num_new_matched_tokens(
        self, request_id: str, num_tokens: int, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        record = self._recorded("matched", request_id)
        answer = (record[3], record[4]) if record is not None else (0, False)
        self.calls.append(matched_call(request_id, num_computed_tokens, *answer))
        return answer

    def update_state_after_alloc(
        self, request_id: str, block_ids: list[list[int]], num_external_tokens: int
    ) -> None:
        self.calls.append(allocated_call(request_id, block_ids[0], num_external_tokens))

    def request_finished(self, request_id: str, block_ids: list[list[int]], status: str) -> bool:
        record = self._recorded("finished", request_id)
        delay_free = bool(record[3]) if record is not None else False
        self.calls.append(finished_call(request_id, block_ids[0], delay_free))
        return delay_free

    def first_difference(self, complete: bool) -> tuple[str, Any, Any] | None:
        """Where the calls so far part from the record: (field, recorded,
        replayed), None if they agree. ``complete``: the step is over, so
        recorded calls not made differ too."""
        for i, call in enumerate(self.calls):
            recorded = self.recorded[i] if i < len(self.recorded) else None
            if call != recorded:
                return f"{CALLS}[{i}]", recorded, call
        if complete and len(self.recorded) > len(self.calls):
            i = len(self.calls)
            return f"{CALLS}[{i}]", self.recorded[i], None
        return None
