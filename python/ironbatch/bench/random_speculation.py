"""A proposer's drafts and a rejection sampler's verdicts, drawn at random from
a seeded stream, for recording speculative traces from vLLM's own scheduler
(``benches/record_vllm.py --spec``). Plain Python, no vLLM: the recorder hands
the drafts to vLLM's scheduler and builds each step's sampled tokens from the
verdicts, as a model runner would."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

# vLLM's draft placeholder: a padded admission's drafts (docs/scheduling.md
# §4.13). The runner rejects it; no token id is negative.
PLACEHOLDER = -1
FIRST_TOKEN = 3  # the recorder's ordinary tokens are 3..vocab-1 (0-2 are special)


@dataclass
class RandomSpeculation:
    """Drafts of 0..``num_speculative_tokens`` tokens and how many of them
    are accepted; every draw comes from ``rng``, so a seed records the same
    trace every time."""

    num_speculative_tokens: int
    rng: random.Random
    eos_token_id: int
    vocab_size: int

    def drafts(self, *, history: Sequence[int], stop_token_ids: Sequence[int]) -> list[int]:
        """A proposal for the positions after ``history`` (the request's
        tokens so far): half the time copied from an earlier stretch of its
        own tokens, as an n-gram proposer guesses, otherwise random; a few
        drafts are EOS or a stop token, so that accepted runs sometimes end
        the request part-way."""
        k = self.num_speculative_tokens
        # Full proposals are the common case for an n-gram proposer that hits.
        n = self.rng.choice([0, k, k, *range(1, k + 1)])
        drafts: list[int] = []
        if history and self.rng.random() < 0.5:
            start = self.rng.randrange(len(history))
            drafts = list(history[start : start + n])
        while len(drafts) < n:
            drafts.append(self.rng.randrange(FIRST_TOKEN, self.vocab_size))
        for i in range(n):
            u = self.rng.random()
            if u < 0.04:
                drafts[i] = self.eos_token_id
            elif u < 0.07 and stop_token_ids:
                drafts[i] = self.rng.choice(list(stop_token_ids))
        return drafts

    def num_accepted(self, drafts: Sequence[int]) -> int:
        """How many leading ``drafts`` the verification keeps: 0 up to all of
        them, all more often than a uniform draw (so max_tokens and stop
        tokens fall inside accepted runs), never a placeholder."""
        real = next((i for i, t in enumerate(drafts) if t == PLACEHOLDER), len(drafts))
        if real and self.rng.random() < 0.3:
            return real
        return self.rng.randint(0, real)
