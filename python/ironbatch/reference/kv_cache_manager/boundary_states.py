"""Boundary states a KV connector can offload (vLLM's
``take_boundary_state_offloads``, docs/scheduling.md §4.19.2 rule 7): each
state block a recurrent group hash-caches in cache mode "align", with the
token boundary its key holds. A state block is no token range a connector
could resolve by position (a table's past states go back to the pool), so
each is named with its block."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BoundaryState:
    """The request in ``owner`` cached group ``group``'s block ``block_id``
    as the state after ``num_tokens`` tokens."""

    owner: int
    group: int
    block_id: int
    num_tokens: int


class BoundaryStates:
    """The states offered since they were last taken; none are kept unless
    a connector is attached."""

    def __init__(self) -> None:
        self._offered: list[BoundaryState] = []
        self.enabled = False

    def enable(self) -> None:
        """Keep offers from now on."""
        self.enabled = True

    def offer(self, state: BoundaryState) -> None:
        """Offer ``state``."""
        if self.enabled:
            self._offered.append(state)

    def take(self) -> list[BoundaryState]:
        """The offers so far, oldest first, leaving none."""
        offered, self._offered = self._offered, []
        return offered

    def withdraw(self, owner: int) -> None:
        """Withdraw the offers of the request in ``owner``, whose blocks go
        back to the pool before the offers were taken (another request may
        be handed those blocks)."""
        if self._offered:
            self._offered = [s for s in self._offered if s.owner != owner]
