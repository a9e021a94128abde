"""benches/gpu/run.sh --dry-run: the GPU script's every step, on the CPU
interpreter at toy sizes, so it is known to work before device time is spent."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="the dry run needs torch and triton (pip install '.[test]')")

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_script_dry_run(tmp_path: Path) -> None:
    env = {**os.environ, "OUT": str(tmp_path)}
    done = subprocess.run(
        ["bash", str(ROOT / "benches/gpu/run.sh"), "--dry-run"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "correctness: all checks passed" in done.stdout
    assert (tmp_path / "kernels-dry.csv").read_text().count("\n") >= 5
