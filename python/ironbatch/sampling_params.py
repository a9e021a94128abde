"""SamplingParams: how a request's output is chosen and when it stops.

The scheduler reads the stopping rules (max_tokens, min_tokens, ignore_eos,
stop_token_ids); the engine's sampler reads the rest. Names, defaults and
the rules a value must follow are vLLM 0.33's: what vLLM refuses is refused
here with a ValueError naming the field, and what vLLM adjusts (a
temperature below 0.01, ``seed=-1``, repeated stop ids) is adjusted the same
way. ``verify`` adds the checks that need the model (vocabulary size and the
engine's ``max_logprobs``), as vLLM's input processor does."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from ironbatch.reference.args import u32_list
from ironbatch.reference.limits import MAX_TOKENS, check_range

logger = logging.getLogger(__name__)

#: Below this a temperature means greedy (vLLM's ``_SAMPLING_EPS``).
SAMPLING_EPS = 1e-5
#: A positive temperature below this is raised to it: dividing logits by a
#: smaller one overflows to inf (vLLM's ``_MAX_TEMP``, despite its name).
MIN_TEMPERATURE = 1e-2
#: The largest temperature vLLM 0.33 accepts.
MAX_TEMPERATURE = 2.0
#: Seeds are int64, as vLLM's API bounds them and torch generators take them.
SEED_RANGE = (-(2**63), 2**63 - 1)


def _number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value}")
    return float(value)


def _integer(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    return value


@dataclass(frozen=True)
class RepetitionDetectionParams:
    """Stop a request whose output ends in a pattern of
    ``min_pattern_size..max_pattern_size`` tokens (0 means 1) repeated
    ``min_count`` times (vLLM's ``repetition_detection``; finish reason
    ``"repetition"``). Checked once ``min_tokens`` are out."""

    max_pattern_size: int = 0
    min_pattern_size: int = 0
    min_count: int = 0

    def __post_init__(self) -> None:
        for name in ("max_pattern_size", "min_pattern_size", "min_count"):
            _integer(name, getattr(self, name))
        if not 0 <= self.min_pattern_size <= self.max_pattern_size:
            raise ValueError(
                "repetition_detection: max_pattern_size and min_pattern_size must be >= 0 "
                f"with min_pattern_size <= max_pattern_size, got {self.min_pattern_size} and "
                f"{self.max_pattern_size}"
            )
        if self.max_pattern_size > 0 and self.min_count < 2:
            raise ValueError(f"repetition_detection: min_count must be >= 2, got {self.min_count}")


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
    seed: int | None = None  # -1: none
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: Sequence[str] = field(default_factory=list)  # stop strings (detokenized text)
    include_stop_str_in_output: bool = False
    logprobs: int | None = None  # top logprobs per output token; -1: the whole vocabulary
    n: int = 1
    skip_special_tokens: bool = True
    repetition_detection: RepetitionDetectionParams | None = None
    # Compute every prompt token even when a prefix is cached (vLLM turns it
    # on for prompt logprobs); the request's blocks are still cached.
    skip_reading_prefix_cache: bool = False

    def __post_init__(self) -> None:
        for name in ("max_tokens", "min_tokens", "top_k", "n"):
            _integer(name, getattr(self, name))
        check_range("max_tokens", self.max_tokens, 1, MAX_TOKENS)
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(
                f"min_tokens must be in [0, max_tokens={self.max_tokens}], got {self.min_tokens}"
            )
        for name in ("ignore_eos", "skip_reading_prefix_cache"):
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
        # Repeats say nothing more; vLLM drops them, keeping the first.
        self.stop_token_ids = list(dict.fromkeys(u32_list("stop_token_ids", self.stop_token_ids)))
        self._check_temperature()
        self.top_p = _number("top_p", self.top_p)
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise ValueError(f"top_k must be -1, 0 (off) or positive, got {self.top_k}")
        self.min_p = _number("min_p", self.min_p)
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        self._check_seed()
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
            if self.logprobs < -1:
                raise ValueError(f"logprobs must be >= 0, or -1 for all, got {self.logprobs}")
        if self.repetition_detection is not None and not isinstance(
            self.repetition_detection, RepetitionDetectionParams
        ):
            raise TypeError(
                "repetition_detection must be a RepetitionDetectionParams, got "
                f"{type(self.repetition_detection).__name__}"
            )
        if self.n < 1:
            raise ValueError(f"n must be at least 1, got {self.n}")
        if self.n > 1:
            raise ValueError(f"n > 1 is not supported yet, got {self.n}")
        if self.greedy:  # what greedy ignores, reset as vLLM resets it
            self.top_p, self.top_k, self.min_p = 1.0, 0, 0.0

    def _check_temperature(self) -> None:
        t = _number("temperature", self.temperature)
        if not 0 <= t <= MAX_TEMPERATURE:
            raise ValueError(f"temperature must be in [0, {MAX_TEMPERATURE}], got {t}")
        if 0 < t < MIN_TEMPERATURE:
            logger.warning(
                "temperature %s is below %s, where logits overflow; using %s",
                t,
                MIN_TEMPERATURE,
                MIN_TEMPERATURE,
            )
            t = MIN_TEMPERATURE
        self.temperature = t

    def _check_seed(self) -> None:
        if self.seed is None:
            return
        _integer("seed", self.seed)
        if self.seed == -1:  # vLLM's "no seed"
            self.seed = None
            return
        low, high = SEED_RANGE
        if not low <= self.seed <= high:
            raise ValueError(f"seed must be in [{low}, {high}], got {self.seed}")

    def verify(self, vocab_size: int, max_logprobs: int = 20) -> None:
        """The checks that need the model, run where a request enters an
        engine: token ids inside the vocabulary, and ``logprobs`` at most
        ``max_logprobs`` (-1: the vocabulary size)."""
        bad = [t for t in self.stop_token_ids if t >= vocab_size]
        if bad:
            raise ValueError(f"stop_token_ids {bad} are outside the vocabulary [0, {vocab_size})")
        if self.logprobs is not None:
            allowed = vocab_size if max_logprobs == -1 else max_logprobs
            wanted = vocab_size if self.logprobs == -1 else self.logprobs
            if wanted > allowed:
                raise ValueError(
                    f"logprobs = {self.logprobs} asks for {wanted} logprobs per token; "
                    f"max_logprobs allows {allowed}"
                )

    @property
    def greedy(self) -> bool:
        return self.temperature < SAMPLING_EPS
