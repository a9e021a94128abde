"""benches/gpu/run.sh --dry-run: the GPU script's every step, on the CPU
interpreter at toy sizes, so it is known to work before device time is spent:
the kernel checks and timings (with the launch sweep), then nano-vllm's
workload through the engine with graphs on and off and through transformers."""

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
    out = done.stdout
    assert "correctness: all checks passed" in out
    csv = (tmp_path / "kernels-dry.csv").read_text()
    assert csv.count("\n") >= 5 and csv.count("decode_sweep") == 2
    assert "rope_and_cache" in csv and "rms_norm+residual" in csv
    # The nano bench's table comes last: both models, graphs on and off.
    table = out[out.rindex("| model | graphs on tok/s") :]
    assert table.count("| Qwen3-0.6B |") == 1 and table.count("| Llama-3.2-1B |") == 1
    assert out.rstrip().endswith("nano bench: done")
