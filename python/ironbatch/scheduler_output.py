"""What one schedule() decided, as columns.

The step crosses from the core as NumPy arrays, one entry per scheduled
request in scheduling order (running requests first, then admissions);
vLLM-style per-request views are built only when someone reads them."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from collections.abc import Sequence as SequenceABC
from dataclasses import dataclass
from functools import cached_property
from typing import Any, NamedTuple

import numpy as np

KIND_NAMES = ("new", "resumed", "running")
NEW, RESUMED, RUNNING = 0, 1, 2


class ScheduledEntry(NamedTuple):
    """One request's share of a step, as the trace format records it."""

    request_id: str
    num_tokens: int
    kind: str
    num_computed_tokens: int  # before this step; the prefix hit for new/resumed
    block_ids: list[int]  # the whole table for new/resumed; new blocks for running


@dataclass
class NewRequestData:
    req_id: str
    prompt_token_ids: list[int]
    sampling_params: Any
    block_ids: list[int]
    num_computed_tokens: int


@dataclass
class CachedRequestData:
    req_ids: list[str]  # running requests, then resumed ones
    resumed_req_ids: set[str]
    new_block_ids: list[list[int] | None]  # None: no new block for a running request
    num_computed_tokens: list[int]


class SchedulerOutput:
    """One step's decisions.

    Columns (NumPy, one row per scheduled request unless noted):
    ``req_slots`` (a request's stable row while it lives), ``num_scheduled``,
    ``num_computed_tokens`` (before the step), ``kinds`` (0 new, 1 resumed,
    2 running), ``samples`` (the step reaches the request's last known
    token, so it yields a token), ``num_output_tokens`` (before the step,
    output placeholders included), ``new_block_ids`` flattened with
    ``new_block_offsets`` (n + 1), and for the model runner the flattened
    per-token ``positions`` and ``slot_mapping``, ``query_start_loc`` (n + 1)
    and ``seq_lens``.
    """

    def __init__(
        self,
        *,
        req_ids: list[str],
        columns: Mapping[str, np.ndarray],
        preempted_req_ids: set[str],
        finished_req_ids: set[str],
        handle: Any,
        lookup_request: Callable[[str], Any],
    ) -> None:
        self.req_ids = req_ids
        self.req_slots: np.ndarray = columns["req_slots"]
        self.num_scheduled: np.ndarray = columns["num_scheduled"]
        self.num_computed_tokens: np.ndarray = columns["num_computed_tokens"]
        self.kinds: np.ndarray = columns["kinds"]
        self.samples: np.ndarray = columns["samples"]
        self.num_output_tokens: np.ndarray = columns["num_output_tokens"]
        self.new_block_ids: np.ndarray = columns["new_block_ids"]
        self.new_block_offsets: np.ndarray = columns["new_block_offsets"]
        self.positions: np.ndarray = columns["positions"]
        self.slot_mapping: np.ndarray = columns["slot_mapping"]
        self.query_start_loc: np.ndarray = columns["query_start_loc"]
        self.seq_lens: np.ndarray = columns["seq_lens"]
        self.preempted_req_ids = preempted_req_ids
        self.finished_req_ids = finished_req_ids
        self.num_common_prefix_blocks = [0]  # vLLM 0.33 removed cascade attention
        self._handle = handle
        self._lookup_request = lookup_request

    @property
    def total_num_scheduled_tokens(self) -> int:
        return int(self.query_start_loc[-1])

    def __len__(self) -> int:
        return len(self.req_ids)

    @cached_property
    def num_scheduled_tokens(self) -> dict[str, int]:
        """Request id -> tokens this step, in scheduling order."""
        return dict(zip(self.req_ids, self.num_scheduled.tolist(), strict=True))

    def block_ids_of(self, i: int) -> list[int]:
        lo, hi = self.new_block_offsets[i], self.new_block_offsets[i + 1]
        return self.new_block_ids[lo:hi].tolist()

    def entries(self) -> Iterator[ScheduledEntry]:
        for i, rid in enumerate(self.req_ids):
            yield ScheduledEntry(
                rid,
                int(self.num_scheduled[i]),
                KIND_NAMES[self.kinds[i]],
                int(self.num_computed_tokens[i]),
                self.block_ids_of(i),
            )

    @cached_property
    def scheduled_new_reqs(self) -> list[NewRequestData]:
        out = []
        for i in np.flatnonzero(self.kinds == NEW).tolist():
            request = self._lookup_request(self.req_ids[i])
            out.append(
                NewRequestData(
                    self.req_ids[i],
                    request.prompt_token_ids,
                    request.sampling_params,
                    self.block_ids_of(i),
                    int(self.num_computed_tokens[i]),
                )
            )
        return out

    @cached_property
    def scheduled_cached_reqs(self) -> CachedRequestData:
        running = np.flatnonzero(self.kinds == RUNNING).tolist()
        resumed = np.flatnonzero(self.kinds == RESUMED).tolist()
        rows = running + resumed
        return CachedRequestData(
            req_ids=[self.req_ids[i] for i in rows],
            resumed_req_ids={self.req_ids[i] for i in resumed},
            new_block_ids=[
                (self.block_ids_of(i) or None) if self.kinds[i] == RUNNING else self.block_ids_of(i)
                for i in rows
            ],
            num_computed_tokens=[int(self.num_computed_tokens[i]) for i in rows],
        )

    def __repr__(self) -> str:
        return (
            f"SchedulerOutput(num_scheduled_tokens={self.num_scheduled_tokens}, "
            f"preempted={sorted(self.preempted_req_ids)}, "
            f"finished={sorted(self.finished_req_ids)})"
        )


def model_runner_columns(
    num_computed_tokens: list[int],
    num_scheduled: list[int],
    tables: list[list[int]],
    block_size: int,
) -> dict[str, np.ndarray]:
    """positions, slot_mapping, query_start_loc and seq_lens, written out
    request by request (the twin's way; the core writes them in Rust)."""
    positions: list[int] = []
    slot_mapping: list[int] = []
    for c, n, table in zip(num_computed_tokens, num_scheduled, tables, strict=True):
        for p in range(c, c + n):
            positions.append(p)
            slot_mapping.append(table[p // block_size] * block_size + p % block_size)
    query_start_loc = np.zeros(len(num_scheduled) + 1, dtype=np.int32)
    np.cumsum(num_scheduled, out=query_start_loc[1:])
    return {
        "positions": np.array(positions, dtype=np.int64),
        "slot_mapping": np.array(slot_mapping, dtype=np.int64),
        "query_start_loc": query_start_loc,
        "seq_lens": np.add(num_computed_tokens, num_scheduled, dtype=np.int32)
        if num_scheduled
        else np.zeros(0, dtype=np.int32),
    }


class RequestUpdate(NamedTuple):
    """What update_from_output reports for one request (spec §5.3)."""

    request_id: str
    new_token_ids: list[int]
    finish_reason: str | None  # "stop", "length", or None while it runs
    stop_reason: int | None  # the stop token that ended it


class UpdateOutputs(SequenceABC[RequestUpdate]):
    """update_from_output's records, in scheduling order, as columns; a
    ``RequestUpdate`` is built only for the rows someone reads."""

    def __init__(
        self,
        step_req_ids: list[str],
        rows: np.ndarray,
        tokens: np.ndarray,
        token_offsets: np.ndarray,
        cached_tokens: np.ndarray,
        finished: list[tuple[int, str, int | None]],
    ) -> None:
        self._step_req_ids = step_req_ids
        self.rows = rows  # each record's row in the step
        self.tokens = tokens  # flat; record i owns tokens[token_offsets[i]:token_offsets[i+1]]
        self.token_offsets = token_offsets
        # Per record: the request's tokens in hash-cached blocks after it.
        self.cached_tokens = cached_tokens
        self.finished = {rec: (reason, stop) for rec, reason, stop in finished}

    @cached_property
    def req_ids(self) -> list[str]:
        if len(self.rows) == len(self._step_req_ids):  # every row got tokens
            return self._step_req_ids
        return [self._step_req_ids[r] for r in self.rows.tolist()]

    @property
    def finished_req_ids(self) -> list[str]:
        return [self._step_req_ids[int(self.rows[rec])] for rec in self.finished]

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[RequestUpdate]:
        # One conversion for all rows: per-row NumPy slicing costs ~1 µs each.
        tokens, offsets = self.tokens.tolist(), self.token_offsets.tolist()
        finished = self.finished
        for i, rid in enumerate(self.req_ids):
            reason, stop = finished.get(i, (None, None))
            yield RequestUpdate(rid, tokens[offsets[i] : offsets[i + 1]], reason, stop)

    def __getitem__(self, i: int) -> RequestUpdate:  # type: ignore[override]
        if not -len(self) <= i < len(self):
            raise IndexError(i)
        i %= len(self)
        lo, hi = self.token_offsets[i], self.token_offsets[i + 1]
        reason, stop = self.finished.get(i, (None, None))
        return RequestUpdate(self.req_ids[i], self.tokens[lo:hi].tolist(), reason, stop)

    def __repr__(self) -> str:
        return f"UpdateOutputs({list(self)!r})"
