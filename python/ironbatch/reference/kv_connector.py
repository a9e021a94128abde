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

    def _call(self, name: str, args: tuple[Any, ...], read: Any, fallback: Any) -> Any:
        try:
            return read(getattr(self.connector, name)(*args))
        except Exception as e:  # noqa: BLE001 (reported, then the safe answer)
            sys.unraisablehook(_unraisable(e, self.connector))
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

    def request_finished(self, request_id: str, block_ids: list[list[int]], status: str) -> bool:
        args = (request_id, block_ids, status)
        return self._call("request_finished", args, bool, False)

    def has_pending_block_frees(self) -> bool:
        if not hasattr(self.connector, "has_pending_block_frees"):
            return False
        return self._call("has_pending_block_frees", (), bool, False)


def _unraisable(e: BaseException, obj: Any) -> Any:
    """What ``sys.unraisablehook`` takes."""

    class Unraisable:
        exc_type = type(e)
        exc_value = e
        exc_traceback = e.__traceback__
        err_msg = None
        object = obj

    return Unraisable()
