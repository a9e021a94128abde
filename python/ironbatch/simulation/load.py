"""Open a workload by what it is: ``synthetic:...``, ``sample`` (the small
Azure-trace slice shipped with the package, ``SAMPLE_TRACE``), or a file
whose format is told by ``format=`` or recognised from its first line (the
CSV header, the first JSON object). Every reader takes the file through
``text_lines``: gzipped or not, a bad byte or a truncated stream is named
with the file and the line."""

from __future__ import annotations

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
from ironbatch.simulation.text_lines import first_line
from ironbatch.simulation.workload import Workload

FORMATS = ("azure", "burstgpt", "mooncake", "trace", "synthetic")
#: A slice of Microsoft's Azure LLM inference trace (conversation service,
#: 2023; CC-BY-4.0, see data/README.md): its first 300 requests, 84 s of
#: traffic. ``load_workload("sample")`` and ``ironbatch simulate
#: sample`` read it.
SAMPLE_TRACE = Path(__file__).resolve().parent / "data" / "sample_trace.csv"
SAMPLE = "sample"


def detect_format(path: str | os.PathLike[str]) -> str:
    """Which of FORMATS the file at ``path`` is, from its first line."""
    line = first_line(path).strip().lstrip("\ufeff")
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


def load_workload(
    source: Workload | str | os.PathLike[str], *, format: str | None = None
) -> Workload:
    """The workload ``source`` names: ``synthetic:key=value,...``,
    ``sample`` (SAMPLE_TRACE; ``./sample`` for a file of that name) or a
    file."""
    if isinstance(source, Workload):
        return source
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(
            f"workload must be a Workload, a file path, 'sample' or 'synthetic:...', "
            f"got {type(source).__name__}"
        )
    text = os.fspath(source)
    if text == SAMPLE and format in (None, "azure"):
        return read_azure_csv(SAMPLE_TRACE, "sample (Azure conversation trace, 300 requests)")
    if format == "synthetic" or (format is None and text.startswith(SYNTHETIC_PREFIX)):
        return synthetic_workload(text)
    if format is not None and format not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {format!r}")
    path = Path(text)
    if not path.is_file():
        raise ValueError(
            f"workload {text!r}: no such file (or write synthetic:key=value,... or sample)"
        )
    kind = format or detect_format(path)
    name = path.name
    if kind == "azure":
        return read_azure_csv(path, name)
    if kind == "burstgpt":
        return read_burstgpt_csv(path, name)
    if kind == "mooncake":
        return read_mooncake_jsonl(path, name)
    return read_ironbatch_trace(path, name)
