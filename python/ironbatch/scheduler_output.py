"""What one schedule() decided, as columns.

The step crosses from the core as NumPy arrays, one entry per scheduled
request in scheduling order (running requests first, then admissions);
vLLM-style per-request views are built only when someone reads them."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from collections.abc import Sequence as SequenceABC
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, NamedTuple, Protocol

import numpy as np

from ironbatch._core import STEP_COLUMNS
from ironbatch.reference.step import Kind

__all__ = [
    "STEP_COLUMNS",
    "Kind",
    "ScheduledCachedRequests",
    "ScheduledEntry",
    "ScheduledNewRequest",
    "SchedulerOutput",
    "StepColumns",
    "RequestUpdate",
    "StepUpdate",
    "UpdateOutputs",
]


class ScheduledEntry(NamedTuple):
    """One request's share of a step, as the trace format records it."""

    request_id: str
    num_tokens: int
    kind: str  # "new", "resumed" or "running"
    num_computed_tokens: int  # before this step; the prefix hit for new/resumed
    # The whole table for new/resumed; new blocks for running (KV-cache group 0's).
    block_ids: list[int]


@dataclass
class ScheduledNewRequest:
    """A request this step admits for the first time (the shape of vLLM's
    ``NewRequestData``)."""

    req_id: str
    prompt_token_ids: list[int]
    sampling_params: Any
    block_ids: list[int]  # the whole table (KV-cache group 0's)
    num_computed_tokens: int
    # The whole table of every KV-cache group, in group order (vLLM's
    # block_ids tuple); a window group's past positions hold the null block 0.
    block_ids_per_group: list[list[int]] = field(default_factory=list)


@dataclass
class ScheduledCachedRequests:
    """The running and resumed requests of a step (the shape of vLLM's
    ``CachedRequestData``)."""

    req_ids: list[str]  # running requests, then resumed ones
    resumed_req_ids: set[str]
    # KV-cache group 0's new blocks (the whole table for a resumed request);
    # None: no new block for a running request.
    new_block_ids: list[list[int] | None]
    num_computed_tokens: list[int]
    # The same per KV-cache group, in group order (vLLM's new_block_ids
    # tuples): every group grows alike, so None means none grew.
    new_block_ids_per_group: list[list[list[int]] | None] = field(default_factory=list)


class StepColumns:
    """A step's columns as NumPy arrays, one row per scheduled request in
    scheduling order unless noted. Their names and dtypes are defined once,
    in the core (``rust/src/step.rs``; ``STEP_COLUMNS`` here), and both
    backends produce exactly those; the annotations below only type them (a
    test holds the two lists equal)."""

    req_slots: np.ndarray  # a request's stable row while it lives
    num_scheduled: np.ndarray
    num_computed_tokens: np.ndarray  # before the step; the prefix hit for new/resumed
    kinds: np.ndarray  # Kind: 0 new, 1 resumed, 2 running
    samples: np.ndarray  # the step reaches the request's last known token
    num_output_tokens: np.ndarray  # before the step, output placeholders included
    # Flattened per row and KV-cache group: with G groups, row i group g owns
    # [new_block_offsets[i*G + g], [i*G + g + 1]).
    new_block_ids: np.ndarray
    new_block_offsets: np.ndarray  # rows * G + 1
    positions: np.ndarray  # per scheduled token
    # per scheduled token: block_id * block_size + offset; with G KV-cache
    # groups, G runs of the step's tokens, group by group (none for a
    # cross-attention group: the encoder's tokens fill it)
    slot_mapping: np.ndarray
    query_start_loc: np.ndarray  # rows + 1
    seq_lens: np.ndarray
    num_spec_tokens: np.ndarray  # drafts scheduled: the row's last scheduled tokens
    spec_token_ids: np.ndarray  # flattened drafts in row order; -1 a placeholder

    def __getattr__(self, name: str) -> Any:
        # Called only for attributes not set yet. A column is made when first
        # read (from the backend's step, by name), then kept: a caller that
        # reads two columns pays for two, not fourteen (about 0.5 µs an array
        # on the core).
        if name in STEP_COLUMNS:
            value = self.__dict__[name] = self._handle.column(name)
            return value
        if name in _ID_SETS:
            ids = self.__dict__[name] = set(getattr(self._handle, name))
            return ids
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


# Made into sets from the backend's step when first read: most steps'
# callers read neither, and most steps have none.
_ID_SETS = frozenset({"preempted_req_ids", "finished_req_ids"})


class StepHandle(Protocol):
    """What a backend's step hands the API (the core's ``_core.Step``; the
    twin's adapter in ``scheduler_backends``), by name."""

    req_ids: list[str]  # the scheduled requests, in scheduling order
    preempted_req_ids: Sequence[str]  # since the previous step (sorted)
    finished_req_ids: Sequence[str]
    has_structured_output_requests: bool
    drafts_needed: bool
    has_sync_kv_loads: bool
    pending_structured_output_tokens: bool
    grammar_released: Sequence[str]
    grammar_failed: Sequence[str]
    scheduled_encoder_inputs: Sequence[tuple[str, list[int]]]
    free_encoder_mm_hashes: Sequence[str]
    encoder_mismatch: Sequence[str]
    new_block_ids_to_zero: Sequence[int]

    def column(self, name: str) -> np.ndarray: ...


class SchedulerOutput(StepColumns):
    """One step's decisions: the columns, the scheduled request ids, the
    preempted and finished ids, and vLLM-style per-request views built only
    when read."""

    _handle: StepHandle
    preempted_req_ids: set[str]  # preempted since the previous step
    finished_req_ids: set[str]  # finished since the previous step

    def __init__(
        self,
        step: StepHandle,
        lookup_request: Callable[[str], Any],
        num_kv_cache_groups: int = 1,
    ) -> None:
        # Four attributes, the rest read from the step when asked: this is
        # every step's cost on the core's path.
        self._handle = step  # the backend's step, for update_from_output
        self.req_ids = step.req_ids
        self._lookup_request = lookup_request
        #: KV-cache groups: each row's blocks come group by group.
        self.num_kv_cache_groups = num_kv_cache_groups

    @property
    def num_common_prefix_blocks(self) -> list[int]:
        return [0]  # vLLM 0.33 removed cascade attention

    @property
    def total_num_scheduled_tokens(self) -> int:
        return int(self.query_start_loc[-1])

    # Structured outputs (docs/scheduling.md §4.10), read from the backend's
    # step only when asked: most steps have none.

    @property
    def has_structured_output_requests(self) -> bool:
        """A structured-output request samples this step (vLLM's flag: the
        model runner applies grammar masks)."""
        return bool(self._handle.has_structured_output_requests)

    @property
    def drafts_needed(self) -> bool:
        """A request scheduled this step may verify the drafts proposed
        after it (vLLM's V2 runner skips drafting when none may:
        ``skip_drafts``; docs/scheduling.md §4.13)."""
        return bool(self._handle.drafts_needed)

    @property
    def has_sync_kv_loads(self) -> bool:
        """An admission takes external tokens a KV connector loads in this
        step (vLLM's ``has_sync_kv_loads``; docs/scheduling.md §4.19)."""
        return bool(self._handle.has_sync_kv_loads)

    @property
    def pending_structured_output_tokens(self) -> bool:
        """Async: such a request still has its previous token in flight, so
        its grammar mask must wait for that output."""
        return bool(self._handle.pending_structured_output_tokens)

    @property
    def grammar_released_req_ids(self) -> list[str]:
        """Requests this step's waiting pass found their grammar compiled
        and released (admitted or not), in the order reached."""
        return list(self._handle.grammar_released)

    @property
    def grammar_failed_req_ids(self) -> list[str]:
        """Requests this step's waiting pass found their grammar failed;
        they stay held until the caller ends them (``FINISHED_ERROR``)."""
        return list(self._handle.grammar_failed)

    # Multimodal inputs (docs/scheduling.md §4.15), read when asked.

    @property
    def scheduled_encoder_inputs(self) -> dict[str, list[int]]:
        """Request id -> the indices of its ``mm_features`` whose encoder
        runs this step (vLLM's field), in scheduling order."""
        return dict(self._handle.scheduled_encoder_inputs)

    @property
    def free_encoder_mm_hashes(self) -> list[str]:
        """Encoder-cache entries evicted since the previous step, by
        identifier: the runner drops them (vLLM's field)."""
        return list(self._handle.free_encoder_mm_hashes)

    @property
    def new_block_ids_to_zero(self) -> list[int]:
        """Attention blocks handed out during the step, which the runner
        zeroes before use when a recurrent group (Mamba, linear attention)
        shares the pool (vLLM's field); empty otherwise."""
        return list(self._handle.new_block_ids_to_zero)

    @property
    def encoder_mismatch_req_ids(self) -> list[str]:
        """Requests whose item reuses a cached identifier with another
        number of embeddings: nothing was scheduled for them; the caller
        ends them (``FINISHED_ERROR``), as vLLM does."""
        return list(self._handle.encoder_mismatch)

    def __len__(self) -> int:
        return len(self.req_ids)

    @cached_property
    def num_scheduled_tokens(self) -> dict[str, int]:
        """Request id -> tokens this step, in scheduling order."""
        return dict(zip(self.req_ids, self.num_scheduled.tolist(), strict=True))

    def block_ids_of(self, i: int, group: int = 0) -> list[int]:
        """Row ``i``'s blocks in KV-cache group ``group``: the whole table
        for an admission, the new blocks for a running request (none
        without a KV cache, §7.14)."""
        if self.num_kv_cache_groups == 0 and group == 0:
            return []
        if not 0 <= group < self.num_kv_cache_groups:
            raise IndexError(f"group {group} of {self.num_kv_cache_groups} KV-cache groups")
        k = i * self.num_kv_cache_groups + group
        lo, hi = self.new_block_offsets[k], self.new_block_offsets[k + 1]
        return self.new_block_ids[lo:hi].tolist()

    def block_ids_per_group(self, i: int) -> list[list[int]]:
        """Row ``i``'s blocks, one list per KV-cache group in group order
        (the shape of vLLM's ``block_ids`` tuples)."""
        g = self.num_kv_cache_groups
        offsets = self.new_block_offsets[i * g : i * g + g + 1].tolist()
        flat = self.new_block_ids
        return [flat[offsets[k] : offsets[k + 1]].tolist() for k in range(g)]

    def entries(self) -> Iterator[ScheduledEntry]:
        for i, rid in enumerate(self.req_ids):
            yield ScheduledEntry(
                rid,
                int(self.num_scheduled[i]),
                Kind(self.kinds[i]).name.lower(),
                int(self.num_computed_tokens[i]),
                self.block_ids_of(i),
            )

    @cached_property
    def scheduled_new_reqs(self) -> list[ScheduledNewRequest]:
        out = []
        for i in np.flatnonzero(self.kinds == Kind.NEW).tolist():
            request = self._lookup_request(self.req_ids[i])
            out.append(
                ScheduledNewRequest(
                    self.req_ids[i],
                    request.prompt_token_ids,
                    request.sampling_params,
                    self.block_ids_of(i),
                    int(self.num_computed_tokens[i]),
                    self.block_ids_per_group(i),
                )
            )
        return out

    @cached_property
    def scheduled_cached_reqs(self) -> ScheduledCachedRequests:
        running = np.flatnonzero(self.kinds == Kind.RUNNING).tolist()
        resumed = np.flatnonzero(self.kinds == Kind.RESUMED).tolist()
        rows = running + resumed
        return ScheduledCachedRequests(
            req_ids=[self.req_ids[i] for i in rows],
            resumed_req_ids={self.req_ids[i] for i in resumed},
            new_block_ids=[
                (self.block_ids_of(i) or None)
                if self.kinds[i] == Kind.RUNNING
                else self.block_ids_of(i)
                for i in rows
            ],
            num_computed_tokens=[int(self.num_computed_tokens[i]) for i in rows],
            new_block_ids_per_group=[self._new_blocks_per_group(i) for i in rows],
        )

    def _new_blocks_per_group(self, i: int) -> list[list[int]] | None:
        """A cached row's blocks per group; None where every group's list
        is empty (vLLM's ``get_block_ids(allow_none=True)``): a running
        request that got none, any row without a KV cache."""
        per_group = self.block_ids_per_group(i)
        return per_group if any(per_group) else None

    def __repr__(self) -> str:
        return (
            f"SchedulerOutput(num_scheduled_tokens={self.num_scheduled_tokens}, "
            f"preempted={sorted(self.preempted_req_ids)}, "
            f"finished={sorted(self.finished_req_ids)})"
        )


class RequestUpdate(NamedTuple):
    """What update_from_output reports for one request (docs/scheduling.md
    §5.3)."""

    request_id: str
    new_token_ids: list[int]
    finish_reason: str | None  # "stop", "length", "repetition", or None while it runs
    # The stop token that ended it, or "repetition_detected".
    stop_reason: int | str | None
    # Only a streaming session's turn ended (finish_reason is the turn's): the
    # request lives on, waiting for its next chunk (docs/scheduling.md §4.12).
    session_continues: bool = False


class StepUpdate(Protocol):
    """What a backend's update reports, by name (the core's
    ``_core.StepUpdate``; the twin's output is brought to the same shape)."""

    rows: np.ndarray  # each record's row in the step
    tokens: np.ndarray  # flattened; record i owns tokens[token_offsets[i]:[i + 1]]
    token_offsets: np.ndarray
    cached_tokens: np.ndarray  # per record: its tokens in hash-cached blocks after it
    finished: Sequence[FinishedRecord]
    spec_decoding_stats: Any  # vLLM's SpecDecodingStats fields; None without drafts

    def __len__(self) -> int: ...  # records


class FinishedRecord(Protocol):
    record: int
    request_id: str
    finish_reason: str
    stop_reason: int | str | None
    session_continues: bool


# A record that did not end its request: no reason, no stop, nothing goes on.
_RUNNING: tuple[None, None, bool] = (None, None, False)


class UpdateOutputs(SequenceABC[RequestUpdate]):
    """update_from_output's records, in scheduling order, as columns; a
    ``RequestUpdate`` is built only for the rows someone reads."""

    def __init__(self, step_req_ids: list[str], update: StepUpdate) -> None:
        self._step_req_ids = step_req_ids
        self._update = update

    @cached_property
    def finished(self) -> dict[int, tuple[str, int | str | None, bool]]:
        """Record -> (finish reason, stop reason, whether a session goes on),
        for the records whose request finished."""
        return {
            f.record: (f.finish_reason, f.stop_reason, f.session_continues)
            for f in self._update.finished
        }

    @property
    def errored(self) -> list[str]:
        """Requests the update ended with an error, in the order ended:
        those a failed KV load ended (``"fail"`` policy, docs/scheduling.md
        §4.19) and those ``errors`` named; the ending adds no row."""
        return self._update.errored

    @property
    def spec_decoding_stats(self) -> Any:
        """Drafts verified in this output (vLLM's ``SpecDecodingStats``
        fields: ``num_drafts``, ``num_draft_tokens``,
        ``num_accepted_tokens``, per position); None when none were."""
        return self._update.spec_decoding_stats

    # The columns are read from the backend's update when first asked for:
    # the core makes a NumPy array only then (most steps' callers read none).

    @property
    def rows(self) -> np.ndarray:
        return self._update.rows

    @property
    def tokens(self) -> np.ndarray:
        return self._update.tokens

    @property
    def token_offsets(self) -> np.ndarray:
        return self._update.token_offsets

    @property
    def cached_tokens(self) -> np.ndarray:
        return self._update.cached_tokens

    @cached_property
    def req_ids(self) -> list[str]:
        if len(self._update) == len(self._step_req_ids):  # every row got tokens
            return self._step_req_ids
        return [self._step_req_ids[r] for r in self.rows.tolist()]

    @property
    def finished_req_ids(self) -> list[str]:
        """Requests that ended (a session whose turn ended lives on)."""
        # By the records' own ids: the rows column would be made (and read
        # cold) for every record, ~10 µs a step with 256 running.
        return [f.request_id for f in self._update.finished if not f.session_continues]

    def __len__(self) -> int:
        return len(self._update)

    def __iter__(self) -> Iterator[RequestUpdate]:
        # One conversion for all rows: per-row NumPy slicing costs ~1 µs each.
        tokens, offsets = self.tokens.tolist(), self.token_offsets.tolist()
        finished = self.finished
        for i, rid in enumerate(self.req_ids):
            reason, stop, continues = finished.get(i, _RUNNING)
            yield RequestUpdate(rid, tokens[offsets[i] : offsets[i + 1]], reason, stop, continues)

    def __getitem__(self, i: int) -> RequestUpdate:  # type: ignore[override]
        if not -len(self) <= i < len(self):
            raise IndexError(i)
        i %= len(self)
        lo, hi = self.token_offsets[i], self.token_offsets[i + 1]
        reason, stop, continues = self.finished.get(i, _RUNNING)
        tokens = self.tokens[lo:hi].tolist()
        return RequestUpdate(self.req_ids[i], tokens, reason, stop, continues)

    def __repr__(self) -> str:
        return f"UpdateOutputs({list(self)!r})"
