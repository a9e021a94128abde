"""A trace file's lines as text, for every workload reader: gunzipped when
its bytes start with gzip's magic (whatever the name says), decoded as
UTF-8 one line at a time, so that a binary file, a truncated gzip stream or
a stray byte is a ValueError naming the file and the line rather than a
codec's traceback."""

from __future__ import annotations

import gzip
import json
import os
import zlib
from collections.abc import Iterator
from typing import IO, Any

GZIP_MAGIC = b"\x1f\x8b"


class TextLines:
    """Iterate to get the file's lines (``str``, newline kept, as a text
    file gives them; ``csv.reader`` and ``json.loads`` take them as they
    are). ``name`` is the path as the user wrote it; ``line`` the number of
    the last line given."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.name = os.fspath(path)
        self.line = 0

    def where(self) -> str:
        return f"{self.name}: line {self.line}"

    def __iter__(self) -> Iterator[str]:
        self.line = 0
        try:
            with open(self.name, "rb") as raw:
                compressed = raw.read(2) == GZIP_MAGIC
                raw.seek(0)
                source: IO[bytes] = gzip.GzipFile(fileobj=raw) if compressed else raw
                for data in _lines(source, self):
                    self.line += 1
                    yield self._decode(data)
        except OSError as e:
            # A gzip stream's corruption (BadGzipFile is an OSError), or the
            # file unreadable.
            raise ValueError(f"{self.where()}: cannot read the file ({_reason(e)})") from None

    def _decode(self, data: bytes) -> str:
        if b"\0" in data:
            raise ValueError(
                f"{self.where()}: a NUL byte; this is a binary file, not a text trace "
                "(CSV or JSON lines, optionally gzipped)"
            )
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(
                f"{self.where()}: byte {data[e.start]:#04x} at column {e.start + 1} is not "
                "UTF-8 text; a trace is a UTF-8 CSV or JSON-lines file, optionally gzipped"
            ) from None


def _lines(source: IO[bytes], at: TextLines) -> Iterator[bytes]:
    try:
        yield from source
    except (EOFError, zlib.error) as e:
        raise ValueError(
            f"{at.name}: after line {at.line}: the gzip stream is truncated or corrupt ({e})"
        ) from None


def _reason(e: OSError) -> str:
    return e.strerror or str(e)


def first_line(path: str | os.PathLike[str]) -> str:
    """The first line that is not blank ("" when there is none)."""
    for line in TextLines(path):
        if line.strip():
            return line
    return ""


def json_object(line: str, where: str) -> dict[str, Any]:
    """One JSON-lines record, which must be an object; ``where`` (file and
    line) leads any error."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}, column {e.colno}: not JSON ({e.msg})") from None
    if isinstance(obj, dict):
        return obj
    raise ValueError(f"{where}: expected a JSON object, got {type(obj).__name__}")
