"""NgramProposer: drafts by prompt lookup, as vLLM 0.33's n-gram proposer
makes them.

The suffix of a request's known tokens (prompt and output) is looked up
earlier in those same tokens: the longest suffix of ``prompt_lookup_max``
down to ``prompt_lookup_min`` tokens that occurs earlier wins, and among its
occurrences the first one (vLLM's choice: its search keeps the earliest
match of the longest length). The tokens that followed that occurrence, up
to ``num_speculative_tokens`` and never past ``max_model_len``, are the
drafts. An occurrence may overlap the suffix; at least one token always
follows it."""

from __future__ import annotations

import numpy as np

_NONE = np.zeros(0, dtype=np.int64)


class NgramProposer:
    def __init__(
        self,
        *,
        num_speculative_tokens: int,
        prompt_lookup_min: int,
        prompt_lookup_max: int,
        max_model_len: int,
    ) -> None:
        self.k = num_speculative_tokens
        self.min_n, self.max_n = prompt_lookup_min, prompt_lookup_max
        self.max_model_len = max_model_len

    def propose(self, tokens: np.ndarray) -> np.ndarray:
        """Drafts for a request whose known tokens are ``tokens`` (1-D); an
        empty array when nothing matches or no room is left."""
        total = len(tokens)
        k = min(self.k, self.max_model_len - total)
        if total < self.min_n or k <= 0:
            return _NONE
        # Candidate occurrences by their last index; the suffix itself (ending
        # at total - 1) is not one. Extending every candidate one token to the
        # left per round keeps those matching the longer suffix, in order.
        ends = np.flatnonzero(tokens[: total - 1] == tokens[total - 1])
        length = 1
        while ends.size and length < self.max_n:
            reach = ends[ends >= length]
            longer = reach[tokens[reach - length] == tokens[total - 1 - length]]
            if not longer.size:
                break
            ends, length = longer, length + 1
        if not ends.size or length < self.min_n:
            return _NONE
        start = int(ends[0]) + 1  # after the first occurrence of the longest match
        return np.asarray(tokens[start : start + k], dtype=np.int64)
