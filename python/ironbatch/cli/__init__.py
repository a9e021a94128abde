"""The ``ironbatch`` command: ``replay`` and ``bench``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ironbatch", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("replay", help="replay ironbatch-trace/1 files and report parity")
    p.add_argument("traces", nargs="+", help="trace files (.jsonl)")
    p.add_argument("--backend", choices=["rust", "python"], default="rust")
    p.add_argument("--level", choices=["decisions", "blocks"], default="blocks")

    b = sub.add_parser("bench", help="time schedule() + update_from_output() per step")
    b.add_argument(
        "--workloads",
        default="decode-64,decode-256,decode-1024,mixed",
        help="comma-separated names (default: all)",
    )
    b.add_argument("--steps", type=int, default=100, help="timed steps per workload")
    b.add_argument("--backends", default="rust,python", help="comma-separated backends")
    b.add_argument(
        "--turn",
        type=int,
        default=1,
        help="consecutive steps per scheduler before the next takes its turn",
    )

    args = parser.parse_args(argv)
    if args.command == "replay":
        from ironbatch.cli.replay import replay_main

        return replay_main(args.traces, args.backend, args.level)
    from ironbatch.cli.bench import bench_main

    return bench_main(args.workloads.split(","), args.steps, args.backends.split(","), args.turn)


if __name__ == "__main__":
    sys.exit(main())
