"""The ``ironbatch`` command: ``demo``, ``generate``, ``replay``, ``bench``, ``simulate`` and
``profile``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ironbatch.cli.options import add_json_flag


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ironbatch", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    d = sub.add_parser("demo", help="continuous batching on a small random-weight Llama")
    d.add_argument("--model", help="a local Hugging Face model directory (default: random)")
    d.add_argument("--requests", type=int, default=300)
    d.add_argument("--max-num-seqs", type=int, default=64)
    d.add_argument("--num-blocks", type=int, help="KV-cache blocks (default: a tight 200)")
    d.add_argument("--seed", type=int, default=0)

    g = sub.add_parser("generate", help="complete prompts with a local model")
    g.add_argument("--model", required=True)
    g.add_argument(
        "--prompt",
        action="append",
        required=True,
        help="text, or ids:1,2,3 for token ids (repeatable)",
    )
    g.add_argument("--max-tokens", type=int, default=64)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--seed", type=int)
    g.add_argument("--attention-backend", choices=["torch", "triton"])
    g.add_argument(
        "--enforce-eager",
        action="store_true",
        help="run every step eagerly: no padded decode steps, no CUDA graphs (as vLLM's flag)",
    )
    g.add_argument(
        "--speculative-config",
        help="n-gram speculation as a JSON object of vLLM's keys, e.g. "
        '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}',
    )

    p = sub.add_parser("replay", help="replay ironbatch-trace/1 files and report parity")
    p.add_argument("traces", nargs="+", help="trace files (.jsonl, .jsonl.gz, or - for stdin)")
    p.add_argument("--backend", choices=["rust", "python"], default="rust")
    p.add_argument("--level", choices=["decisions", "blocks"], default="blocks")
    add_json_flag(p, "every trace's result and the count identical")

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

    from ironbatch.cli import profile, simulate

    simulate.add_parser(sub)
    profile.add_parser(sub)

    args = parser.parse_args(argv)
    try:
        return _run(args)
    except (ValueError, TypeError) as e:
        print(f"ironbatch {args.command}: {e}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    if args.command == "demo":
        from ironbatch.cli.demo import format_summary, run_demo

        summary = run_demo(args.model, args.requests, args.max_num_seqs, args.num_blocks, args.seed)
        print(format_summary(summary))
        return 0
    if args.command == "generate":
        from ironbatch.cli.generate import generate_main

        return generate_main(
            args.model,
            args.prompt,
            args.max_tokens,
            args.temperature,
            args.seed,
            args.attention_backend,
            speculative_config=args.speculative_config,
            enforce_eager=args.enforce_eager,
        )
    if args.command == "simulate":
        from ironbatch.cli.simulate import simulate_main

        return simulate_main(args)
    if args.command == "profile":
        from ironbatch.cli.profile import profile_main

        return profile_main(args)
    if args.command == "replay":
        from ironbatch.cli.replay import replay_main

        return replay_main(args.traces, args.backend, args.level, as_json=args.json)
    from ironbatch.cli.bench import bench_main

    return bench_main(args.workloads.split(","), args.steps, args.backends.split(","), args.turn)


if __name__ == "__main__":
    sys.exit(main())
