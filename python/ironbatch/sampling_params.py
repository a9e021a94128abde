"""SamplingParams: how a request's output is chosen and when it stops.

The scheduler reads the stopping rules (max_tokens, min_tokens, ignore_eos,
stop_token_ids); the rest is for the sampler."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ironbatch.tokens import token_list


@dataclass
class SamplingParams:
    max_tokens: int = 16
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: Sequence[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        for name in ("max_tokens", "min_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(
                f"min_tokens must be in [0, max_tokens={self.max_tokens}], got {self.min_tokens}"
            )
        if not isinstance(self.ignore_eos, bool):
            raise TypeError(f"ignore_eos must be a bool, got {type(self.ignore_eos).__name__}")
        self.stop_token_ids = token_list("stop_token_ids", self.stop_token_ids)
