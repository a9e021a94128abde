"""Argument checks with errors that name the field and the value (the same
exception types the Rust bindings raise)."""

from __future__ import annotations

import operator
from collections.abc import Mapping, Set

U32_MAX = 2**32 - 1
I64_MAX = 2**63 - 1


def count(field: str, value: object) -> int:
    """A non-negative int (anything with ``__index__``)."""
    try:
        v = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"{field} must be an int, got {type(value).__name__}") from None
    if v < 0:
        raise ValueError(f"{field} must be >= 0, got {v}")
    if v > I64_MAX:
        raise ValueError(f"{field} = {v} is out of range")
    return v


def u32_list(field: str, values: object) -> list[int]:
    """A sequence of ints in ``[0, 2**32 - 1]`` (token or block ids)."""
    if (
        isinstance(values, (str, bytes, Mapping, Set))
        or not hasattr(values, "__getitem__")
        or not hasattr(values, "__len__")
    ):
        raise TypeError(f"{field} must be a sequence of ints, got {type(values).__name__}")
    out = []
    for i, item in enumerate(values):  # type: ignore[arg-type]
        try:
            v = operator.index(item)
        except TypeError:
            raise TypeError(f"{field}[{i}] must be an int, got {type(item).__name__}") from None
        if not 0 <= v <= U32_MAX:
            raise ValueError(f"{field}[{i}] = {v!r} is outside [0, {U32_MAX}]")
        out.append(v)
    return out
