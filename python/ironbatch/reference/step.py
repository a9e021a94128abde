"""What one ``schedule()`` decided and what one ``update_from_output()``
reported, as columns (docs/scheduling.md §4.7, §5.3): the twin of
``rust/src/step.rs``."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, ClassVar

from ironbatch.reference.request import RequestStatus
from ironbatch.reference.spec_decode import NO_DRAFTS, Drafts, SpecDecodingStats

if TYPE_CHECKING:
    # The scheduler's, as in the core (importing it here would be circular).
    from ironbatch.reference.scheduler.encoder_inputs import ScheduledEncoderInputs


class Kind(enum.IntEnum):
    """How a request entered this step (``.name.lower()``: its trace name)."""

    #: First admission.
    NEW = 0
    #: Admitted again after a preemption.
    RESUMED = 1
    #: Continuing.
    RUNNING = 2


@dataclass
class StepEntry:
    """One request's share of a step."""

    slot: int
    #: The slot's generation when scheduled: a request freed meanwhile (and
    #: its slot reused) is recognised and skipped by the update.
    generation: int
    num_tokens: int
    kind: Kind
    #: Before this step; the prefix hit for new and resumed requests.
    num_computed_tokens: int
    #: The step reaches the request's last known token, so it samples.
    samples: bool
    #: The drafts scheduled: the last ``len(drafts)`` of its ``num_tokens``
    #: positions (vLLM's ``scheduled_spec_decode_tokens``).
    drafts: Drafts = NO_DRAFTS


@dataclass
class StepColumns:
    """A step's decisions as columns, for the model runner: one row per
    scheduled request in scheduling order, except where a field says
    otherwise. Field names and order are ``ironbatch._core.STEP_COLUMNS``."""

    #: The request's slot: its stable row while it lives.
    req_slots: list[int] = field(default_factory=list)
    #: Tokens scheduled for it this step.
    num_scheduled: list[int] = field(default_factory=list)
    #: Tokens computed before this step (the prefix hit for new and resumed).
    num_computed_tokens: list[int] = field(default_factory=list)
    #: How it entered the step: a ``Kind`` as an int.
    kinds: list[int] = field(default_factory=list)
    #: The step reaches its last known token, so it samples one.
    samples: list[bool] = field(default_factory=list)
    #: Output tokens before this step, placeholders included.
    num_output_tokens: list[int] = field(default_factory=list)
    #: Whole tables for new and resumed requests, new blocks for running
    #: ones, flattened per row and KV-cache group: with ``G`` groups, row
    #: ``i`` group ``g`` owns ``new_block_ids[offsets[i*G+g]:offsets[i*G+g+1]]``.
    new_block_ids: list[int] = field(default_factory=list)
    #: Offsets into ``new_block_ids`` (rows * G + 1).
    new_block_offsets: list[int] = field(default_factory=list)
    #: Per scheduled token: its position.
    positions: list[int] = field(default_factory=list)
    #: Per scheduled token: its KV-cache slot
    #: (``block_id * block_size + position % block_size``); with ``G``
    #: groups, ``G`` runs of the step's tokens, group by group (none for a
    #: cross-attention group, whose slots the encoder's tokens fill).
    slot_mapping: list[int] = field(default_factory=list)
    #: Prefix sums of the token counts (rows + 1).
    query_start_loc: list[int] = field(default_factory=list)
    #: ``num_computed_tokens + num_scheduled`` per row.
    seq_lens: list[int] = field(default_factory=list)
    #: Draft tokens scheduled per row: the last ones of its scheduled tokens.
    num_spec_tokens: list[int] = field(default_factory=list)
    #: The scheduled drafts, flattened in row order (-1: a placeholder for a
    #: draft the runner proposes itself, under async scheduling).
    spec_token_ids: list[int] = field(default_factory=list)

    #: The columns' names and NumPy dtype names, in declaration order.
    DTYPES: ClassVar[dict[str, str]] = {
        "req_slots": "int32",
        "num_scheduled": "int32",
        "num_computed_tokens": "int32",
        "kinds": "uint8",
        "samples": "bool",
        "num_output_tokens": "int32",
        "new_block_ids": "int32",
        "new_block_offsets": "int32",
        "positions": "int64",
        "slot_mapping": "int64",
        "query_start_loc": "int32",
        "seq_lens": "int32",
        "num_spec_tokens": "int32",
        "spec_token_ids": "int64",
    }

    def into_named(self) -> list[tuple[str, list[int] | list[bool]]]:
        """Every column by name, in declaration order."""
        return [(f.name, getattr(self, f.name)) for f in fields(self)]


@dataclass
class StepOutput:
    """One step's decisions, in scheduling order, and the model runner's inputs."""

    entries: list[StepEntry] = field(default_factory=list)
    #: The entries as columns.
    columns: StepColumns = field(default_factory=StepColumns)
    #: Preempted since the previous step's output, in preemption order
    #: (the order vLLM adds them to its set).
    preempted_req_ids: list[str] = field(default_factory=list)
    #: Attention blocks handed out during the step, for the runner to zero
    #: (vLLM's ``new_block_ids_to_zero``; empty without recurrent groups).
    new_block_ids_to_zero: list[int] = field(default_factory=list)
    #: Finished since the previous step's output, in the order they
    #: finished (the order vLLM adds them to its set).
    finished_req_ids: list[str] = field(default_factory=list)
    #: A structured-output request samples this step (vLLM's
    #: ``has_structured_output_requests``: the model runner applies grammars).
    has_structured_output_requests: bool = False
    #: Async: a structured-output request sampling this step still has its
    #: previous token in flight, so its grammar mask must wait for that
    #: output (vLLM's ``pending_structured_output_tokens``).
    pending_structured_output_tokens: bool = False
    #: A request scheduled this step may verify drafts proposed after it:
    #: false when each one either stops before its prompt's end or reaches
    #: ``max_tokens`` with the token it samples (vLLM's V2 runner then skips
    #: drafting: ``skip_drafts``).
    drafts_needed: bool = False
    #: An admission this step takes external tokens a KV connector loads in
    #: the step itself (vLLM's ``has_sync_kv_loads``, §4.19).
    has_sync_kv_loads: bool = False
    #: Requests this step's waiting pass released, their grammar compiled,
    #: in the order reached (admitted or not).
    grammar_released: list[int] = field(default_factory=list)
    #: Requests this step's waiting pass reached whose grammar failed to
    #: compile, in the order reached (still held; the caller ends them).
    grammar_failed: list[int] = field(default_factory=list)
    #: The encoder inputs the runner computes this step, per request in
    #: scheduling order (vLLM's ``scheduled_encoder_inputs``).
    scheduled_encoder_inputs: list[ScheduledEncoderInputs] = field(default_factory=list)
    #: Encoder-cache entries evicted since the previous step (vLLM's
    #: ``free_encoder_mm_hashes``): the runner drops them.
    free_encoder_mm_hashes: list[str] = field(default_factory=list)
    #: Requests whose encoder input has an identifier the cache holds with
    #: another number of embeddings; nothing was scheduled for them and the
    #: caller ends them with an error.
    encoder_mismatch: list[int] = field(default_factory=list)
    #: Identify the scheduler and the step, so an output is applied once,
    #: to the scheduler that made it.
    scheduler_id: int = 0
    step_id: int = 0

    @classmethod
    def with_capacity(cls, rows: int, tokens: int) -> StepOutput:
        """An empty step whose offset columns start at 0 (``rows`` and
        ``tokens`` are the core's capacity hints; Python lists just grow)."""
        del rows, tokens
        out = cls()
        out.columns.query_start_loc.append(0)
        out.columns.new_block_offsets.append(0)
        return out

    def push_entry(self, e: StepEntry, num_output_tokens: int) -> None:
        """Start a row: the entry's fields."""
        c = self.columns
        c.req_slots.append(e.slot)
        c.num_scheduled.append(e.num_tokens)
        c.num_computed_tokens.append(e.num_computed_tokens)
        c.kinds.append(int(e.kind))
        c.samples.append(e.samples)
        c.num_output_tokens.append(num_output_tokens)
        c.num_spec_tokens.append(len(e.drafts))
        e.drafts.write_to(c.spec_token_ids)

    def push_new_blocks(self, ids: list[int]) -> None:
        """The row's new blocks."""
        self.columns.new_block_ids.extend(ids)

    def push_slot(self, slot: int) -> None:
        """Another KV-cache group's slot for a token (after every row's
        group-0 slots)."""
        self.columns.slot_mapping.append(slot)

    def end_group(self) -> None:
        """Close a KV-cache group's new blocks in the row (every group's,
        the last included)."""
        c = self.columns
        c.new_block_offsets.append(len(c.new_block_ids))

    def push_token(self, position: int, slot: int | None) -> None:
        """One scheduled token of the row, with its group-0 slot (None
        without a KV cache)."""
        self.columns.positions.append(position)
        if slot is not None:
            self.columns.slot_mapping.append(slot)

    def end_entry(self, seq_len: int) -> None:
        """Close the row; ``seq_len`` is where its tokens end."""
        c = self.columns
        c.query_start_loc.append(len(c.positions))
        c.seq_lens.append(seq_len)

    def total_num_scheduled_tokens(self) -> int:
        """Tokens scheduled in all."""
        return sum(e.num_tokens for e in self.entries)

    def block_ids_of(self, i: int) -> list[int]:
        """Row ``i``'s block ids (whole table or new blocks) with one
        KV-cache group; with ``G`` groups, row ``i // G``'s of group
        ``i % G``."""
        c = self.columns
        return c.new_block_ids[c.new_block_offsets[i] : c.new_block_offsets[i + 1]]


@dataclass
class UpdateRecord:
    """One request's result from ``update_from_output``."""

    #: The request's row in the step's entries.
    entry: int
    #: The request's slot (already free again if it finished).
    slot: int
    #: This record's tokens end at ``UpdateOutput.tokens[:tokens_end]``
    #: (they start where the previous record's end).
    tokens_end: int
    #: Tokens of the request held in hash-cached blocks after this output
    #: (vLLM's ``estimate_cached_tokens``, for its prefill stats).
    cached_tokens: int


@dataclass
class Finished:
    """A request that finished in ``update_from_output`` (it is freed already)."""

    #: Its row in ``UpdateOutput.records``.
    record: int
    request_id: str
    status: RequestStatus
    #: The stop token that ended it.
    stop_reason: int | str | None
    #: All its tokens, prompt first, and its ``num_computed_tokens``: what
    #: it ended with.
    token_ids: list[int]
    num_computed_tokens: int
    #: A streaming session's turn ended, not the request: it lives on,
    #: waiting for (or with) its next chunk (docs/scheduling.md §4.12).
    session_continues: bool = False


@dataclass
class UpdateOutput:
    """What ``update_from_output`` reported, in scheduling order: one record
    per request that got tokens."""

    records: list[UpdateRecord] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    finished: list[Finished] = field(default_factory=list)
    #: Drafts verified in this output; None when no request that got tokens
    #: had drafts scheduled.
    spec_decoding_stats: SpecDecodingStats | None = None
    #: Requests the update ended with an error, in the order ended: those a
    #: failed KV load ended (the "fail" policy, §4.19) and those the caller
    #: named. The ending gives them no record.
    errored: list[ErroredRequest] = field(default_factory=list)


@dataclass
class ErroredRequest:
    """A request an update ended with an error."""

    #: Its slot when it ended (free again unless its blocks are held).
    slot: int
    request_id: str
    #: All its tokens, prompt first, and its ``num_computed_tokens``, as it
    #: ended (the step's output applied): what vLLM's ``Request`` holds then.
    token_ids: list[int]
    num_computed_tokens: int
