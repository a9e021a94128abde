"""'ironbatch replay': ironbatch-trace/1 files replayed on the core (or its
Python twin), one line per trace (--json: the results as JSON).

Every file's header is read first: a file that is missing, not a trace or
whose config the scheduler refuses stops the command before any replay (exit
status 2). A trace found broken later, part way through (a step without a
key, a truncated gzip stream), is reported with its line and the next one
replayed; exit status 1 on that or on any difference."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ironbatch.cli.options import add_json_flag, progress, to_json
from ironbatch.trace import TraceError, replay
from ironbatch.trace.reading import Trace
from ironbatch.trace.replay import BACKENDS, LEVELS, trace_scheduler


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "replay",
        help="replay ironbatch-trace/1 files and report parity",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "traces", nargs="+", help="trace files (.jsonl, gzipped or not, or - for standard input)"
    )
    p.add_argument(
        "--backend",
        choices=BACKENDS,
        default="rust",
        help="the scheduler to replay on: the Rust core or its Python twin (default: rust)",
    )
    p.add_argument(
        "--level",
        choices=LEVELS,
        default="blocks",
        help="blocks: compare block ids and free counts too; decisions: only what "
        "was scheduled, preempted and output (default: blocks)",
    )
    add_json_flag(p, "every trace's result and the count identical")


def replay_main(args: argparse.Namespace) -> int:
    paths: list[str] = args.traces
    stdin = _check_headers(paths, args.backend)
    different = 0
    results: list[dict[str, Any]] = []
    for path in paths:
        try:
            with progress(None, Path(path).name) as bar:
                trace = stdin if path == "-" and stdin is not None else path
                result = replay(trace, args.backend, args.level, on_step=bar.update)
        # Broken part way through: reported, and the next trace replayed.
        except TraceError as e:
            different += 1
            results.append({"path": path, "identical": False, "error": str(e)})
            if not args.json:
                print(f"cannot replay {e}")
            continue
        different += not result.identical
        results.append(result.as_dict())
        if not args.json:
            print(result)
    identical = len(paths) - different
    if args.json:
        summary = {"level": args.level, "backend": args.backend, "identical": identical}
        print(to_json(summary | {"traces": len(paths), "results": results}))
    else:
        print(f"{identical} of {len(paths)} identical at {args.level} level ({args.backend})")
    return 1 if different else 0


def _check_headers(paths: list[str], backend: str) -> Trace | None:
    """Every trace's header and config, before any replay; standard input,
    which cannot be read twice, is kept open for its replay."""
    if paths.count("-") > 1:
        raise ValueError("'-' (standard input) can be given once")
    stdin = None
    try:
        for path in paths:
            trace = Trace(path)
            if path == "-":
                stdin = trace
            try:
                trace_scheduler(trace, backend)
            finally:
                if trace is not stdin:
                    trace.close()
    except BaseException:
        if stdin is not None:
            stdin.close()
        raise
    return stdin
