"""Where a run's files go, checked before the run: an output folder that is
a file, or a place that cannot be written, is a ValueError naming it before
anything is simulated or printed, not an OSError after the summary."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def _existing_parent(path: Path) -> Path:
    for parent in (path, *path.parents):
        if parent.exists():
            return parent
    return Path(".")


def _writable(folder: Path) -> bool:
    """Whether a file can be made in ``folder``: tried (an unnamed temporary
    file, gone when closed), since permission bits do not tell for root or
    for a read-only or virtual file system."""
    try:
        with tempfile.TemporaryFile(dir=folder):
            return True
    except OSError:
        return False


def check_out_dir(path: str | os.PathLike[str], *, what: str = "out") -> Path:
    """``path`` as a folder that exists or can be made, and written to."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{what} must be a folder's path, got {type(path).__name__}")
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise ValueError(
            f"{what} {os.fspath(path)!r} is a file; it must be a folder (or not exist)"
        )
    base = _existing_parent(out.absolute())
    if not base.is_dir():
        raise ValueError(f"{what} {os.fspath(path)!r}: {os.fspath(base)!r} is a file, not a folder")
    if not _writable(base):
        raise ValueError(f"{what} {os.fspath(path)!r}: {os.fspath(base)!r} cannot be written")
    return out


def check_out_file(path: str | os.PathLike[str], *, what: str) -> Path:
    """``path`` as a file that can be created (or overwritten) in a folder
    that exists."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{what} must be a file's path, got {type(path).__name__}")
    out = Path(path)
    if out.is_dir():
        raise ValueError(f"{what} {os.fspath(path)!r} is a folder; it must be a file's path")
    parent = out.absolute().parent
    if not parent.is_dir():
        raise ValueError(f"{what} {os.fspath(path)!r}: the folder {os.fspath(parent)!r} does not "
                         "exist")  # fmt: skip
    if not _writable(parent) or (out.exists() and not os.access(out, os.W_OK)):
        raise ValueError(f"{what} {os.fspath(path)!r} cannot be written")
    return out


@contextmanager
def writing(where: Path) -> Iterator[None]:
    """An OSError while writing (a full disk, a file in the way) as a
    ValueError naming the place."""
    try:
        yield
    except OSError as e:
        name = e.filename if e.filename is not None else where
        raise ValueError(f"cannot write {os.fspath(name)!r}: {e.strerror or e}") from None
