"""Summarize a py-spy profile (``py-spy record -f raw``: collapsed stacks,
one ``frame;frame;... count`` line per stack) under one root frame: the
share of samples each function holds, inclusive and on its own (self),
as Markdown tables. Frames are named ``function (file)``; line numbers are
dropped so a function's lines count as one.

    py-spy record --nonblocking -r 2000 -f raw -o prof.txt -- \\
        python benches/azure_replay.py --lanes drop-in ...
    python benches/flame_summary.py prof.txt --root "Lane.step" --top 15

A native frame (Rust, with ``py-spy --native``) counts like any other; without
``--native`` a call into the extension is the calling Python frame's self
time."""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from dataclasses import dataclass

_LINE = re.compile(r" \((?:.*/)?([^/():]+)(?::\d+)?\)$")


@dataclass(frozen=True)
class Summary:
    root: str
    samples: int
    inclusive: Counter[str]
    own: Counter[str]


def frame_name(frame: str) -> str:
    """``f (pkg/mod.py:12)`` -> ``f (mod.py)``."""
    return _LINE.sub(r" (\1)", frame)


def summarize(lines: list[str], root: str) -> Summary:
    """Samples under the first frame containing ``root``, by function."""
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    total = 0
    for line in lines:
        stack, _, count = line.rstrip().rpartition(" ")
        if not count.isdigit():
            continue  # py-spy's idle or truncated lines
        frames = stack.split(";")
        start = next((i for i, f in enumerate(frames) if root in f), None)
        if start is None:
            continue
        names = [frame_name(f) for f in frames[start:]]
        n = int(count)
        total += n
        for name in set(names):
            inclusive[name] += n
        own[names[-1]] += n
    return Summary(root, total, inclusive, own)


def table(summary: Summary, top: int) -> str:
    rows = [
        f"Samples under `{summary.root}`: {summary.samples:,}",
        "",
        "| function | inclusive | self |",
        "|---|---|---|",
    ]
    if not summary.samples:
        return "\n".join(rows)
    for name, n in summary.inclusive.most_common(top):
        share = 100 * n / summary.samples
        own = 100 * summary.own.get(name, 0) / summary.samples
        rows.append(f"| `{name}` | {share:.1f}% | {own:.1f}% |")
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profile", help="py-spy record -f raw output")
    ap.add_argument("--root", action="append", required=True, help="a frame to summarize under")
    ap.add_argument("--top", type=int, default=15, help="functions shown (by inclusive share)")
    a = ap.parse_args()
    with open(a.profile) as f:
        lines = f.readlines()
    for i, root in enumerate(a.root):
        if i:
            print()
        print(table(summarize(lines, root), a.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
