"""SamplingParams: how a request's output is chosen and when it stops.

The scheduler reads the stopping rules (max_tokens, min_tokens, ignore_eos,
stop_token_ids); the engine's sampler reads the rest. Names and defaults
follow vLLM's."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ironbatch.tokens import token_list


def _number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    if value != value:
        raise ValueError(f"{name} must not be NaN")
    return float(value)


def _integer(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    return value


@dataclass
class SamplingParams:
    max_tokens: int = 16
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: Sequence[int] = field(default_factory=list)
    temperature: float = 1.0  # 0: greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: off
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: Sequence[str] = field(default_factory=list)  # stop strings (detokenized text)
    include_stop_str_in_output: bool = False
    logprobs: int | None = None  # top logprobs per output token
    n: int = 1
    skip_special_tokens: bool = True

    def __post_init__(self) -> None:
        for name in ("max_tokens", "min_tokens", "top_k", "n"):
            _integer(name, getattr(self, name))
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(
                f"min_tokens must be in [0, max_tokens={self.max_tokens}], got {self.min_tokens}"
            )
        if not isinstance(self.ignore_eos, bool):
            raise TypeError(f"ignore_eos must be a bool, got {type(self.ignore_eos).__name__}")
        self.stop_token_ids = token_list("stop_token_ids", self.stop_token_ids)
        self.temperature = _number("temperature", self.temperature)
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        self.top_p = _number("top_p", self.top_p)
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise ValueError(f"top_k must be -1, 0 (off) or positive, got {self.top_k}")
        self.min_p = _number("min_p", self.min_p)
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.seed is not None:
            _integer("seed", self.seed)
        for name in ("presence_penalty", "frequency_penalty"):
            value = _number(name, getattr(self, name))
            if not -2 <= value <= 2:
                raise ValueError(f"{name} must be in [-2, 2], got {value}")
            setattr(self, name, value)
        self.repetition_penalty = _number("repetition_penalty", self.repetition_penalty)
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if not all(isinstance(s, str) and s for s in self.stop):
            raise ValueError(f"stop must be non-empty strings, got {self.stop!r}")
        self.stop = list(self.stop)
        if self.logprobs is not None:
            _integer("logprobs", self.logprobs)
            if self.logprobs < 0:
                raise ValueError(f"logprobs must be >= 0, got {self.logprobs}")
        if self.n < 1:
            raise ValueError(f"n must be at least 1, got {self.n}")
        if self.n > 1:
            raise ValueError(f"n > 1 is not supported yet, got {self.n}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
