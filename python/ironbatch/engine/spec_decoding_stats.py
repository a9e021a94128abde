"""SpecDecodingStats: an engine's speculative decoding counts since it
started, summed over steps."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class SpecDecodingStats:
    """vLLM's ``SpecDecodingStats`` fields, summed over every update the
    scheduler reported (drafts it scheduled and the runner verified), plus
    what the proposer offered (some of which the scheduler drops: a request
    that finished, was preempted, or whose step was cut short)."""

    num_spec_tokens: int
    #: Verifications: requests whose scheduled drafts were checked.
    num_drafts: int = 0
    #: Draft tokens verified (the scheduler's placeholder padding included).
    num_draft_tokens: int = 0
    #: Draft tokens accepted (before a stop token trimmed any).
    num_accepted_tokens: int = 0
    #: Per draft position: how often a draft there was accepted.
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)
    #: Proposals made (a request given at least one draft) and their tokens.
    num_proposals: int = 0
    num_proposed_tokens: int = 0

    def __post_init__(self) -> None:
        if not self.num_accepted_tokens_per_pos:
            self.num_accepted_tokens_per_pos = [0] * self.num_spec_tokens

    def observe(self, update: Any) -> None:
        """Add one update's stats (``UpdateOutputs.spec_decoding_stats``, from
        either scheduler backend); None adds nothing."""
        if update is None:
            return
        self.num_drafts += update.num_drafts
        self.num_draft_tokens += update.num_draft_tokens
        self.num_accepted_tokens += update.num_accepted_tokens
        for pos, n in enumerate(update.num_accepted_tokens_per_pos):
            self.num_accepted_tokens_per_pos[pos] += n

    @property
    def acceptance_rate(self) -> float:
        """Accepted draft tokens per verified draft token (0 before any)."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens a verifying step emits on average: 1 + accepted per
        verification (vLLM's metric)."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0
