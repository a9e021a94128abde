"""``ironbatch simulate``: a workload through vLLM 0.33's scheduling on a
step-time model's clock; the summary table, and with ``--out`` the
per-request and per-step CSVs, ``--report`` an HTML page, ``--sweep`` a
grid of settings."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser(
        "simulate",
        help="vLLM's exact scheduling of a request trace on a step-time model's clock",
        description=__doc__,
    )
    s.add_argument(
        "workload",
        help="an Azure-trace or BurstGPT CSV, a Mooncake JSONL, an ironbatch trace, or "
        "synthetic:key=value,... (e.g. synthetic:requests=2000,rate=8,prefix_groups=4)",
    )
    s.add_argument("--format", choices=["azure", "burstgpt", "mooncake", "trace"])
    s.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a scheduler setting, vLLM's names (repeatable): max_num_seqs, "
        "max_num_batched_tokens, num_blocks, kv_cache_gib, async_scheduling, ...",
    )
    s.add_argument(
        "--step-model",
        help="roofline:DEVICE[,model=...] (h100, h200, a100, l4), linear:..., or a JSON file "
        "from ironbatch profile (default: roofline:h100,model=llama-3.1-8b)",
    )
    s.add_argument("--speed", type=float, default=1.0, help="arrival-rate multiplier")
    s.add_argument("--slice", help="START:END in trace seconds (either may be left out)")
    s.add_argument("--max-requests", type=int, help="only the first N requests (after --slice)")
    s.add_argument("--slo", help="goodput bounds, e.g. ttft=500ms,tpot=50ms")
    s.add_argument("--out", help="a folder for requests.csv, steps.csv, summary.json")
    s.add_argument("--report", action="store_true", help="also write report.html (needs --out)")
    s.add_argument("--trace", help="write an ironbatch-trace/1 file of the run (sync only)")
    s.add_argument(
        "--sweep",
        action="append",
        default=[],
        metavar="KEY=V1,V2,...",
        help="sweep a setting (repeatable: every combination)",
    )
    s.add_argument("--jobs", type=int, help="processes for --sweep (default: one per CPU)")
    s.add_argument("--ray", metavar="ADDRESS", help="run --sweep on this Ray cluster")


def _slice(text: str | None) -> tuple[float | None, float | None]:
    if text is None:
        return None, None
    start, sep, end = text.partition(":")
    if not sep:
        raise ValueError(f"--slice must be START:END, got {text!r}")
    try:
        return (float(start) if start.strip() else None, float(end) if end.strip() else None)
    except ValueError:
        raise ValueError(f"--slice must be START:END in seconds, got {text!r}") from None


def simulate_main(args: argparse.Namespace) -> int:
    from ironbatch.simulation import load_step_model, load_workload, simulate
    from ironbatch.simulation.slo import parse_slo

    if args.report and not args.out:
        raise ValueError("--report needs --out DIR")
    start_s, end_s = _slice(args.slice)
    workload = load_workload(args.workload, format=args.format)
    model = load_step_model(args.step_model)
    if args.sweep:
        return _sweep_main(args, workload, model, start_s, end_s)
    result = simulate(
        workload,
        config=args.config,
        step_model=model,
        speed=args.speed,
        start_s=start_s,
        end_s=end_s,
        max_requests=args.max_requests,
        slo=parse_slo(args.slo),
        trace=args.trace,
    )
    print(result.table())
    for why, n in result.rejected.items():
        print(f"left out: {n:,} requests ({why})", file=sys.stderr)
    if args.out:
        for path in result.write(args.out, report=args.report):
            print(f"wrote {path}", file=sys.stderr)
    return 0


def _sweep_main(args, workload, model, start_s, end_s) -> int:  # type: ignore[no-untyped-def]
    from ironbatch.simulation.report import write_sweep_report
    from ironbatch.simulation.slo import parse_slo
    from ironbatch.simulation.sweep import parse_sweep, run_sweep, write_rows

    if args.trace:
        raise ValueError("--trace writes one run; it cannot go with --sweep")
    if start_s is not None or end_s is not None or args.max_requests is not None:
        workload = workload.sliced(start_s=start_s, end_s=end_s, max_requests=args.max_requests)
    result = run_sweep(
        workload,
        parse_sweep(args.sweep),
        config=args.config,
        step_model=model,
        speed=args.speed,
        slo=parse_slo(args.slo),
        jobs=args.jobs,
        ray_address=args.ray,
    )
    print(f"{result.workload} — {result.step_model}: {len(result.points)} configurations")
    print(result.table())
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        write_rows(out / "sweep.csv", result.rows)
        print(f"wrote {out / 'sweep.csv'}", file=sys.stderr)
        if args.report:
            print(f"wrote {write_sweep_report(out / 'report.html', result)}", file=sys.stderr)
    return 0
