"""The waiting queue (docs/scheduling.md §3.3): a deque under FCFS, an
ordered set under priority. Entries are request slots."""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Iterator
from typing import NamedTuple

from ironbatch.reference.request import Request
from ironbatch.reference.scheduler_config import Policy


class PriorityKey(NamedTuple):
    """The priority order: (priority, arrival_time, request_id), smallest
    first; ids compare by code point. Live ids are unique, so ``slot`` never
    decides."""

    priority: int
    arrival_time: float
    request_id: str
    slot: int

    @classmethod
    def of(cls, slot: int, r: Request) -> PriorityKey:
        return cls(r.priority, r.arrival_time, r.request_id, slot)


class WaitingQueue:
    """Requests waiting to be admitted (again). FCFS: arrivals at the back,
    preempted and skipped requests at the front. Priority: the smallest key
    first; a preempted request is simply inserted again."""

    def __init__(self, policy: Policy) -> None:
        # Exactly one is set, like the core's enum variants; the priority
        # keys are kept sorted (the core's ordered set).
        self._fcfs: deque[int] | None = deque() if policy is Policy.FCFS else None
        self._keys: list[PriorityKey] | None = [] if policy is Policy.PRIORITY else None

    def __len__(self) -> int:
        return len(self._fcfs) if self._fcfs is not None else len(self._keys or ())

    def is_empty(self) -> bool:
        return len(self) == 0

    def add(self, slot: int, r: Request) -> None:
        """Queue an arrival."""
        if self._fcfs is not None:
            self._fcfs.append(slot)
        else:
            assert self._keys is not None
            bisect.insort(self._keys, PriorityKey.of(slot, r))

    def prepend(self, slot: int, r: Request) -> None:
        """Put a preempted or skipped request back: at the front under FCFS."""
        if self._fcfs is not None:
            self._fcfs.appendleft(slot)
        else:
            assert self._keys is not None
            bisect.insort(self._keys, PriorityKey.of(slot, r))

    def peek(self) -> int | None:
        """The next request to admit."""
        if self._fcfs is not None:
            return self._fcfs[0] if self._fcfs else None
        assert self._keys is not None
        return self._keys[0].slot if self._keys else None

    def pop(self) -> int | None:
        """Take the next request."""
        if self._fcfs is not None:
            return self._fcfs.popleft() if self._fcfs else None
        assert self._keys is not None
        return self._keys.pop(0).slot if self._keys else None

    def remove(self, slot: int, r: Request) -> None:
        """Remove a request from anywhere (nothing if it is not there)."""
        if self._fcfs is not None:
            if slot in self._fcfs:
                self._fcfs.remove(slot)
            return
        assert self._keys is not None
        key = PriorityKey.of(slot, r)
        i = bisect.bisect_left(self._keys, key)
        if i < len(self._keys) and self._keys[i] == key:
            del self._keys[i]

    def iter(self) -> Iterator[int]:
        """The waiting slots in admission order."""
        if self._fcfs is not None:
            return iter(self._fcfs)
        assert self._keys is not None
        return (k.slot for k in self._keys)

    def __iter__(self) -> Iterator[int]:
        return self.iter()
