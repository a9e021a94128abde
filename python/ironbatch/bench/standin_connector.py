"""A stand-in KV connector, for tests and for recording connector traces
(benches/record_vllm.py --connector standin): the scheduler side of vLLM
0.33's connector protocol (docs/scheduling.md §4.19) and a worker that
reports its transfers, deterministic from a seed and independent of any
engine.

It answers the way real connectors can: an external hit past the local one
(a P/D decode instance's whole prompt, an offloading tier's blocks), loaded
synchronously in the step or asynchronously over some steps, now and then
"ask again later" (None); loads that fail whole or lose one block; frees
held back after a normal finish while a send runs for some steps. Each
answer is drawn from (seed, request id, how many times it was asked), so it
does not depend on the order in which requests are asked: two schedulers
that make the same calls get the same answers, and the call log says where
they parted.

Block ids are given per KV-cache group, as lists; the stand-in reads group 0
(connectors without hybrid support see one group)."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class StandInShares:
    """How often the stand-in does each thing (probabilities)."""

    #: A query answered "ask again later" (at most twice per request).
    unknown: float = 0.1
    #: A query answered with an external hit (else 0 tokens).
    hit: float = 0.6
    #: A hit loaded asynchronously (else in the step, synchronously).
    load_async: float = 0.6
    #: An asynchronous load that fails whole (failed_recving).
    load_failed: float = 0.1
    #: A load (either kind) that loses one of its blocks (invalid_block_ids).
    block_invalid: float = 0.1
    #: A normally finished request whose blocks are held for a send.
    delay_free: float = 0.4
    #: The most steps a transfer takes (at least 1).
    max_steps: int = 3

    @classmethod
    def draw(cls, rng: random.Random) -> StandInShares:
        """Shares for a random workload, each drawn from a few levels."""
        return cls(
            unknown=rng.choice([0.0, 0.1, 0.3]),
            hit=rng.choice([0.3, 0.6, 0.9]),
            load_async=rng.choice([0.0, 0.5, 0.9]),
            load_failed=rng.choice([0.0, 0.1, 0.3]),
            block_invalid=rng.choice([0.0, 0.1, 0.3]),
            delay_free=rng.choice([0.0, 0.4, 0.8]),
            max_steps=rng.choice([1, 3, 6]),
        )


@dataclass
class Load:
    request_id: str
    #: The request's blocks in group 0 that the load writes.
    block_ids: list[int]
    is_async: bool
    #: Steps until reported, counted from the step whose metadata starts it.
    steps: int
    failed: bool
    #: The block reported invalid, if any.
    invalid_block: int | None


@dataclass
class Send:
    request_id: str
    steps: int


@dataclass
class StandInMeta:
    """What one step's ``build_connector_meta`` hands the worker."""

    step: int
    loads: list[Load] = field(default_factory=list)
    sends: list[Send] = field(default_factory=list)


@dataclass
class WorkerReport:
    """One step's transfer results (vLLM's ``KVConnectorOutput`` fields)."""

    finished_recving: set[str] = field(default_factory=set)
    finished_sending: set[str] = field(default_factory=set)
    failed_recving: set[str] = field(default_factory=set)
    invalid_block_ids: set[int] = field(default_factory=set)


class StandInConnector:
    """The scheduler side. ``log`` records every call with its arguments and
    answer; ``events`` counts what the workload exercised."""

    def __init__(
        self,
        seed: int,
        block_size: int,
        shares: StandInShares | None = None,
        scripted: dict[str, tuple[int, bool]] | None = None,
    ) -> None:
        self.seed = seed
        #: Fixed answers by request id (a worked example's), drawn otherwise.
        self.scripted = scripted or {}
        self.block_size = block_size
        self.shares = shares or StandInShares()
        self.log: list[tuple[Any, ...]] = []
        self.events: Counter = Counter()
        self._asks: Counter = Counter()
        self._unknowns: Counter = Counter()
        #: Per request: the last answer's (external tokens, async, local).
        self._answers: dict[str, tuple[int, bool, int]] = {}
        self._loads: list[Load] = []
        self._sends: list[Send] = []
        self._step = 0
        #: Where to pin blocks while they are copied out, as connectors
        #: that manage the GPU block pool do (a scheduler's
        #: ``pin_requests()``; None: no pins).
        self.pin_requests: Any = None
        #: Copies out in progress: (steps left, blocks pinned).
        self._pinned: list[tuple[int, list[int]]] = []

    def _rng(self, request_id: str, what: str) -> random.Random:
        return random.Random(f"{self.seed}:{request_id}:{what}:{self._asks[request_id]}")

    def get_num_new_matched_tokens(
        self, request_id: str, num_tokens: int, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        """The external hit past ``num_computed_tokens`` local tokens of a
        request of ``num_tokens``: (tokens, load asynchronously)."""
        self._asks[request_id] += 1
        rng = self._rng(request_id, "ask")
        s = self.shares
        left = num_tokens - num_computed_tokens
        answer: tuple[int | None, bool]
        if request_id in self.scripted:
            answer = self.scripted[request_id]
        elif self._unknowns[request_id] < 2 and rng.random() < s.unknown:
            self._unknowns[request_id] += 1
            answer = (None, False)
        elif left <= 0 or rng.random() >= s.hit:
            answer = (0, False)
        elif rng.random() < s.load_async:
            # An async load may cover every token (the last is recomputed).
            answer = (rng.randint(1, left), True)
        elif left > 1:
            # A synchronous one leaves a token to compute (vLLM asserts it).
            answer = (rng.randint(1, left - 1), False)
        else:
            answer = (0, False)
        external, is_async = answer
        if external is not None:
            self._answers[request_id] = (external, is_async, num_computed_tokens)
        self.log.append(("matched", request_id, num_tokens, num_computed_tokens, answer))
        return answer

    def get_loaded_kv_cache_group_ids(self, request_id: str) -> tuple[int, ...]:
        """The KV-cache groups an asynchronous load of the request writes
        (their blocks are not zeroed, which would race it): most often the
        first four (every group a test draws), else some of them."""
        rng = self._rng(request_id, "groups")
        groups = tuple(range(4))
        if rng.random() < 0.4:
            groups = tuple(g for g in groups if rng.random() < 0.5)
        self.log.append(("loaded_groups", request_id, groups))
        return groups

    def update_state_after_alloc(
        self, request_id: str, block_ids: list[list[int]], num_external_tokens: int
    ) -> None:
        """A request's blocks after its allocation; with external tokens, a
        load into the blocks past the local hit."""
        self.log.append(("after_alloc", request_id, block_ids, num_external_tokens))
        if self.pin_requests is not None:
            self._copy_out(request_id, block_ids)
        if num_external_tokens == 0:
            return
        external, is_async, local = self._answers[request_id]
        assert external == num_external_tokens, (external, num_external_tokens)
        bs = self.block_size
        table = block_ids[0] if block_ids else []
        # A window's blocks past its reach are the null block (id 0): no load
        # writes there.
        written = [b for b in table[local // bs : -(-(local + external) // bs)] if b != 0]
        rng = self._rng(request_id, "load")
        s = self.shares
        failed = is_async and rng.random() < s.load_failed
        # With several KV-cache groups a block id names no block on its own:
        # vLLM takes failures there as whole failed loads only.
        one_group = len(block_ids) == 1
        invalid = (
            rng.choice(written)
            if written and one_group and rng.random() < s.block_invalid
            else None
        )
        steps = rng.randint(1, s.max_steps) if is_async else 1
        self._loads.append(Load(request_id, written, is_async, steps, failed, invalid))
        self.events["async_loads" if is_async else "sync_loads"] += 1

    def _copy_out(self, request_id: str, block_ids: list[list[int]]) -> None:
        """Now and then, copy a request's blocks out over some steps,
        pinning them meanwhile (from inside the scheduler's call)."""
        rng = self._rng(request_id, "pin")
        blocks = [b for b in (block_ids[0] if block_ids else []) if b != 0]
        if blocks and rng.random() < 0.3:
            self.pin_requests.pin(blocks)
            self._pinned.append((rng.randint(1, self.shares.max_steps), blocks))
            self.events["pinned_copies"] += 1

    def _copies_done(self) -> None:
        """Copies out that are due let their blocks go, last block first."""
        left = []
        for steps, blocks in self._pinned:
            if steps <= 1:
                self.pin_requests.unpin(list(reversed(blocks)))
            else:
                left.append((steps - 1, blocks))
        self._pinned = left

    @property
    def copying(self) -> bool:
        """Copies out still holding pinned blocks."""
        return bool(self._pinned)

    def build_connector_meta(self) -> StandInMeta:
        """This step's new transfers, handed to the worker; resets them."""
        self._copies_done()
        self._step += 1
        meta = StandInMeta(self._step, self._loads, self._sends)
        self._loads, self._sends = [], []
        self.log.append(
            (
                "meta",
                self._step,
                [x.request_id for x in meta.loads],
                [x.request_id for x in meta.sends],
            )
        )
        return meta

    def request_finished(
        self, request_id: str, block_ids: list[list[int]], normal_finish: bool
    ) -> tuple[bool, dict[str, Any] | None]:
        """A finished request's blocks (clipped to its computed tokens): hold
        them for a send after a normal finish, now and then."""
        self.log.append(("finished", request_id, block_ids, normal_finish))
        rng = self._rng(request_id, "finished")
        holds = any(block_ids) and normal_finish and rng.random() < self.shares.delay_free
        if holds:
            self._sends.append(Send(request_id, rng.randint(1, self.shares.max_steps)))
            self.events["delayed_frees"] += 1
        params = {"stand_in": request_id} if normal_finish else None
        return holds, params


class StandInWorker:
    """The worker side: runs each step's transfers and reports them when
    they are due. ``report(meta)`` is called once per step, in order, with
    that step's metadata (None when the step carried none)."""

    def __init__(self) -> None:
        self._loads: list[tuple[int, Load]] = []
        self._sends: list[tuple[int, Send]] = []
        self.events: Counter = Counter()

    def report(self, meta: StandInMeta | None, step: int) -> WorkerReport:
        if meta is not None:
            self._loads += [(meta.step + x.steps - 1, x) for x in meta.loads]
            self._sends += [(meta.step + x.steps - 1, x) for x in meta.sends]
        out = WorkerReport()
        due_loads = [x for due, x in self._loads if due <= step]
        self._loads = [(due, x) for due, x in self._loads if due > step]
        for load in due_loads:
            if load.is_async:
                out.finished_recving.add(load.request_id)
            if load.failed:
                out.failed_recving.add(load.request_id)
                self.events["failed_loads"] += 1
            elif load.invalid_block is not None:
                out.invalid_block_ids.add(load.invalid_block)
                self.events["invalid_blocks"] += 1
        due_sends = [x for due, x in self._sends if due <= step]
        self._sends = [(due, x) for due, x in self._sends if due > step]
        out.finished_sending = {x.request_id for x in due_sends}
        return out

    @property
    def busy(self) -> bool:
        """Transfers still running."""
        return bool(self._loads or self._sends)


NORMAL_FINISH = ("FINISHED_STOPPED", "FINISHED_LENGTH_CAPPED")


class CoreStandIn:
    """The stand-in as ironbatch's schedulers call a connector
    (``Scheduler.set_kv_connector``): a finished request's status by name,
    a hold for an answer (its transfer parameters stay with the stand-in)."""

    def __init__(self, stand_in: StandInConnector) -> None:
        self.stand_in = stand_in

    def observe_request(
        self,
        request_id: str,
        token_ids: list[int],
        num_computed_tokens: int,
        status: str,
        cached_blocks: list[list[int]],
    ) -> None:
        """The request as the next call names it: logged, so a core and a
        twin that show it differently part here."""
        self.stand_in.log.append(
            ("seen", request_id, list(token_ids), num_computed_tokens, status, cached_blocks)
        )

    def get_num_new_matched_tokens(
        self, request_id: str, num_tokens: int, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        return self.stand_in.get_num_new_matched_tokens(request_id, num_tokens, num_computed_tokens)

    def get_loaded_kv_cache_group_ids(self, request_id: str) -> tuple[int, ...]:
        return self.stand_in.get_loaded_kv_cache_group_ids(request_id)

    def update_state_after_alloc(
        self, request_id: str, block_ids: list[list[int]], num_external_tokens: int
    ) -> None:
        self.stand_in.update_state_after_alloc(request_id, block_ids, num_external_tokens)

    def external_hit_settled(self, request_id: str, num_tokens: int, load_async: bool) -> None:
        """The hit the admission takes (capped, past the encoder-cache
        check): logged, so a core and a twin that settle it differently
        part here."""
        self.stand_in.log.append(("settled", request_id, num_tokens, load_async))

    def request_finished(self, request_id: str, block_ids: list[list[int]], status: str) -> bool:
        normal = status in NORMAL_FINISH
        return self.stand_in.request_finished(request_id, block_ids, normal)[0]
