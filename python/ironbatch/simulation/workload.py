"""A simulated workload: one row per request, in arrival order, as NumPy
columns the Rust loop reads without a Python object per request.

A prompt is a list of *segments*, each a key and a length, then literal
tokens. A segment's tokens are a fixed function of its key and position
(``rust/src/simulate/workload.rs``), so requests whose prompts start with
the same keys share those tokens, and the prefix cache finds the reuse the
source describes: Mooncake's ``hash_ids`` become one segment per id, the
synthetic generator's shared-prefix groups one segment per group, and every
request's own tokens a segment keyed by its index. Literal tokens carry an
ironbatch trace's own prompts."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ironbatch import _core
from ironbatch.reference.limits import MAX_MODEL_LEN

# Key spaces that cannot meet: a request's own tokens, the synthetic
# generator's shared-prefix groups, and everything below (Mooncake's hash
# ids, which must stay under PREFIX_GROUP_KEYS).
OWN_KEYS = 1 << 62
PREFIX_GROUP_KEYS = 1 << 61
DEFAULT_VOCAB_SIZE = 32_000


@dataclass(frozen=True)
class Workload:
    """Requests as columns. ``segment_*`` and ``literal_*`` describe the
    prompts (request ``i``'s segments are
    ``segment_keys[segment_offsets[i]:segment_offsets[i + 1]]``, its literal
    tokens likewise); ``ids`` are the source's request ids (the row number
    where it has none)."""

    name: str
    arrival_s: np.ndarray  # float64, non-decreasing, from 0
    output_tokens: np.ndarray  # int64, >= 1
    segment_offsets: np.ndarray  # int64, rows + 1
    segment_keys: np.ndarray  # uint64
    segment_lengths: np.ndarray  # int64
    literal_offsets: np.ndarray  # int64, rows + 1
    literal_tokens: np.ndarray  # int64
    ids: tuple[str, ...] = ()
    vocab_size: int = DEFAULT_VOCAB_SIZE
    #: Rows the reader skipped, and why (a failed request in the source).
    skipped: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Whole numbers in range, as the core reads them: a fractional token
        # count is refused, not truncated. The core checks the structure.
        for name, kind, most in _COLUMNS:
            object.__setattr__(self, name, _column(name, getattr(self, name), kind, most))
        if not self.ids:
            object.__setattr__(self, "ids", tuple(str(i) for i in range(len(self.arrival_s))))
        if len(self.ids) != len(self.arrival_s):
            raise ValueError(f"ids has {len(self.ids)} entries for {len(self.arrival_s)} requests")

    def __len__(self) -> int:
        return len(self.arrival_s)

    @property
    def prompt_tokens(self) -> np.ndarray:
        """Each request's prompt length."""
        summed = _offsets(self.segment_lengths)
        generated = summed[self.segment_offsets[1:]] - summed[self.segment_offsets[:-1]]
        return generated + np.diff(self.literal_offsets)

    def to_core(self) -> _core.SimWorkload:
        """The columns as the Rust loop takes them (checked there)."""
        return _core.SimWorkload(
            arrival_s=np.ascontiguousarray(self.arrival_s, dtype=np.float64),
            output_tokens=np.ascontiguousarray(self.output_tokens, dtype=np.int64),
            segment_offsets=np.ascontiguousarray(self.segment_offsets, dtype=np.int64),
            segment_keys=np.ascontiguousarray(self.segment_keys, dtype=np.uint64),
            segment_lengths=np.ascontiguousarray(self.segment_lengths, dtype=np.int64),
            literal_offsets=np.ascontiguousarray(self.literal_offsets, dtype=np.int64),
            literal_tokens=np.ascontiguousarray(self.literal_tokens, dtype=np.int64),
            vocab_size=self.vocab_size,
        )

    def select(self, rows: np.ndarray, *, name: str | None = None) -> Workload:
        """The requests at ``rows`` (increasing), in that order."""
        rows = np.asarray(rows, dtype=np.int64)
        seg_lo, seg_hi = self.segment_offsets[rows], self.segment_offsets[rows + 1]
        lit_lo, lit_hi = self.literal_offsets[rows], self.literal_offsets[rows + 1]
        seg_index = _ranges(seg_lo, seg_hi)
        lit_index = _ranges(lit_lo, lit_hi)
        return Workload(
            name=name or self.name,
            arrival_s=self.arrival_s[rows],
            output_tokens=self.output_tokens[rows],
            segment_offsets=_offsets(seg_hi - seg_lo),
            segment_keys=self.segment_keys[seg_index],
            segment_lengths=self.segment_lengths[seg_index],
            literal_offsets=_offsets(lit_hi - lit_lo),
            literal_tokens=self.literal_tokens[lit_index],
            ids=tuple(self.ids[i] for i in rows.tolist()),
            vocab_size=self.vocab_size,
            skipped=dict(self.skipped),
        )

    def sliced(
        self,
        *,
        start_s: float | None = None,
        end_s: float | None = None,
        max_requests: int | None = None,
    ) -> Workload:
        """The requests arriving in ``[start_s, end_s)`` (trace seconds),
        at most the first ``max_requests`` of them, their arrivals shifted so
        the slice starts at 0."""
        lo = 0.0 if start_s is None else _seconds("start_s", start_s)
        hi = np.inf if end_s is None else _seconds("end_s", end_s)
        if hi <= lo:
            raise ValueError(f"the slice's end ({end_s}) must be after its start ({start_s})")
        rows = np.flatnonzero((self.arrival_s >= lo) & (self.arrival_s < hi))
        if max_requests is not None:
            if isinstance(max_requests, bool) or not isinstance(max_requests, int):
                raise TypeError(f"max_requests must be an int, got {max_requests!r}")
            if max_requests < 1:
                raise ValueError(f"max_requests must be >= 1, got {max_requests}")
            rows = rows[:max_requests]
        out = self.select(rows)
        shift = lo if start_s is not None else 0.0
        return _with_arrivals(out, out.arrival_s - shift)

    def at_speed(self, speed: float) -> Workload:
        """Arrivals ``speed`` times as fast (2: twice the rate)."""
        if isinstance(speed, bool) or not isinstance(speed, (int, float)):
            raise TypeError(f"speed must be a number, got {speed!r}")
        if not (np.isfinite(speed) and speed > 0):
            raise ValueError(f"speed must be a finite number > 0, got {speed}")
        if speed == 1:
            return self
        return _with_arrivals(self, self.arrival_s / float(speed))

    def prompt_token_ids(self, index: int) -> list[int]:
        """Request ``index``'s prompt, as the simulation adds it."""
        return self.to_core().prompt_token_ids(index)


# Each column: its dtype kind and the largest value it may hold.
_COLUMNS = (
    ("arrival_s", "f", None),
    ("output_tokens", "i", MAX_MODEL_LEN),
    ("segment_offsets", "i", None),
    ("segment_keys", "u", None),
    ("segment_lengths", "i", MAX_MODEL_LEN),
    ("literal_offsets", "i", None),
    ("literal_tokens", "i", None),
)
_DTYPES = {"f": np.float64, "i": np.int64, "u": np.uint64}


def _column(name: str, values: object, kind: str, most: int | None) -> np.ndarray:
    a = np.asarray(values)
    if a.ndim != 1:
        raise ValueError(f"Workload {name} must be one-dimensional, got shape {a.shape}")
    if a.dtype.kind not in "iuf":
        raise TypeError(f"Workload {name} must hold numbers that fit 64 bits, got dtype {a.dtype}")
    if kind == "f":
        return a.astype(np.float64)
    if a.dtype.kind == "f":
        bad = ~np.isfinite(a) | (a != np.round(a)) | (np.abs(a) >= 2.0**63)
        if bad.any():
            i = int(np.argmax(bad))
            raise ValueError(f"Workload {name}[{i}] = {a[i].item()!r} is not a whole number")
    if len(a) and (a < 0).any():
        i = int(np.argmax(a < 0))
        raise ValueError(f"Workload {name}[{i}] = {a[i].item()!r} must be >= 0")
    if most is not None and len(a) and (a > most).any():
        i = int(np.argmax(a > most))
        raise ValueError(
            f"Workload {name}[{i}] = {a[i].item()!r} is more than a request holds ({most:,})"
        )
    return a.astype(_DTYPES[kind])


def _with_arrivals(w: Workload, arrival_s: np.ndarray) -> Workload:
    return Workload(
        name=w.name,
        arrival_s=arrival_s,
        output_tokens=w.output_tokens,
        segment_offsets=w.segment_offsets,
        segment_keys=w.segment_keys,
        segment_lengths=w.segment_lengths,
        literal_offsets=w.literal_offsets,
        literal_tokens=w.literal_tokens,
        ids=w.ids,
        vocab_size=w.vocab_size,
        skipped=dict(w.skipped),
    )


def _seconds(field_name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value):
        raise ValueError(f"{field_name} must be a finite number of seconds, got {value!r}")
    if value < 0:
        raise ValueError(f"{field_name} must be >= 0, got {value}")
    return float(value)


def _offsets(counts: np.ndarray) -> np.ndarray:
    out = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=out[1:])
    return out


def _ranges(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """The indices ``lo[i]..hi[i]`` for every ``i``, concatenated."""
    counts = hi - lo
    if counts.sum() == 0:
        return np.zeros(0, dtype=np.int64)
    starts = np.repeat(lo - _offsets(counts)[:-1], counts)
    return starts + np.arange(counts.sum(), dtype=np.int64)


def from_segments(
    name: str,
    *,
    arrival_s: Sequence[float] | np.ndarray,
    output_tokens: Sequence[int] | np.ndarray,
    segments: Sequence[Sequence[tuple[int, int]]],
    ids: Sequence[str] = (),
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    skipped: dict[str, int] | None = None,
) -> Workload:
    """A workload whose request ``i``'s prompt is ``segments[i]``, a list of
    ``(key, length)`` pairs."""
    counts = np.fromiter((len(s) for s in segments), dtype=np.int64, count=len(segments))
    flat = [pair for s in segments for pair in s]
    keys = np.array([k for k, _ in flat], dtype=np.uint64)
    lengths = _column("segment_lengths", [n for _, n in flat], "i", MAX_MODEL_LEN)
    return Workload(
        name=name,
        arrival_s=np.asarray(arrival_s),
        output_tokens=np.asarray(output_tokens),
        segment_offsets=_offsets(counts),
        segment_keys=keys,
        segment_lengths=lengths,
        literal_offsets=np.zeros(len(segments) + 1, dtype=np.int64),
        literal_tokens=np.zeros(0, dtype=np.int64),
        ids=tuple(ids),
        vocab_size=vocab_size,
        skipped=dict(skipped or {}),
    )


def from_lengths(
    name: str,
    *,
    arrival_s: Sequence[float] | np.ndarray,
    prompt_tokens: Sequence[int] | np.ndarray,
    output_tokens: Sequence[int] | np.ndarray,
    ids: Sequence[str] = (),
    skipped: dict[str, int] | None = None,
) -> Workload:
    """A workload of prompts that share nothing: one segment of its own per
    request (traces that record lengths only: Azure, BurstGPT)."""
    prompts = _column("prompt_tokens", prompt_tokens, "i", MAX_MODEL_LEN)
    n = len(prompts)
    return Workload(
        name=name,
        arrival_s=np.asarray(arrival_s),
        output_tokens=np.asarray(output_tokens),
        segment_offsets=np.arange(n + 1, dtype=np.int64),
        segment_keys=(OWN_KEYS + np.arange(n, dtype=np.uint64)).astype(np.uint64),
        segment_lengths=prompts,
        literal_offsets=np.zeros(n + 1, dtype=np.int64),
        literal_tokens=np.zeros(0, dtype=np.int64),
        ids=tuple(ids),
        skipped=dict(skipped or {}),
    )
