"""Open a workload by what it is: ``synthetic:...``, or a file whose format
is told by ``format=`` or recognised from its first line (the CSV header,
the first JSON object)."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

from ironbatch.simulation.azure_csv import HEADER as AZURE_HEADER
from ironbatch.simulation.azure_csv import read_azure_csv
from ironbatch.simulation.burstgpt_csv import COLUMNS as BURSTGPT_COLUMNS
from ironbatch.simulation.burstgpt_csv import read_burstgpt_csv
from ironbatch.simulation.ironbatch_trace import read_ironbatch_trace
from ironbatch.simulation.mooncake_jsonl import read_mooncake_jsonl
from ironbatch.simulation.synthetic import PREFIX as SYNTHETIC_PREFIX
from ironbatch.simulation.synthetic import synthetic_workload
from ironbatch.simulation.workload import Workload

FORMATS = ("azure", "burstgpt", "mooncake", "trace", "synthetic")


def _first_line(path: Path) -> str:
    with open(path, "rb") as f:
        head = f.read(2)
    opener = gzip.open if head == b"\x1f\x8b" else open
    with opener(path, "rt", encoding="utf-8") as f:  # type: ignore[operator]
        for line in f:
            if line.strip():
                return line
    return ""


def detect_format(path: str | os.PathLike[str]) -> str:
    """Which of FORMATS the file at ``path`` is, from its first line."""
    line = _first_line(Path(path)).strip().lstrip("\ufeff")
    if line.startswith("{"):
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            obj = None
        if isinstance(obj, dict) and obj.get("format") == "ironbatch-trace/1":
            return "trace"
        if isinstance(obj, dict) and "input_length" in obj:
            return "mooncake"
    header = [h.strip() for h in line.split(",")]
    if all(c in header for c in AZURE_HEADER):
        return "azure"
    if all(c in header for c in BURSTGPT_COLUMNS):
        return "burstgpt"
    raise ValueError(
        f"{path}: not a workload this reader knows (an Azure-trace CSV with "
        f"{','.join(AZURE_HEADER)}, a BurstGPT CSV, Mooncake JSONL or an ironbatch-trace/1 "
        f"file); the first line is {line[:80]!r}"
    )


def load_workload(source: str | os.PathLike[str], *, format: str | None = None) -> Workload:
    """The workload ``source`` names: ``synthetic:key=value,...`` or a file."""
    text = os.fspath(source)
    if format == "synthetic" or (format is None and text.startswith(SYNTHETIC_PREFIX)):
        return synthetic_workload(text)
    if format is not None and format not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {format!r}")
    path = Path(text)
    if not path.is_file():
        raise ValueError(f"workload {text!r}: no such file (or write synthetic:key=value,...)")
    kind = format or detect_format(path)
    name = path.name
    if kind == "azure":
        return read_azure_csv(path, name)
    if kind == "burstgpt":
        return read_burstgpt_csv(path, name)
    if kind == "mooncake":
        return read_mooncake_jsonl(path, name)
    return read_ironbatch_trace(path, name)
