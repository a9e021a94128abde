"""Speculative decoding on the scheduler's side (docs/scheduling.md §4.13,
§5.7): a request's draft tokens for its next step, and vLLM's
``SpecDecodingStats`` for what the verification accepted. The twin of
``rust/src/spec_decode.rs``.

Where drafts come from is the model runner's business (a proposer: n-gram
lookup, EAGLE, MTP, a draft model). The scheduler only schedules them as
extra tokens of a decode step and, when the step's output comes back, rolls
back the positions of the drafts that were rejected."""

from __future__ import annotations

from dataclasses import dataclass, field

#: A draft slot the proposer left empty: vLLM's ``ngram_gpu`` proposer hands
#: over ``k`` drafts per request and pads those it found no match for with -1
#: (docs/scheduling.md §4.13).
DRAFT_PADDING = -1


@dataclass(frozen=True)
class Drafts:
    """A request's drafts for its next step (vLLM's ``spec_token_ids``):
    proposed ``tokens`` (synchronous scheduling; token ids, or
    ``DRAFT_PADDING`` where vLLM's ``ngram_gpu`` proposer found no match:
    vLLM keeps the padding as drafts, scheduled, counted and always
    rejected, and strips it only before a grammar sees them), or under async scheduling
    ``placeholders`` positions for drafts the runner proposes while the step
    runs (vLLM's ``[-1] * k``). ``Drafts()`` is none."""

    tokens: tuple[int, ...] = ()
    placeholders: int = 0

    def __len__(self) -> int:
        return len(self.tokens) + self.placeholders

    def first(self, n: int) -> Drafts:
        """The first ``n`` drafts."""
        return Drafts(self.tokens[:n], min(n, self.placeholders))

    def write_to(self, column: list[int]) -> None:
        """Append the drafts to a step column (-1 for a placeholder)."""
        column.extend(self.tokens)
        column.extend([-1] * self.placeholders)


NO_DRAFTS = Drafts()


@dataclass
class SpecDecodingStats:
    """vLLM's ``SpecDecodingStats`` for one ``update_from_output``: drafts
    verified and accepted, over every request of the step that had drafts
    scheduled and got tokens back."""

    #: ``num_speculative_tokens``: the length of the per-position counts.
    num_spec_tokens: int
    #: Requests whose drafts were verified.
    num_drafts: int = 0
    #: Draft tokens verified (placeholders and padding included, as vLLM
    #: counts them).
    num_draft_tokens: int = 0
    #: Draft tokens accepted (before a stop trimmed any).
    num_accepted_tokens: int = 0
    #: Per draft position: how often it was accepted ...
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)
    #: ... and how often there was a draft at it.
    num_draft_tokens_per_pos: list[int] = field(default_factory=list)

    @classmethod
    def new(cls, num_spec_tokens: int) -> SpecDecodingStats:
        return cls(
            num_spec_tokens,
            num_accepted_tokens_per_pos=[0] * num_spec_tokens,
            num_draft_tokens_per_pos=[0] * num_spec_tokens,
        )

    def observe(self, num_draft_tokens: int, num_accepted: int) -> None:
        """One request's verification: ``num_draft_tokens`` drafts (at most
        ``num_spec_tokens``), ``num_accepted`` of them accepted."""
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted
        for i in range(num_accepted):
            self.num_accepted_tokens_per_pos[i] += 1
        for i in range(num_draft_tokens):
            self.num_draft_tokens_per_pos[i] += 1
