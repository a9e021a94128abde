"""The waiting queues (docs/scheduling.md §3.3): a deque under FCFS, a binary
heap under priority. Entries are request slots.

The heap is Python's ``heapq`` over vLLM's request order, read from the live
requests at each comparison, exactly as vLLM's priority queue is: with fixed
keys it pops in sorted order, and when a key changes in place (a streaming
session's next chunk rewrites its arrival time while it waits) it stays stale
until the next heapify, as vLLM's does. The core implements the same heap."""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterator

from ironbatch.reference.request import Request
from ironbatch.reference.scheduler_config import Policy
from ironbatch.reference.slab import Slab


class _Entry:
    """A heap entry: a slot, ordered as vLLM orders its requests
    (``Request.__lt__``: priority, arrival time, then id)."""

    __slots__ = ("slot", "request")

    def __init__(self, slot: int, request: Request) -> None:
        self.slot = slot
        self.request = request

    def __lt__(self, other: _Entry) -> bool:
        a, b = self.request, other.request
        if a.priority != b.priority:
            return a.priority < b.priority
        if a.arrival_time != b.arrival_time:
            return a.arrival_time < b.arrival_time
        return a.request_id < b.request_id


class WaitingQueue:
    """Requests waiting to be admitted (again). FCFS: arrivals at the back,
    preempted and skipped requests at the front. Priority: a heap;
    preempted and skipped requests are pushed again."""

    def __init__(self, policy: Policy) -> None:
        # Exactly one is set, like the core's enum variants.
        self._fcfs: deque[int] | None = deque() if policy is Policy.FCFS else None
        self._heap: list[_Entry] | None = [] if policy is Policy.PRIORITY else None

    def __len__(self) -> int:
        return len(self._fcfs) if self._fcfs is not None else len(self._heap or ())

    def is_empty(self) -> bool:
        return len(self) == 0

    def add(self, slot: int, requests: Slab[Request]) -> None:
        """Queue an arrival."""
        if self._fcfs is not None:
            self._fcfs.append(slot)
        else:
            assert self._heap is not None
            heapq.heappush(self._heap, _Entry(slot, requests[slot]))

    def prepend(self, slot: int, requests: Slab[Request]) -> None:
        """Put a preempted or skipped request back: at the front under FCFS."""
        if self._fcfs is not None:
            self._fcfs.appendleft(slot)
        else:
            self.add(slot, requests)

    def peek(self) -> int | None:
        """The next request to admit."""
        if self._fcfs is not None:
            return self._fcfs[0] if self._fcfs else None
        assert self._heap is not None
        return self._heap[0].slot if self._heap else None

    def pop(self, requests: Slab[Request]) -> int | None:
        """Take the next request."""
        del requests  # the entries hold their requests
        if self._fcfs is not None:
            return self._fcfs.popleft() if self._fcfs else None
        assert self._heap is not None
        return heapq.heappop(self._heap).slot if self._heap else None

    def remove_all(self, gone: Callable[[int], bool], requests: Slab[Request]) -> None:
        """Remove every request ``gone`` names, the others keeping their order
        (vLLM's ``remove_requests``: a filter, then a heapify under priority,
        which also repairs keys changed in place)."""
        del requests
        if self._fcfs is not None:
            self._fcfs = deque(s for s in self._fcfs if not gone(s))
            return
        assert self._heap is not None
        self._heap = [e for e in self._heap if not gone(e.slot)]
        heapq.heapify(self._heap)

    def iter(self, requests: Slab[Request]) -> Iterator[int]:
        """The waiting slots in admission order (under priority, popped from a
        copy, as vLLM iterates its heap)."""
        del requests
        if self._fcfs is not None:
            return iter(list(self._fcfs))
        assert self._heap is not None
        copy = self._heap[:]
        return (heapq.heappop(copy).slot for _ in range(len(copy)))
