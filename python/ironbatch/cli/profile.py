"""``ironbatch profile --model DIR``: time the real engine on a grid of batch
shapes on this device and write a fitted step-time model (JSON) for
``ironbatch simulate --step-model``."""

from __future__ import annotations

import argparse
import sys


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("profile", help="fit a step-time model of the engine on this device",
                       description=__doc__)
    p.add_argument("--model", help="a local Hugging Face model directory (default: the demo model)")
    p.add_argument("--out", default="step-model.json", help="where to write the model")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--device", help="cuda or cpu (default: cuda if available)")
    p.add_argument("--quick", action="store_true", help="a smaller grid (a CPU, a smoke test)")
    p.add_argument("--repeats", type=int, default=3, help="timed steps per grid point")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--clock",
        choices=["wall", "cpu"],
        default="wall",
        help="fit wall-clock seconds (a GPU, a dedicated machine) or this thread's CPU seconds "
        "(a shared CPU; pair it with a single-threaded engine)",
    )
    p.add_argument("--threads", type=int, help="torch CPU threads (e.g. 1 on a shared machine)")


def profile_main(args: argparse.Namespace) -> int:
    from ironbatch.simulation.profile import profile_engine

    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    model = profile_engine(
        args.model,
        device=args.device,
        dtype=args.dtype,
        quick=args.quick,
        repeats=args.repeats,
        seed=args.seed,
        clock=args.clock,
        log=lambda s: print(s, file=sys.stderr),
    )
    model.save(args.out)
    fit = model.fit
    print(
        f"{model.description}: {fit['samples']} timed steps, R^2 {fit['r2']:.4f}, "
        f"median |error| {fit['median_abs_rel_error'] * 100:.1f}%, "
        f"p90 |error| {fit['p90_abs_rel_error'] * 100:.1f}%; wrote {args.out}"
    )
    return 0
