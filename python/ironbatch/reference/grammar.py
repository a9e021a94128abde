"""A structured-output request's grammar as the scheduler sees it
(docs/scheduling.md §4.10): the request waits, skipped by every waiting pass,
until its grammar has compiled, and the news counts only when a pass reaches
the request (vLLM reads the compile result at that point). Once released, the
request schedules like any other; the caller checks its sampled tokens
against the grammar."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Grammar(enum.Enum):
    """Where the grammar is."""

    #: Compiling, as far as the caller has said: the request is held.
    COMPILING = enum.auto()
    #: Compiled; released when a waiting pass next reaches the request.
    COMPILED = enum.auto()
    #: Failed to compile; reported each time a waiting pass reaches the
    #: request, which stays held until the caller ends it.
    FAILED = enum.auto()
    #: Released: the request is scheduled as any other.
    ACTIVE = enum.auto()

    def report(self, compiled: bool) -> Grammar:
        """The state after the caller's news of the compile; refused
        (``ValueError``) once the request is released."""
        if self is Grammar.ACTIVE:
            raise ValueError("its grammar is already in use")
        return Grammar.COMPILED if compiled else Grammar.FAILED

    def reach(self) -> tuple[Grammar, Reached]:
        """A waiting pass reached the request: the new state, and what the
        pass does with it."""
        if self is Grammar.COMPILING:
            return self, Reached(go=False, failed=False, released=False)
        if self is Grammar.FAILED:
            return self, Reached(go=False, failed=True, released=False)
        if self is Grammar.COMPILED:
            return Grammar.ACTIVE, Reached(go=True, failed=False, released=True)
        return self, Reached(go=True, failed=False, released=False)

    @property
    def holds(self) -> bool:
        """Whether a waiting pass would skip the request."""
        return self is not Grammar.ACTIVE


@dataclass(frozen=True)
class Reached:
    """What a waiting pass does with a request it reaches: skip it unless
    ``go``; report a failed compile (``failed``); note that this pass
    released it (``released``)."""

    go: bool
    failed: bool
    released: bool
