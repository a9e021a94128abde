"""`benches/cold_step.py` runs and reports a row per concurrency (the core
alone here: vLLM is not installed in the project's venv)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_cold_step_reports_warm_and_cold_medians_per_concurrency() -> None:
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benches" / "cold_step.py"),
            "--running",
            "1,4",
            "--steps",
            "20",
            "--evict-kib",
            "64",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    ).stdout
    rows = [line for line in out.splitlines() if re.match(r"\| \d", line)]
    assert [r.split("|")[1].strip() for r in rows] == ["1", "4"]
    for r in rows:
        warm, cold = (float(c.split()[0].replace(",", "")) for c in r.split("|")[2:4])
        assert warm > 0 and cold > 0
    assert "cold = after reading 64 KiB" in out
