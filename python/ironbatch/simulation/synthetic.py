"""Synthetic workloads: Poisson or bursty arrivals, prompt and output
lengths from a distribution, and groups of requests that share a prompt
prefix (a system prompt, a few-shot preamble), deterministic by seed.

Spelled as ``synthetic:key=value,...`` on the command line, e.g.
``synthetic:requests=2000,rate=8,arrivals=bursty,prefix_groups=4``:

- ``requests`` (1000), ``rate`` (requests per second, 5), ``seed`` (0);
- ``arrivals``: ``poisson`` (exponential gaps) or ``bursty`` (gamma gaps
  with coefficient of variation ``burstiness``, 3 by default: the same
  mean rate, arrivals in clumps);
- ``prompt`` / ``output``: ``azure-conv`` (the Azure 2023 conversation
  trace's lengths), ``lognormal`` (mean ``prompt_mean``/``output_mean``,
  log-space deviation ``prompt_sigma``/``output_sigma``), ``uniform`` (1 to
  twice the mean) or ``fixed`` (the mean);
- ``prefix_groups`` (0), ``prefix_tokens`` (512), ``prefix_share`` (0.75):
  that share of requests opens with one of the groups' prefixes (chosen
  uniformly), cut to leave each prompt one token of its own."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, fields

import numpy as np

from ironbatch.bench.azure_trace import (
    CONV_CONTEXT_QUANTILES,
    CONV_GENERATED_QUANTILES,
    sample_length,
)
from ironbatch.reference.limits import MAX_MODEL_LEN
from ironbatch.simulation.prefix_groups import choose_prefixes
from ironbatch.simulation.settings import span_text
from ironbatch.simulation.workload import OWN_KEYS, Workload, from_segments

ARRIVALS = ("poisson", "bursty")
LENGTHS = ("azure-conv", "lognormal", "uniform", "fixed")
PREFIX = "synthetic:"


@dataclass(frozen=True)
class SyntheticSpec:
    requests: int = 1000
    rate: float = 5.0
    seed: int = 0
    arrivals: str = "poisson"
    burstiness: float = 3.0
    prompt: str = "lognormal"
    prompt_mean: float = 1000.0
    prompt_sigma: float = 0.8
    output: str = "lognormal"
    output_mean: float = 200.0
    output_sigma: float = 0.8
    prefix_groups: int = 0
    prefix_tokens: int = 512
    prefix_share: float = 0.75

    def __post_init__(self) -> None:
        def bad(name: str, why: str) -> ValueError:
            return ValueError(f"synthetic: {name} {why}, got {getattr(self, name)!r}")

        for f in fields(self):
            v = getattr(self, f.name)
            if f.type == "int" and (isinstance(v, bool) or not isinstance(v, int)):
                raise TypeError(f"synthetic: {f.name} must be an int, got {v!r}")
            if f.type == "float" and (isinstance(v, bool) or not isinstance(v, (int, float))):
                raise TypeError(f"synthetic: {f.name} must be a number, got {v!r}")
            if f.type == "str" and not isinstance(v, str):
                raise TypeError(f"synthetic: {f.name} must be a string, got {v!r}")
        for f in fields(self):
            if f.name not in RANGES:
                continue
            v, (lo, hi) = getattr(self, f.name), RANGES[f.name]
            positive = f.name in POSITIVE
            if not (math.isfinite(v) and (v > lo if positive else v >= lo) and v <= hi):
                kind = "an integer" if f.type == "int" else "a finite number"
                raise bad(f.name, f"must be {kind} in {span_text(lo, hi, open_lo=positive)}")
        if self.arrivals not in ARRIVALS:
            raise bad("arrivals", f"must be one of {ARRIVALS}")
        for name in ("prompt", "output"):
            if getattr(self, name) not in LENGTHS:
                raise bad(name, f"must be one of {LENGTHS}")


# Each number's accepted range. The bounds keep every draw finite and every
# length inside a request's (max_model_len's limit; draws are checked too).
RANGES: dict[str, tuple[float, float]] = {
    "requests": (1, 10_000_000),
    "rate": (1e-6, 1e9),
    "burstiness": (0.01, 100),
    "prompt_mean": (0, 2**30),
    "prompt_sigma": (0, 5),
    "output_mean": (0, 2**30),
    "output_sigma": (0, 5),
    "prefix_groups": (0, 1_000_000),
    "prefix_tokens": (1, MAX_MODEL_LEN),
    "prefix_share": (0, 1),
}
POSITIVE = ("prompt_mean", "output_mean")


def parse_synthetic(text: str) -> SyntheticSpec:
    """``synthetic:key=value,...`` (every key optional) as a spec; an unknown
    key or a value of the wrong type raises a ValueError naming it."""
    body = text[len(PREFIX) :] if text.startswith(PREFIX) else text
    types = {f.name: f.type for f in fields(SyntheticSpec)}
    values: dict[str, object] = {}
    for item in filter(None, (p.strip() for p in body.split(","))):
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep:
            raise ValueError(f"synthetic: expected key=value, got {item!r}")
        if key not in types:
            raise ValueError(f"synthetic: unknown key {key!r}; the keys are {sorted(types)}")
        kind = types[key]
        try:
            values[key] = int(raw) if kind == "int" else float(raw) if kind == "float" else raw
        except (ValueError, OverflowError):
            raise ValueError(
                f"synthetic: {key} must be a{'n int' if kind == 'int' else ' number'}, got {raw!r}"
            ) from None
    return SyntheticSpec(**values)  # type: ignore[arg-type]


def _length(rng: random.Random, kind: str, mean: float, sigma: float, azure: tuple) -> int:
    if kind == "azure-conv":
        return sample_length(rng, azure)
    if kind == "fixed":
        return max(1, round(mean))
    if kind == "uniform":
        return rng.randint(1, max(1, round(2 * mean) - 1))
    mu = math.log(mean) - sigma * sigma / 2  # the lognormal with this mean
    return max(1, round(rng.lognormvariate(mu, sigma)))


def synthetic_workload(spec: SyntheticSpec | str) -> Workload:
    """The workload ``spec`` describes; the same spec gives the same one."""
    if isinstance(spec, str):
        spec = parse_synthetic(spec)
    rng = random.Random(spec.seed)
    arrivals = np.empty(spec.requests, dtype=np.float64)
    t = 0.0
    shape = 1 / (spec.burstiness * spec.burstiness)  # gamma: cv = 1/sqrt(shape)
    for i in range(spec.requests):
        if i:
            if spec.arrivals == "poisson":
                t += rng.expovariate(spec.rate)
            else:
                t += rng.gammavariate(shape, 1 / (shape * spec.rate))
        arrivals[i] = t
    prompts, outputs = [], []
    for _ in range(spec.requests):
        prompts.append(
            _length(rng, spec.prompt, spec.prompt_mean, spec.prompt_sigma, CONV_CONTEXT_QUANTILES)
        )
        outputs.append(
            _length(rng, spec.output, spec.output_mean, spec.output_sigma, CONV_GENERATED_QUANTILES)
        )
    for what, lengths in (("prompt", prompts), ("output", outputs)):
        longest = max(lengths)
        if longest > MAX_MODEL_LEN:
            raise ValueError(
                f"synthetic: {what}_mean={getattr(spec, what + '_mean'):g} with "
                f"{what}_sigma={getattr(spec, what + '_sigma'):g} drew a {what} of {longest:,} "
                f"tokens, more than a request can have ({MAX_MODEL_LEN:,}); lower them"
            )
    chosen = choose_prefixes(
        rng, prompts, groups=spec.prefix_groups, tokens=spec.prefix_tokens,
        share=spec.prefix_share,
    )  # fmt: skip
    segments = []
    for i, (prompt, prefix) in enumerate(zip(prompts, chosen, strict=True)):
        own = prompt - (prefix[1] if prefix else 0)
        segments.append([*([prefix] if prefix else []), (OWN_KEYS + i, own)])
    return from_segments(
        f"synthetic({spec.requests} requests, {spec.rate:g}/s {spec.arrivals})",
        arrival_s=arrivals,
        output_tokens=outputs,
        segments=segments,
    )
