"""A replay's step times by running-request bucket, as one Markdown table:
the median and 90th percentile µs per step of every lane, on the wall clock
and in thread CPU time, and the first lane's median as a multiple of each
other lane's. A step's bucket is the number of requests it scheduled (every
running request, unless the token budget left some out); steps that
scheduled nothing are left out."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ironbatch.bench.lockstep import Replay

BUCKETS = ((1, 16), (17, 64), (65, 128), (129, 192), (193, 256))


def _label(low: int, high: int) -> str:
    return f"{low}–{high}"


def bucket_table(replay: Replay, buckets: Sequence[tuple[int, int]] = BUCKETS) -> str:
    """The table: a row per bucket (and one for all steps) and clock."""
    lanes = replay.lanes
    scheduled = np.asarray(replay.scheduled)
    ref = lanes[0]
    head = ["running", "steps", "clock"]
    for lane in lanes:
        head += [f"{lane.name} p50 (µs)", f"{lane.name} p90 (µs)"]
    head += [f"{ref.name} / {lane.name} (p50)" for lane in lanes[1:]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    groups = [(_label(lo, hi), (scheduled >= lo) & (scheduled <= hi)) for lo, hi in buckets]
    groups.append(("all", scheduled > 0))
    for label, mask in groups:
        count = int(mask.sum())
        for clock in ("wall", "cpu"):
            cells = [label, f"{count:,}", clock]
            if count == 0:
                cells += ["–"] * (len(head) - 3)
                lines.append("| " + " | ".join(cells) + " |")
                continue
            medians = []
            for lane in lanes:
                times = np.asarray(lane.wall_ns if clock == "wall" else lane.cpu_ns)[mask] / 1e3
                p50, p90 = np.percentile(times, [50, 90])
                medians.append(p50)
                cells += [f"{p50:,.1f}", f"{p90:,.1f}"]
            cells += [f"{medians[0] / m:,.2f}×" for m in medians[1:]]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
