"""A replay's step times by running-request bucket, as one Markdown table:
the median and 90th percentile µs per step of every lane, on the wall clock
and in thread CPU time, and the first lane's median as a multiple of each
other lane's. A step's bucket is the number of requests it scheduled (every
running request, unless the token budget left some out); steps that
scheduled nothing are left out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

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


def ratio_table(replays: Mapping[str, Replay], buckets: Sequence[tuple[int, int]] = BUCKETS) -> str:
    """One table for several replays of the same lanes (sync and async, by
    name): per bucket, each replay's steps, each lane's median wall-clock µs
    and the first lane's median as a multiple of each other lane's."""
    names = list(replays)
    lanes = [lane.name for lane in replays[names[0]].lanes]
    head = ["running"]
    for mode in names:
        head += [f"{mode}: steps", *(f"{lane} (µs)" for lane in lanes)]
        head += [f"**{lanes[0]} / {lane}**" for lane in lanes[1:]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for low, high in buckets:
        cells = [_label(low, high)]
        for mode in names:
            r = replays[mode]
            scheduled = np.asarray(r.scheduled)
            mask = (scheduled >= low) & (scheduled <= high)
            count = int(mask.sum())
            cells.append(f"{count:,}")
            if count == 0:
                cells += ["–"] * (2 * len(lanes) - 1)
                continue
            medians = [float(np.median(np.asarray(lane.wall_ns)[mask])) / 1e3 for lane in r.lanes]
            cells += [f"{m:,.1f}" for m in medians]
            cells += [f"**{medians[0] / m:,.1f}×**" for m in medians[1:]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
