"""RunnerOutput: what the model runner hands the engine for one step."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class RunnerOutput:
    """One step's results, aligned with the step's rows."""

    #: One token per scheduled row; -1 where the row samples nothing (a
    #: prefill chunk) or its sampling failed.
    sampled: np.ndarray
    #: Rows whose sampling failed, with the reason: only those requests end.
    errors: dict[int, str] = field(default_factory=dict)
    #: For requests that asked for logprobs: the rows sampled through the
    #: full sampler, and the log-softmax of their raw logits (a torch tensor).
    logprobs: tuple[np.ndarray, Any] | None = None
