"""Token-id lists: ints in [0, 2**32 - 1], checked with errors that name
the field and the offending item."""

from __future__ import annotations

import operator

import numpy as np

U32_MAX = 2**32 - 1


def token_list(field: str, values: object) -> list[int]:
    """A list of token ids from a list, tuple or integer NumPy array."""
    if isinstance(values, np.ndarray):
        if values.ndim != 1 or values.dtype.kind not in "iu":
            raise TypeError(
                f"{field} must be a 1-D integer array, got {values.dtype}[{values.ndim}-D]"
            )
        if values.size and (values.min() < 0 or values.max() > U32_MAX):
            bad = int(np.flatnonzero((values < 0) | (values > U32_MAX))[0])
            raise ValueError(f"{field}[{bad}] = {values[bad]} is outside [0, {U32_MAX}]")
        return values.tolist()
    if isinstance(values, (str, bytes)) or not isinstance(values, (list, tuple, range)):
        raise TypeError(f"{field} must be a list of ints, got {type(values).__name__}")
    out = []
    for i, v in enumerate(values):
        try:
            t = operator.index(v)
        except TypeError:
            raise TypeError(f"{field}[{i}] must be an int, got {type(v).__name__}") from None
        if not 0 <= t <= U32_MAX:
            raise ValueError(f"{field}[{i}] = {t} is outside [0, {U32_MAX}]")
        out.append(t)
    return out
