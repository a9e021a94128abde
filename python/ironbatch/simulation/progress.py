"""Progress on a terminal for runs long enough to wonder about: a tqdm bar
on stderr (tqdm imported only when a bar is wanted; without tqdm, one line
saying what runs), shown only after a second, so quick runs print nothing.
Callers pass ``enabled`` (the CLI: stderr is a terminal); a library call
shows nothing unless asked.

The simulation loop runs in Rust with no progress callback, so a single
run's bar counts elapsed seconds; a sweep's counts its finished points."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

DELAY_S = 1.0
TICK_S = 0.5


def _bar(**kwargs: Any) -> Any:
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(file=sys.stderr, delay=DELAY_S, leave=False, dynamic_ncols=True, **kwargs)


@contextmanager
def elapsed(desc: str, enabled: bool) -> Iterator[None]:
    """While the block runs: ``desc`` and the seconds so far."""
    if not enabled:
        yield
        return
    bar = _bar(desc=desc, bar_format="{desc}: {elapsed}")
    if bar is None:
        print(f"{desc} ...", file=sys.stderr)
        yield
        return
    done = threading.Event()

    def tick() -> None:
        while not done.wait(TICK_S):
            bar.refresh()

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    try:
        yield
    finally:
        done.set()
        ticker.join()
        bar.close()


@contextmanager
def counting(desc: str, total: int, enabled: bool) -> Iterator[Callable[[], None]]:
    """A bar of ``total`` steps; the block calls what it is given once per
    step done."""
    bar = _bar(desc=desc, total=total, unit="point") if enabled else None
    if bar is None:
        yield lambda: None
        return
    try:
        yield lambda: bar.update(1)
    finally:
        bar.close()
