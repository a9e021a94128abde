"""Shared pieces of the ``ironbatch`` command's parsers.

- ``Parser``: an ``argparse.ArgumentParser`` whose errors read
  ``ironbatch <command>: <message>`` on stderr (exit status 2), without the
  usage block; subparsers made with ``add_subparsers`` inherit it.
- ``integer(minimum, maximum)`` and ``number(minimum, maximum, ...)``:
  ``type=`` converters that refuse, at parse time, what is not a finite
  number in the range (inf, NaN, ``1e999``, overflow, fractions for an
  integer), with the accepted range in the message; argparse adds the
  option's name (``argument --steps: must be an integer in [1, 1000000],
  got '0'``).
- ``add_json_flag(parser, what)``: a ``--json`` flag with its help line;
  ``to_json(obj)``: the text for it, strict JSON (a NaN or an infinity
  becomes ``null``, never a bare ``NaN``).
- ``progress(total, desc)``: a tqdm progress bar on stderr when stderr is a
  terminal and tqdm is installed; otherwise one that draws nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NoReturn, Protocol


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def integer(minimum: int, maximum: int) -> Callable[[str], int]:
    """An int in ``[minimum, maximum]``, written in decimal."""

    def parse(text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            value = None
        if value is None or not minimum <= value <= maximum:
            raise argparse.ArgumentTypeError(
                f"must be an integer in [{minimum}, {maximum}], got {text!r}"
            )
        return value

    parse.__name__ = "integer"
    return parse


def number(
    minimum: float, maximum: float, *, exclude_minimum: bool = False
) -> Callable[[str], float]:
    """A finite float in ``[minimum, maximum]`` (``(minimum, maximum]`` with
    ``exclude_minimum``)."""
    low = "(" if exclude_minimum else "["

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        ok = math.isfinite(value) and value <= maximum
        ok = ok and (value > minimum if exclude_minimum else value >= minimum)
        if not ok:
            raise argparse.ArgumentTypeError(
                f"must be a number in {low}{minimum:g}, {maximum:g}], got {text!r}"
            )
        return value

    parse.__name__ = "number"
    return parse


def add_json_flag(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "--json",
        action="store_true",
        help=f"print {what} as one JSON object on stdout instead of the table",
    )


def _finite(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {str(k): _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def to_json(obj: Any) -> str:
    """Strict JSON: a NaN or an infinity is written as ``null``."""
    return json.dumps(_finite(obj), indent=2, allow_nan=False)


class Progress(Protocol):
    def update(self, n: int = 1) -> Any: ...


class _Silent:
    def update(self, n: int = 1) -> None:
        pass


@contextmanager
def progress(total: int | None, desc: str) -> Iterator[Progress]:
    """A bar on a terminal only: piped or redirected output stays clean."""
    if not sys.stderr.isatty():
        yield _Silent()
        return
    try:
        from tqdm.auto import tqdm
    except ImportError:  # tqdm comes with the engine extra; the bar is optional
        yield _Silent()
        return
    with tqdm(total=total, desc=desc, dynamic_ncols=True, file=sys.stderr) as bar:
        yield bar
