"""'ironbatch simulate': a workload through vLLM 0.33's scheduling on a
step-time model's clock; the summary table (--json: the summary as JSON),
and with --out the per-request and per-step CSVs, --report an HTML page,
--sweep a grid of settings.

Two settings are derived unless given: max_model_len is the longest
request's prompt plus output tokens, rounded up to block_size (requests
whose prompt reaches a max_model_len you set are left out, and counted), and
num_blocks comes from kv_cache_gib, else from what the roofline device's
memory leaves after the weights (as vLLM sizes it), else room for
max_num_seqs requests of max_model_len."""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import fields
from pathlib import Path

from ironbatch.simulation.settings import KEYS
from ironbatch.simulation.synthetic import SyntheticSpec

SYNTHETIC_KEYS = ", ".join(f.name for f in fields(SyntheticSpec))


def add_parser(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser(
        "simulate",
        help="vLLM's exact scheduling of a request trace on a step-time model's clock",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    s.add_argument(
        "workload",
        help="'sample' (a 300-request slice of the Azure conversation trace, shipped), an "
        "Azure-trace or BurstGPT CSV, a Mooncake JSONL, an ironbatch trace (any of them "
        "gzipped), or synthetic:key=value,... with the keys "
        f"{SYNTHETIC_KEYS} (e.g. synthetic:requests=2000,rate=8,prefix_groups=4)",
    )
    s.add_argument("--format", choices=["azure", "burstgpt", "mooncake", "trace"],
                   help="the file's format (default: told from its first line)")  # fmt: skip
    s.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"a scheduler setting, vLLM's names (repeatable): {', '.join(KEYS)}. "
        "max_model_len defaults to the longest request (prompt + output, rounded up to "
        "block_size); num_blocks to what kv_cache_gib or the device leaves",
    )
    s.add_argument(
        "--step-model",
        help="roofline:DEVICE[,model=...] (h100, h200, a100, l4), linear:COEFFICIENT=SECONDS,..., "
        "or a JSON file from ironbatch profile (default: roofline:h100,model=llama-3.1-8b)",
    )
    s.add_argument("--speed", default="1", help="arrival-rate multiplier (> 0; default 1)")
    s.add_argument("--slice", help="START:END in trace seconds (either may be left out)")
    s.add_argument("--max-requests", help="only the first N requests (after --slice)")
    s.add_argument("--slo", help="goodput bounds, e.g. ttft=500ms,tpot=50ms (adds goodput)")
    s.add_argument("--out", help="a folder for requests.csv, steps.csv, summary.json")
    s.add_argument("--report", action="store_true", help="also write report.html (needs --out)")
    s.add_argument(
        "--trace",
        help="write an ironbatch-trace/1 file of the run (synchronous scheduling only: add "
        "--config async_scheduling=false)",
    )
    s.add_argument(
        "--json",
        action="store_true",
        help="print the summary (or the sweep's rows) as JSON instead of the table",
    )
    s.add_argument(
        "--sweep",
        action="append",
        default=[],
        metavar="KEY=V1,V2,...",
        help="sweep a setting (repeatable: every combination); a point the scheduler cannot "
        "run is reported as infeasible, with the reason, and the rest still run",
    )
    s.add_argument("--jobs", help="processes for --sweep (default: one per CPU)")
    s.add_argument("--ray", metavar="ADDRESS", help="run --sweep on this Ray cluster")


def _positive_int(option: str, text: str | None) -> int | None:
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{option} must be an integer >= 1, got {text!r}") from None
    if value < 1:
        raise ValueError(f"{option} must be an integer >= 1, got {text!r}")
    return value


def _speed(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 < value <= 1e9):
        raise ValueError(f"--speed must be a number in (0, 1,000,000,000], got {text!r}")
    return value


def _slice(text: str | None) -> tuple[float | None, float | None]:
    if text is None:
        return None, None
    start, sep, end = text.partition(":")
    if not sep:
        raise ValueError(f"--slice must be START:END, got {text!r}")
    try:
        bounds = (float(start) if start.strip() else None, float(end) if end.strip() else None)
    except ValueError:
        raise ValueError(f"--slice must be START:END in seconds, got {text!r}") from None
    if any(b is not None and not (math.isfinite(b) and b >= 0) for b in bounds):
        raise ValueError(f"--slice: START and END must be finite seconds >= 0, got {text!r}")
    return bounds


def simulate_main(args: argparse.Namespace) -> int:
    from ironbatch.simulation import load_step_model, load_workload, simulate
    from ironbatch.simulation.out_dir import check_out_dir, check_out_file
    from ironbatch.simulation.slo import parse_slo

    # Every option checked before anything runs or is written.
    if args.report and not args.out:
        raise ValueError("--report needs --out DIR")
    start_s, end_s = _slice(args.slice)
    speed = _speed(args.speed)
    max_requests = _positive_int("--max-requests", args.max_requests)
    jobs = _positive_int("--jobs", args.jobs)
    if args.out:
        check_out_dir(args.out, what="--out")
    if args.trace:
        if args.sweep:
            raise ValueError("--trace writes one run; it cannot go with --sweep")
        check_out_file(args.trace, what="--trace")
    slo = parse_slo(args.slo)
    workload = load_workload(args.workload, format=args.format)
    model = load_step_model(args.step_model)
    progress = sys.stderr.isatty() and not args.json
    if args.sweep:
        return _sweep_main(args, workload, model, start_s, end_s, speed, max_requests, jobs, slo,
                           progress)  # fmt: skip
    result = simulate(
        workload,
        config=args.config,
        step_model=model,
        speed=speed,
        start_s=start_s,
        end_s=end_s,
        max_requests=max_requests,
        slo=slo,
        trace=args.trace,
        progress=progress,
    )
    print(result.json(indent=1) if args.json else result.table())
    for why, n in result.rejected.items():
        print(f"left out: {n:,} requests ({why})", file=sys.stderr)
    if args.out:
        for path in result.write(args.out, report=args.report):
            print(f"wrote {path}", file=sys.stderr)
    if args.trace:
        print(f"wrote {args.trace}", file=sys.stderr)
    return 0


def _sweep_main(args, workload, model, start_s, end_s, speed, max_requests, jobs, slo,  # type: ignore[no-untyped-def]
                progress) -> int:  # fmt: skip
    from ironbatch.simulation.out_dir import writing
    from ironbatch.simulation.report import write_sweep_report
    from ironbatch.simulation.summary import json_ready
    from ironbatch.simulation.sweep import parse_sweep, run_sweep, write_rows

    if start_s is not None or end_s is not None or max_requests is not None:
        workload = workload.sliced(start_s=start_s, end_s=end_s, max_requests=max_requests)
    result = run_sweep(
        workload,
        parse_sweep(args.sweep),
        config=args.config,
        step_model=model,
        speed=speed,
        slo=slo,
        jobs=jobs,
        ray_address=args.ray,
        progress=progress,
    )
    if args.json:
        doc = {"workload": result.workload, "step_model": result.step_model, "rows": result.rows}
        print(json.dumps(json_ready(doc), indent=1, allow_nan=False))
    else:
        bad = len(result.points) - result.feasible
        print(f"{result.workload} — {result.step_model}: {len(result.points)} configurations"
              + (f", {bad} infeasible" if bad else ""))  # fmt: skip
        print(result.table())
    if args.out:
        out = Path(args.out)
        with writing(out):
            out.mkdir(parents=True, exist_ok=True)
            write_rows(out / "sweep.csv", result.rows)
            print(f"wrote {out / 'sweep.csv'}", file=sys.stderr)
            if args.report:
                print(f"wrote {write_sweep_report(out / 'report.html', result)}", file=sys.stderr)
    # Nothing ran: a failure, though every point's reason is in the table.
    return 0 if result.feasible else 1
