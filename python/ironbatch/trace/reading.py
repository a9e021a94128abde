"""Reading an ironbatch-trace/1 file for replay: its header and its step
records, one line at a time (memory does not grow with the steps), from a
``.jsonl`` file, a gzipped one (whatever its name) or ``-`` for standard
input. Whatever is wrong with the file is a ``TraceError`` naming the file
and the line: not text, not JSON, not a trace, a truncated gzip stream, a
missing key, a value the scheduler refuses."""

from __future__ import annotations

import gzip
import io
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, cast

from ironbatch.simulation.text_lines import GZIP_MAGIC, TextLines, _lines, _reason, json_object

FORMAT = "ironbatch-trace/1"
DOC = "docs/trace-format.md"


class TraceError(ValueError):
    """A trace that cannot be replayed; the message leads with the file
    (and the line, where there is one)."""


class TraceLines(TextLines):
    """``TextLines`` (bytes decoded a line at a time, so a bad byte names its
    line), and ``-`` for standard input."""

    def __iter__(self) -> Iterator[str]:
        if self.name != "-":
            yield from super().__iter__()
            return
        self.line = 0
        raw = sys.stdin.buffer
        # peek() needs a buffered reader: a pipe cannot seek back.
        buffered = raw if isinstance(raw, io.BufferedReader) else io.BufferedReader(cast(Any, raw))
        compressed = buffered.peek(2)[:2] == GZIP_MAGIC
        source = cast(IO[bytes], gzip.GzipFile(fileobj=buffered) if compressed else buffered)
        try:
            for data in _lines(source, self):
                self.line += 1
                yield self._decode(data)
        except OSError as e:
            raise ValueError(f"{self.where()}: cannot read the input ({_reason(e)})") from None


class Trace:
    """A trace opened: its header, read now, and ``steps``, its
    ``(line number, step record)`` pairs, read lazily (a bad line raises
    ``TraceError`` when it is reached). ``close()`` closes the file."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        if self.path != "-":
            try:  # here, not in the lines' reader, whose message counts lines
                open(path, "rb").close()
            except OSError as e:
                raise TraceError(f"{path}: cannot open ({e.strerror or e})") from None
        self._lines = TraceLines(path)
        self._it = iter(self._lines)
        try:
            self.header = self._read_header()
        except BaseException:
            self.close()
            raise
        self.header_line = self._lines.line
        self.steps = self._records()

    def close(self) -> None:
        close = getattr(self._it, "close", None)
        if close is not None:  # a replay that stops early closes the file now
            close()

    def _read_header(self) -> dict[str, Any]:
        try:
            first = next((line for line in self._it if line.strip()), None)
        except ValueError as e:  # unreadable, not text, a broken gzip stream
            raise TraceError(str(e)) from None
        where = self._lines.where()
        if first is None:
            raise TraceError(f"{self.path}: empty file, not an {FORMAT} trace ({DOC})")
        try:
            header = json_object(first, where)
        except ValueError as e:
            raise TraceError(
                f"{e}; an {FORMAT} trace is JSON lines, a header first ({DOC})"
            ) from None
        if header.get("format") != FORMAT:
            raise TraceError(
                f"{where}: not an {FORMAT} trace (the header's format is "
                f"{header.get('format')!r}; {DOC})"
            )
        if not isinstance(header.get("config"), dict):
            raise TraceError(f"{where}: the header needs a 'config' object ({DOC})")
        return header

    def _records(self) -> Iterator[tuple[int, dict[str, Any]]]:
        try:
            for line in self._it:
                if line.strip():
                    yield self._lines.line, json_object(line, self._lines.where())
        except ValueError as e:
            raise TraceError(str(e)) from None


def field_error(path: str, line: int, e: Exception, within: str = "the step") -> TraceError:
    """A missing key or bad value in ``within`` (the step record, the
    header's config) as the file and line's error."""
    if isinstance(e, KeyError):
        return TraceError(f"{path}: line {line}: {within} lacks {e.args[0]!r} ({DOC})")
    return TraceError(f"{path}: line {line}: {within}: {e}")
