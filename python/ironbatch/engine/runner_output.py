"""RunnerOutput: what the model runner hands the engine for one step."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class RunnerOutput:
    """One step's results, aligned with the step's rows."""

    #: Without ``token_offsets``: one token per scheduled row; -1 where the
    #: row samples nothing (a prefill chunk) or its sampling failed. With
    #: them (a step that verified drafts): flattened, row ``i`` owning
    #: ``sampled[token_offsets[i]:token_offsets[i + 1]]`` (its accepted
    #: drafts and the token after them; none for a prefill chunk or a failed
    #: row).
    sampled: np.ndarray
    #: Rows whose sampling failed, with the reason: only those requests end.
    errors: dict[int, str] = field(default_factory=dict)
    #: For requests that asked for logprobs: the row of each entry and the
    #: log-softmax of the raw logits at it (a torch tensor, one line per
    #: entry). A row's entries are consecutive, one per emitted token in
    #: order (a failed row may have one although it emitted nothing).
    logprobs: tuple[np.ndarray, Any] | None = None
    token_offsets: np.ndarray | None = None

    def for_update(self, req_ids: Sequence[str]) -> np.ndarray | dict[str, list[int]]:
        """The tokens as ``Scheduler.update_from_output`` takes them: the
        aligned array, or ``{request_id: tokens}`` when rows have several."""
        if self.token_offsets is None:
            return self.sampled
        tokens, offsets = self.sampled.tolist(), self.token_offsets.tolist()
        return {
            rid: tokens[offsets[i] : offsets[i + 1]]
            for i, rid in enumerate(req_ids)
            if offsets[i + 1] > offsets[i]
        }
