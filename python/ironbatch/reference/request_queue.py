"""The waiting queue (spec §3.3): a deque under FCFS, a heap under priority."""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator

from ironbatch.reference.request import Request


class FcfsQueue:
    """Arrivals at the back; preempted and skipped requests at the front."""

    def __init__(self) -> None:
        self._q: deque[Request] = deque()

    def add(self, r: Request) -> None:
        self._q.append(r)

    def prepend(self, r: Request) -> None:
        self._q.appendleft(r)

    def prepend_all(self, rs: list[Request]) -> None:
        """Put ``rs`` before everything, keeping their order."""
        self._q.extendleft(reversed(rs))

    def peek(self) -> Request:
        return self._q[0]

    def pop(self) -> Request:
        return self._q.popleft()

    def remove(self, r: Request) -> None:
        self._q.remove(r)

    def __len__(self) -> int:
        return len(self._q)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._q)


class PriorityQueue:
    """The minimum of (priority, arrival_time, request_id) first; request
    ids compare as strings, by code point."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, float, str, Request]] = []

    def add(self, r: Request) -> None:
        heapq.heappush(self._heap, (r.priority, r.arrival_time, r.request_id, r))

    prepend = add  # a preempted request is simply inserted again

    def prepend_all(self, rs: list[Request]) -> None:
        for r in rs:
            self.add(r)

    def peek(self) -> Request:
        return self._heap[0][3]

    def pop(self) -> Request:
        return heapq.heappop(self._heap)[3]

    def remove(self, r: Request) -> None:
        self._heap = [e for e in self._heap if e[3] is not r]
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[Request]:
        return (e[3] for e in sorted(self._heap, key=lambda e: e[:3]))
