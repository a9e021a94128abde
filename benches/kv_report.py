"""Run the KV-cache microbenchmarks and print one table: the Rust core's and
the Python twin's median time per call, measured in the same run, and their
ratio.

    python benches/kv_report.py [--json OUT.json] [extra pytest args]
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent


def fmt(seconds: float) -> str:
    return f"{seconds * 1e6:,.2f} µs" if seconds >= 1e-6 else f"{seconds * 1e9:,.0f} ns"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also keep pytest-benchmark's JSON here")
    args, extra = parser.parse_known_args()
    out = Path(args.json) if args.json else Path(tempfile.mkdtemp()) / "kv.json"
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        str(HERE / "test_bench_kv.py"),
        "-q",
        "-p",
        "no:cacheprovider",
        f"--benchmark-json={out}",
        *extra,
    ]
    if subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode != 0:
        print("benchmarks failed:", " ".join(cmd), file=sys.stderr)
        return 1
    data = json.loads(out.read_text())
    medians: dict[str, dict[str, float]] = defaultdict(dict)
    for b in data["benchmarks"]:
        backend = "rust" if "[rust" in b["name"] else "python"
        medians[b["group"]][backend] = b["stats"]["median"]
    info = data["machine_info"]
    print(
        f"machine: {info.get('cpu', {}).get('brand_raw', platform.processor())}, "
        f"Python {info['python_version']}, {platform.system()} {platform.machine()}"
    )
    print()
    print("| row | Rust core | Python twin | twin / core |")
    print("|---|---:|---:|---:|")
    for group in sorted(medians, key=lambda g: (g.split("[")[0], len(g), g)):
        m = medians[group]
        print(
            f"| {group} | {fmt(m['rust'])} | {fmt(m['python'])} | {m['python'] / m['rust']:.1f}× |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
