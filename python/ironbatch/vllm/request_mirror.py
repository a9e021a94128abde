"""The vLLM ``Request`` objects the drop-in keeps, by the core's slot, and
what the core decided about them, written back onto them.

The core owns the scheduling state; a vLLM Request is written only when
something happens to it (admission, preemption, its first output,
finishing) or on ``sync``. A steady decode step touches none of them, which
is what keeps it cheap (docs/architecture.md, the drop-in). So ``status``,
``num_preemptions``, ``stop_reason``, events and prefill stats are always
current; ``output_token_ids``, ``all_token_ids`` and ``num_computed_tokens``
are brought up to date when the request is admitted, resumed, finished or
aborted, or on ``Scheduler.sync_requests()`` (a structured-output request's
tokens at every step: its grammar and reasoning parser read them)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from vllm.v1.engine import EngineCoreEventType
from vllm.v1.request import Request, RequestStatus

from ironbatch import _core


class RequestMirror:
    """Live requests by slot (a request's stable row in the core), their
    clients, and the slots whose next ``EngineCoreOutput`` carries more than
    tokens: events or prefill stats to hand over, trace headers, NaN counts,
    a sticky stop reason."""

    def __init__(self, core: Any, log_stats: bool, hash_lookahead_tokens: int = 0) -> None:
        self.core = core  # the drop-in's CoreScheduler
        self.log_stats = log_stats
        # The engine's block hashes cover this many tokens after each block.
        self.hash_lookahead_tokens = hash_lookahead_tokens
        self.by_slot: list[Request | None] = []
        self.client_of_slot: list[int] = []
        self.slot_of: dict[str, int] = {}
        self.full_output_slots: set[int] = set()
        # Live requests per client: with one client (the usual front end)
        # a step's outputs need no grouping.
        self.live_per_client: Counter[int] = Counter()

    def add(self, request: Request, slot: int) -> None:
        if slot >= len(self.by_slot):
            grow = slot + 1 - len(self.by_slot)
            self.by_slot.extend([None] * grow)
            self.client_of_slot.extend([0] * grow)
        self.by_slot[slot] = request
        self.client_of_slot[slot] = request.client_index
        self.live_per_client[request.client_index] += 1
        self.slot_of[request.request_id] = slot

    def remove(self, request_id: str) -> None:
        slot = self.slot_of.pop(request_id)
        self.by_slot[slot] = None
        self.full_output_slots.discard(slot)
        client = self.client_of_slot[slot]
        self.live_per_client[client] -= 1
        if not self.live_per_client[client]:
            del self.live_per_client[client]

    def only_client(self) -> int | None:
        """The one client with live requests; None for none or several."""
        if len(self.live_per_client) != 1:
            return None
        return next(iter(self.live_per_client))

    def mark_full(self, r: Request) -> None:
        """``r``'s next output carries more than tokens."""
        self.full_output_slots.add(self.slot_of[r.request_id])

    def sync(self, r: Request, computed_too: bool = True) -> None:
        """Bring a live request's tokens (and num_computed_tokens) up to date."""
        tokens, computed = _core.vllm_request_state(self.core.core, self.slot_of[r.request_id])
        self.set_tokens(r, tokens)
        if computed_too:
            r.num_computed_tokens = computed

    @staticmethod
    def finish_tokens(r: Request, end: Any) -> None:
        """Bring a finished request's tokens up to date from the core's
        ``FinishedRequest``. A request's tokens only grow, and its Request
        holds a prefix of them (written only by ``sync`` and by appends of
        kept tokens), so only the tail crosses over; a streaming session's
        turns may drop a token, so its tokens are written whole."""
        have = len(r._all_token_ids)
        if r.resumable or have > end.num_tokens:
            RequestMirror.set_tokens(r, end.token_ids)
            return
        tail = end.token_ids_from(have)
        r._all_token_ids.extend(tail)
        r._output_token_ids.extend(tail)

    @staticmethod
    def set_tokens(r: Request, tokens: list[int]) -> None:
        # In place: Request.all_token_ids and output_token_ids view these lists.
        r._all_token_ids[:] = tokens
        r._output_token_ids[:] = tokens[r.num_prompt_tokens :]

    def preempted(self, r: Request, now: float) -> None:
        r.status = RequestStatus.PREEMPTED
        r.num_computed_tokens = 0
        r.num_preemptions += 1
        if self.log_stats:
            r.record_event(EngineCoreEventType.PREEMPTED, now)
            self.mark_full(r)

    def admitted(
        self,
        r: Request,
        slot: int,
        hit_tokens: int,
        now: float,
        hit_split: tuple[int, int] | None = None,
    ) -> None:
        """``hit_split``: (local, external) hit tokens, where a KV connector
        supplied some (else all ``hit_tokens`` are local)."""
        # Its next output carries more than tokens (prefill stats on the
        # first, events, trace headers). Marked here, not when it is added:
        # a waiting request has no output, and every update checks its
        # records against this set (6,000 waiting slots cost ~470 µs a step).
        self.full_output_slots.add(slot)
        if self.log_stats:
            r.record_event(EngineCoreEventType.SCHEDULED, now)
        if r.prefill_stats is not None and r.num_preemptions <= 0:
            local, external = hit_split or (hit_tokens, 0)
            r.prefill_stats.set(
                num_prompt_tokens=r.num_prompt_tokens,
                num_local_cached_tokens=local,
                num_external_cached_tokens=external,
            )
        if r.resumable and self.hash_lookahead_tokens and r.num_computed_tokens == 0:
            # As vLLM's scheduler does (and the core): a session computing its
            # KV afresh hashes its tokens as they are now, not as a turn's
            # dropped token left its lookahead hashes.
            r.block_hashes.clear()
            r.update_block_hashes()
        r.status = RequestStatus.RUNNING
        r.num_computed_tokens = hit_tokens  # what NewRequestData reports
