"""The scheduler's side of an encoder-cache connector (docs/scheduling.md
§4.20): what vLLM 0.33's scheduler asks a connector that moves encoder
outputs between instances (encoder/prefill/decode disaggregation) and tells
it. The connector itself lives outside the scheduler; the scheduler calls it
at the points vLLM's does, in its order. What only the caller needs (the
connector's metadata for the workers, its report, the requests it can no
longer serve, its stats) stays with the caller.

A call that raises goes to ``sys.unraisablehook`` and counts as the safe
answer (compute it here, nothing in transit, no hold): a failing connector
costs encoder work, never a stalled request."""

from __future__ import annotations

import sys
from typing import Any, Protocol

from ironbatch.reference.kv_connector import unraisable


class EcConnector(Protocol):
    """The scheduler's calls into an encoder-cache connector, by request id
    and index into the request's encoder inputs."""

    def has_cache_item(self, identifier: str) -> bool: ...

    def ensure_cache_available(self, request_id: str, num_computed_tokens: int) -> bool: ...

    def update_state_after_alloc(self, request_id: str, input_id: int) -> None: ...

    def update_state_after_free(self, request_id: str, input_id: int) -> None: ...

    def request_finished(self, request_id: str) -> bool: ...


class SafeEcConnector:
    """An ``EcConnector`` called so that its failures stay its own."""

    def __init__(self, connector: Any) -> None:
        self.connector = connector

    def _call(self, name: str, args: tuple[Any, ...], fallback: bool | None) -> Any:
        try:
            answer = getattr(self.connector, name)(*args)
        except Exception as e:  # noqa: BLE001 (reported, then the safe answer)
            sys.unraisablehook(unraisable(e, self.connector))
            return fallback
        return None if fallback is None else bool(answer)

    def has_cache_item(self, identifier: str) -> bool:
        """Whether the connector can supply ``identifier``'s encoder output:
        then the step loads it instead of running the encoder (it takes
        cache space, not encoder budget)."""
        return self._call("has_cache_item", (identifier,), False)

    def ensure_cache_available(self, request_id: str, num_computed_tokens: int) -> bool:
        """Whether the encoder outputs the request needs past
        ``num_computed_tokens`` are there; false: it waits a step."""
        return self._call("ensure_cache_available", (request_id, num_computed_tokens), True)

    def update_state_after_alloc(self, request_id: str, input_id: int) -> None:
        self._call("update_state_after_alloc", (request_id, input_id), None)

    def update_state_after_free(self, request_id: str, input_id: int) -> None:
        self._call("update_state_after_free", (request_id, input_id), None)

    def request_finished(self, request_id: str) -> bool:
        """True holds the request's KV blocks until a KV connector's report
        names its send done."""
        return self._call("request_finished", (request_id,), False)
