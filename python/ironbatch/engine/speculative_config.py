"""SpeculativeConfig: the engine's speculative decoding settings, read from
the keys of vLLM 0.33's ``--speculative-config`` for its n-gram
(prompt-lookup) proposer, the one method the engine implements."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# vLLM spells the method either way; "[ngram]" is its legacy model name.
_NGRAM_NAMES = ("ngram", "[ngram]")
# vLLM's default window when neither bound is given.
DEFAULT_PROMPT_LOOKUP = 5
_KEYS = ("method", "model", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max")


@dataclass(frozen=True)
class SpeculativeConfig:
    """N-gram speculation: after each step, the longest suffix n-gram
    (``prompt_lookup_max`` down to ``prompt_lookup_min`` tokens) that occurred
    earlier in the request's prompt and output proposes the up-to
    ``num_speculative_tokens`` tokens that followed it."""

    num_speculative_tokens: int
    prompt_lookup_min: int = DEFAULT_PROMPT_LOOKUP
    prompt_lookup_max: int = DEFAULT_PROMPT_LOOKUP
    method: str = "ngram"

    def __post_init__(self) -> None:
        if self.method != "ngram":
            raise ValueError(
                f"speculative_config method must be 'ngram' (the only method the engine "
                f"supports), got {self.method!r}"
            )
        for name in ("num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max"):
            _check_count(name, getattr(self, name))
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(
                f"speculative_config prompt_lookup_min={self.prompt_lookup_min} must be "
                f"<= prompt_lookup_max={self.prompt_lookup_max}"
            )

    @classmethod
    def of(cls, config: SpeculativeConfig | Mapping[str, Any] | None) -> SpeculativeConfig | None:
        """From vLLM's keys (a mapping), as vLLM resolves them: the method
        may come from ``model`` ("ngram"); a missing lookup bound takes the
        other's value, and with neither both are 5. ``None`` turns
        speculation off."""
        if config is None or isinstance(config, SpeculativeConfig):
            return config
        if not isinstance(config, Mapping):
            raise TypeError(
                "speculative_config must be a mapping or a SpeculativeConfig, got "
                f"{type(config).__name__}"
            )
        unknown = sorted(str(k) for k in config if k not in _KEYS)
        if unknown:
            raise ValueError(
                f"speculative_config has unsupported keys {unknown}; the engine takes {list(_KEYS)}"
            )
        model, method = config.get("model"), config.get("method")
        if model is not None and model not in _NGRAM_NAMES:
            raise ValueError(
                f"speculative_config model must be 'ngram' (draft models are not supported "
                f"in the engine), got {model!r}"
            )
        if method is None:
            if model is None:
                raise ValueError("speculative_config needs method='ngram'")
            method = "ngram"
        if method in _NGRAM_NAMES:
            method = "ngram"
        if config.get("num_speculative_tokens") is None:
            raise ValueError("speculative_config needs num_speculative_tokens")
        lo, hi = config.get("prompt_lookup_min"), config.get("prompt_lookup_max")
        # The bounds given are checked before one stands in for the other,
        # so an error names the key the caller wrote.
        for name, value in (("prompt_lookup_min", lo), ("prompt_lookup_max", hi)):
            if value is not None:
                _check_count(name, value)
        if lo is None and hi is None:
            lo = hi = DEFAULT_PROMPT_LOOKUP
        elif lo is None:
            lo = hi
        elif hi is None:
            hi = lo
        return cls(
            num_speculative_tokens=config["num_speculative_tokens"],
            prompt_lookup_min=lo,  # type: ignore[arg-type]
            prompt_lookup_max=hi,  # type: ignore[arg-type]
            method=method,
        )


def _check_count(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"speculative_config {name} must be an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"speculative_config {name} must be >= 1, got {value}")
