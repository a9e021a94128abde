"""benches/flame_summary.py: a py-spy raw profile's shares under a root
frame, by function, line numbers folded."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benches" / "flame_summary.py"
spec = importlib.util.spec_from_file_location("flame_summary", SCRIPT)
assert spec is not None and spec.loader is not None
flame = importlib.util.module_from_spec(spec)
sys.modules["flame_summary"] = flame  # dataclasses look their module up
spec.loader.exec_module(flame)

PROFILE = [
    "main (a.py:1);step (lockstep.py:80);schedule (s.py:10) 6\n",
    "main (a.py:1);step (lockstep.py:81);schedule (s.py:12);rows (r.py:3) 2\n",
    "main (a.py:1);step (lockstep.py:81);update (s.py:40) 2\n",
    "main (a.py:1);setup (a.py:9) 90\n",  # not under the root
    "idle\n",
]


def test_shares_under_the_root_fold_line_numbers() -> None:
    s = flame.summarize(PROFILE, "step (")
    assert s.samples == 10
    assert s.inclusive["step (lockstep.py)"] == 10
    assert s.inclusive["schedule (s.py)"] == 8
    assert s.own["schedule (s.py)"] == 6
    assert s.own["rows (r.py)"] == 2
    assert "setup (a.py)" not in s.inclusive
    text = flame.table(s, top=3)
    assert "| `schedule (s.py)` | 80.0% | 60.0% |" in text
    assert text.count("\n| `") == 3  # top 3 only


def test_the_script_prints_one_table_per_root(tmp_path: Path) -> None:
    prof = tmp_path / "p.txt"
    prof.write_text("".join(PROFILE))
    out = subprocess.run(
        [sys.executable, str(SCRIPT), str(prof), "--root", "step (", "--root", "nothing"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "Samples under `step (`: 10" in out
    assert "Samples under `nothing`: 0" in out
