"""The scheduler (spec §4–6): vLLM 0.33's V1 continuous batching.

There is no prefill phase and no decode phase. Every request is behind by
``num_tokens - num_computed_tokens`` tokens, and each step hands out a token
budget to close those gaps: first to the running requests, in order, then to
the waiting ones. When a running request cannot get a block, a victim is
preempted (its blocks freed, its tokens to be recomputed later)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ironbatch.reference.block import Block
from ironbatch.reference.kv_cache_manager import KVCacheManager
from ironbatch.reference.prefix_cache_stats import PrefixCacheStats
from ironbatch.reference.request import Request, RequestStatus
from ironbatch.reference.request_queue import FcfsQueue, PriorityQueue
from ironbatch.reference.stop_check import check_stop


@dataclass
class ScheduledRequest:
    """One request's share of a step."""

    request: Request
    num_tokens: int
    kind: str  # "new", "resumed" or "running"
    num_computed_tokens: int  # before this step (the prefix hit for new/resumed)
    block_ids: list[int]  # the whole table for new/resumed; new blocks for running
    table: list[int]  # the whole table at scheduling time
    samples: bool  # this step reaches the request's last known token
    num_output_tokens: int  # before this step, output placeholders included

    @property
    def request_id(self) -> str:
        return self.request.request_id


@dataclass
class ScheduledStep:
    scheduled: list[ScheduledRequest]
    preempted_req_ids: set[str]
    finished_req_ids: set[str]
    owner: object = field(default=None, repr=False)
    applied: bool = field(default=False, repr=False)

    @property
    def total_num_scheduled_tokens(self) -> int:
        return sum(s.num_tokens for s in self.scheduled)


@dataclass
class RequestUpdate:
    """What update_from_output reports for one request (spec §5.3)."""

    request_id: str
    new_token_ids: list[int]
    finish_reason: str | None
    stop_reason: int | None
    cached_tokens: int  # the request's tokens in hash-cached blocks after the output


@dataclass
class SchedulerStats:
    num_running_reqs: int
    num_waiting_reqs: int  # not counting the skipped ones
    num_skipped_waiting_reqs: int  # skipped by a waiting pass, not admitted since
    kv_cache_usage: float
    prefix_cache_stats: PrefixCacheStats
    num_preempted_reqs: int  # preemptions since the stats were last taken


class Scheduler:
    def __init__(self, scheduler_config: Any, cache_config: Any) -> None:
        c = scheduler_config
        self.max_num_seqs: int = c.max_num_seqs
        self.max_num_batched_tokens: int = c.max_num_batched_tokens
        self.max_model_len: int = c.max_model_len
        self.enable_chunked_prefill: bool = c.enable_chunked_prefill
        self.long_prefill_token_threshold: int = c.long_prefill_token_threshold
        self.policy: str = c.policy
        self.reserve_full_isl: bool = c.scheduler_reserve_full_isl
        self.async_scheduling: bool = c.async_scheduling
        self.block_size: int = cache_config.block_size
        self.kv = KVCacheManager(
            cache_config.num_blocks,
            cache_config.block_size,
            c.max_model_len,
            cache_config.enable_prefix_caching,
        )
        self.requests: dict[str, Request] = {}
        self.waiting: FcfsQueue | PriorityQueue = (
            PriorityQueue() if self.policy == "priority" else FcfsQueue()
        )
        self.running: list[Request] = []
        self.finished_req_ids: set[str] = set()  # since the last schedule()
        self.preempted_req_ids: set[str] = set()  # likewise
        self.num_preempted = 0  # since the stats were last taken
        # Stable row per live request (a model runner's persistent batch);
        # freed slots are reused last-freed first.
        self._free_slots: list[int] = []
        self._num_slots = 0

    # -- requests in and out --------------------------------------------------

    def add_request(self, request: Any) -> None:
        """Queue a request (already validated by the API layer)."""
        if request.request_id in self.requests:
            raise ValueError(f"request_id {request.request_id!r} is already in the scheduler")
        r = Request(request, self.kv.hasher, self.block_size)
        if self._free_slots:
            r.slot = self._free_slots.pop()
        else:
            r.slot, self._num_slots = self._num_slots, self._num_slots + 1
        self.requests[r.request_id] = r
        self.waiting.add(r)

    def finish_requests(
        self, request_ids: Iterable[str], status: RequestStatus = RequestStatus.FINISHED_ABORTED
    ) -> None:
        """End requests from outside (spec §6), freeing in the order given."""
        found: list[Request] = []
        for rid in request_ids:
            r = self.requests.get(rid)
            if r is not None and r not in found:
                found.append(r)
        for r in found:
            if r.status == RequestStatus.RUNNING:
                self.running.remove(r)
            else:
                self.waiting.remove(r)
        for r in found:
            r.status = status
            self._free(r)

    def _free(self, r: Request) -> None:
        self.finished_req_ids.add(r.request_id)
        r.deferred = False
        self.kv.release(r.table)
        del self.requests[r.request_id]
        self._free_slots.append(r.slot)

    # -- schedule() -----------------------------------------------------------

    def schedule(self) -> ScheduledStep:
        budget = self.max_num_batched_tokens
        # Q1: with a single request in the system the threshold is off.
        in_system = len(self.running) + len(self.waiting)
        threshold = self.long_prefill_token_threshold if in_system > 1 else 0
        scheduled: dict[str, ScheduledRequest] = {}
        preempted: list[Request] = []

        # RUNNING pass: every running request catches up, in order.
        i = 0
        while i < len(self.running) and budget > 0:
            r = self.running[i]
            placeholders = r.num_output_placeholders
            # Async: the token in flight is its last one (max_tokens), so
            # another step could only compute a position nobody samples.
            if (
                placeholders > 0
                and r.num_computed_tokens + 2 - placeholders >= r.num_prompt_tokens + r.max_tokens
            ):
                i += 1
                continue
            n = r.num_tokens + placeholders - r.num_computed_tokens
            if 0 < threshold < n:
                n = threshold
            n = min(n, budget, self.max_model_len - 1 - r.num_computed_tokens)
            if n <= 0:  # nothing to compute this step (Q17): skip, don't stop
                i += 1
                continue
            while True:
                new_blocks = self.kv.allocate(r.table, r.seq, n, 0, [], False)
                if new_blocks is not None:
                    break
                victim, i, refund = self._pick_victim(r, i, scheduled)
                budget += refund
                self._preempt(victim)
                preempted.append(victim)
                if victim is r:
                    break
            if new_blocks is None:
                if self.policy == "priority" and r.status == RequestStatus.PREEMPTED:
                    continue  # r preempted itself; running[i] is now the next one (Q10)
                break  # FCFS: the pass ends
            scheduled[r.request_id] = self._entry(r, n, "running", new_blocks)
            budget -= n
            i += 1

        # WAITING pass: only if nobody was preempted (Q5).
        if not preempted:
            self._admit_waiting(budget, threshold, scheduled)

        step = ScheduledStep(
            scheduled=list(scheduled.values()),
            preempted_req_ids=self.preempted_req_ids,
            finished_req_ids=self.finished_req_ids,
            owner=self,
        )
        assert step.total_num_scheduled_tokens <= self.max_num_batched_tokens
        assert len(self.running) <= self.max_num_seqs
        for s in step.scheduled:  # optimistic advance, before the step runs
            r = s.request
            r.num_computed_tokens += s.num_tokens
            r.in_flight_tokens += s.num_tokens
            if self.async_scheduling and not r.is_prefill_chunk:
                r.num_output_placeholders += 1  # the token this step samples
        self.finished_req_ids = set()
        self.preempted_req_ids = set()
        return step

    def _admit_waiting(
        self, budget: int, threshold: int, scheduled: dict[str, ScheduledRequest]
    ) -> None:
        skipped: list[Request] = []
        while budget > 0 and len(self.waiting) > 0:
            if len(self.running) >= self.max_num_seqs:
                break
            r = self.waiting.peek()
            if r.stale_tokens > 0 and not r.drop_stale:  # output still in flight (spec §5.4)
                r.deferred = True
                skipped.append(self.waiting.pop())
                continue
            hits, hit_tokens = self.kv.lookup(r.seq)
            n = r.num_tokens - hit_tokens
            if 0 < threshold < n:
                n = threshold
            if not self.enable_chunked_prefill and n > budget:
                break  # Q6: the head blocks the queue
            n = min(n, budget)
            new_blocks = self.kv.allocate(
                r.table, r.seq, n, hit_tokens, hits, self.reserve_full_isl
            )
            if new_blocks is None:
                break  # r stays at the head
            self.kv.record_prefix_cache_stats_for(r.num_tokens, hit_tokens, r.num_preemptions > 0)
            self.waiting.pop()
            self.running.append(r)
            kind = "new" if r.status == RequestStatus.WAITING else "resumed"
            r.status = RequestStatus.RUNNING
            r.num_computed_tokens = hit_tokens
            r.deferred = False
            scheduled[r.request_id] = self._entry(r, n, kind, r.table.blocks)
            budget -= n
        self.waiting.prepend_all(skipped)

    def _entry(self, r: Request, n: int, kind: str, blocks: list[Block]) -> ScheduledRequest:
        return ScheduledRequest(
            request=r,
            num_tokens=n,
            kind=kind,
            num_computed_tokens=r.num_computed_tokens,
            block_ids=[b.block_id for b in blocks],
            table=r.table.block_ids(),
            samples=r.num_computed_tokens + n >= r.num_tokens,
            num_output_tokens=r.num_output_tokens + r.num_output_placeholders,
        )

    def _pick_victim(
        self, r: Request, i: int, scheduled: dict[str, ScheduledRequest]
    ) -> tuple[Request, int, int]:
        """Remove the victim from ``running`` (spec §4.3); returns it, the
        cursor after the removal and the budget to refund."""
        if self.policy != "priority":
            return self.running.pop(), i, 0  # the last one: never already scheduled
        # The largest (priority, arrival_time); the earliest in running on ties.
        v = 0
        for k, cand in enumerate(self.running):
            if (cand.priority, cand.arrival_time) > (
                self.running[v].priority,
                self.running[v].arrival_time,
            ):
                v = k
        victim = self.running.pop(v)
        if v < i:
            i -= 1
        undone = scheduled.pop(victim.request_id, None)
        return victim, i, undone.num_tokens if undone is not None else 0

    def _preempt(self, r: Request, drop_stale: bool = False) -> None:
        """Recompute-style preemption (spec §4.4); ``r`` already left running."""
        self.kv.release(r.table)
        r.status = RequestStatus.PREEMPTED
        r.num_computed_tokens = 0
        r.num_preemptions += 1
        r.drop_stale = drop_stale or (r.drop_stale and r.stale_tokens > 0)
        r.stale_tokens = r.in_flight_tokens
        r.num_output_placeholders = 0
        self.waiting.prepend(r)
        self.preempted_req_ids.add(r.request_id)
        self.num_preempted += 1

    # -- update_from_output() -------------------------------------------------

    def update_from_output(
        self, step: ScheduledStep, sampled: Mapping[str, Sequence[int]]
    ) -> list[RequestUpdate]:
        """Apply the tokens a step produced (spec §5): append, stop, free."""
        self._check_sampled(step, sampled)
        step.applied = True
        updates: list[RequestUpdate] = []
        stopped_running: list[Request] = []
        stopped_waiting: list[Request] = []
        for s in step.scheduled:
            r = s.request
            if r.status.is_finished:
                continue  # aborted meanwhile: no output
            r.in_flight_tokens -= s.num_tokens
            stale = r.stale_tokens > 0
            if stale:
                r.stale_tokens -= s.num_tokens
                if r.drop_stale:
                    continue  # preempted by a reset: discarded (spec §5.4)
            tokens = list(sampled.get(s.request_id, ()))
            if not tokens:
                continue  # a partial prefill: no output
            status_before = r.status
            placeholders = r.num_output_placeholders
            emitted: list[int] = []
            stopped = False
            for t in tokens:
                r.seq.append([t], self.kv.hasher, self.block_size)
                emitted.append(t)
                if check_stop(r, self.max_model_len):
                    stopped = True
                    break
            if stopped and not stale:
                r.num_computed_tokens -= len(tokens) - len(emitted)
            if not stale and placeholders > 0:
                # Every returned token resolves a placeholder, trimmed or not.
                r.num_output_placeholders = max(placeholders - len(tokens), 0)
                if status_before == RequestStatus.RUNNING:
                    # The blocks the arrived tokens filled can be cached now.
                    upto = max(r.num_computed_tokens - r.in_flight_tokens, 0)
                    self.kv.cache_full_blocks(r.seq, r.table, upto)
            cached_tokens = self.kv.num_cached_tokens(r.table)
            if stopped:
                self._free(r)  # in scheduling order: this shapes the free queue (Q18)
                running = status_before == RequestStatus.RUNNING
                (stopped_running if running else stopped_waiting).append(r)
            updates.append(
                RequestUpdate(
                    r.request_id,
                    emitted,
                    r.status.finish_reason if stopped else None,
                    r.stop_reason,
                    cached_tokens,
                )
            )
        if stopped_running:
            gone = set(map(id, stopped_running))
            self.running = [r for r in self.running if id(r) not in gone]
        for r in stopped_waiting:
            self.waiting.remove(r)
        return updates

    def _check_sampled(self, step: ScheduledStep, sampled: Mapping[str, Sequence[int]]) -> None:
        if step.owner is not self:
            raise ValueError("this step was scheduled by another scheduler")
        if step.applied:
            raise ValueError("this step's output was already applied")
        by_id = {s.request_id: s for s in step.scheduled}
        for rid, tokens in sampled.items():
            s = by_id.get(rid)
            if s is None:
                raise ValueError(f"sampled: request {rid!r} was not scheduled in this step")
            if len(tokens) > 0 and not s.samples:
                raise ValueError(
                    f"sampled: request {rid!r} got tokens, but its step ended before its "
                    "last known token"
                )

    # -- state and statistics -------------------------------------------------

    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        """Forget every cached block hash (spec §7.10). With
        ``reset_running_requests`` every running request is preempted first
        and its in-flight output dropped."""
        if reset_running_requests:
            while self.running:
                r = self.running.pop()
                self._preempt(r, drop_stale=True)
        done = self.kv.reset_prefix_cache()
        if reset_running_requests and not done:
            raise RuntimeError("reset_prefix_cache failed with every request preempted")
        return done

    def make_stats(self) -> SchedulerStats:
        stats = SchedulerStats(
            num_running_reqs=len(self.running),
            num_waiting_reqs=len(self.waiting) - self._num_deferred(),
            num_skipped_waiting_reqs=self._num_deferred(),
            kv_cache_usage=self.kv.usage,
            prefix_cache_stats=self.kv.make_prefix_cache_stats(),
            num_preempted_reqs=self.num_preempted,
        )
        self.num_preempted = 0
        return stats

    def _num_deferred(self) -> int:
        return sum(r.deferred for r in self.waiting)

    def get_num_unfinished_requests(self) -> int:
        return len(self.running) + len(self.waiting)

    def has_unfinished_requests(self) -> bool:
        return self.get_num_unfinished_requests() > 0

    def debug_state(self) -> dict[str, Any]:
        """Everything both backends must agree on, for differential tests."""
        return {
            "running": [r.request_id for r in self.running],
            "waiting": [r.request_id for r in self.waiting],
            "requests": {
                rid: (
                    r.status.name,
                    r.slot,
                    r.num_tokens,
                    r.num_computed_tokens,
                    r.table.block_ids(),
                    r.table.num_cached,
                    r.num_preemptions,
                    (
                        r.num_output_placeholders,
                        r.in_flight_tokens,
                        r.stale_tokens,
                        r.drop_stale,
                        r.deferred,
                    ),
                )
                for rid, r in self.requests.items()
            },
            "free_block_ids": self.kv.free_block_ids(),
            "block_ref_cnts": self.kv.block_ref_cnts(),
            "cached_blocks": sorted(self.kv.cached_blocks().values()),
        }
