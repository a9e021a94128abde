"""A sweep's table on the terminal: the swept settings as ``--config`` takes
them, then a few headline metrics (the CSV and the report have every
column), each column as wide as its widest value, so that a two-setting
sweep fits about 100 characters. An infeasible point's row says so, its
reason in a numbered note below the table."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

# (header, row key, format): latencies in ms, throughput per second.
HEADLINE = (
    ("TTFT p50", "ttft_p50_ms", "ms"),
    ("TTFT p99", "ttft_p99_ms", "ms"),
    ("TPOT p50", "tpot_p50_ms", "ms"),
    ("E2E p99", "e2e_p99_ms", "ms"),
    ("req/s", "requests_per_s", "rate"),
    ("tok/s", "output_tokens_per_s", "count"),
    ("preempt", "preemptions", "count"),
)
GOODPUT = (("good %", "goodput_fraction", "percent"),)
WIDTH = 100


def setting_text(v: Any) -> str:
    """A setting's value as ``--config`` takes it (``true``, ``16``,
    ``0.5``): the one way the swept values are printed."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and v.is_integer() and abs(v) < 1e15:
        return str(int(v))
    return repr(v) if isinstance(v, float) else str(v)


def _metric(v: Any, kind: str) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if kind == "ms":
        return f"{v:,.1f}" if abs(v) < 1000 else f"{v:,.0f}"
    if kind == "rate":
        return f"{v:,.2f}"
    if kind == "percent":
        return f"{v * 100:.1f}"
    return f"{v:,.0f}"


def format_rows(swept: Sequence[str], rows: Sequence[Mapping[str, Any]], *, slo: bool) -> str:
    if not rows:
        return "(no points)"
    metrics = HEADLINE + (GOODPUT if slo else ())
    headers = [*swept, *(h for h, _, _ in metrics)]
    notes: list[str] = []
    cells: list[list[str]] = []
    for r in rows:
        row = [setting_text(r[k]) for k in swept]
        if r.get("infeasible"):
            if r["infeasible"] not in notes:
                notes.append(r["infeasible"])
            row.append(f"infeasible [{notes.index(r['infeasible']) + 1}]")
        else:
            row += [_metric(r[key], kind) for _, key, kind in metrics]
        cells.append(row)
    feasible = [c for c in cells if len(c) == len(headers)]
    widths = [max(len(h), *(len(c[i]) for c in feasible)) if feasible else len(h)
              for i, h in enumerate(headers)]  # fmt: skip
    lines = ["  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True))]
    for c in cells:
        # An infeasible row's one note cell is left as it is, past the swept values.
        full = len(c) == len(headers)
        padded = [v.rjust(w) if full or i < len(swept) else v
                  for i, (v, w) in enumerate(zip(c, widths, strict=False))]  # fmt: skip
        lines.append("  ".join(padded))
    legend = (
        "latencies in ms; tok/s: output tokens a second"
        + ("; good %: requests within the SLO" if slo else "")
        + "; every column is in sweep.csv (--out)"
    )
    lines += textwrap.wrap(legend, WIDTH)
    for i, note in enumerate(notes, 1):
        lines += textwrap.wrap(note, WIDTH, initial_indent=f"[{i}] ", subsequent_indent="    ")
    return "\n".join(lines)
