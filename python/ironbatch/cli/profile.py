"""'ironbatch profile --model DIR': time the real engine on a grid of batch
shapes on this device and write a fitted step-time model (JSON) for
'ironbatch simulate --step-model'. A fit too poor to simulate with (R^2
under 0.9 or a median error over 15%) is reported with its likely cause
and not written unless --force is given (exit status 1)."""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

MAX_REPEATS = 1000


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "profile", help="fit a step-time model of the engine on this device", description=__doc__
    )
    p.add_argument("--model", help="a local Hugging Face model directory (default: the demo model)")
    p.add_argument("--out", default="step-model.json", help="where to write the model")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "float16", "bfloat16"],
                   help="the weights' dtype (default: the model's own)")  # fmt: skip
    p.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda if available)")
    p.add_argument("--quick", action="store_true", help="a smaller grid (a CPU, a smoke test)")
    p.add_argument("--repeats", default="3", help="timed steps per grid point (default 3)")
    p.add_argument("--seed", default="0", help="the prompts' and the demo model's seed")
    p.add_argument(
        "--clock",
        choices=["wall", "cpu"],
        default="wall",
        help="fit wall-clock seconds (a GPU, a dedicated machine) or this thread's CPU seconds "
        "(a shared CPU; pair it with a single-threaded engine)",
    )
    p.add_argument("--threads", help="torch CPU threads (e.g. 1 on a shared machine)")
    p.add_argument("--force", action="store_true", help="write the model even if the fit is poor")


def _int(option: str, text: str | None, lo: int, hi: int) -> int | None:
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        value = lo - 1
    if not lo <= value <= hi:
        raise ValueError(f"{option} must be an integer in [{lo:,}, {hi:,}], got {text!r}")
    return value


def _check(args: argparse.Namespace) -> tuple[int, int, int | None]:
    """The options, checked before the engine is built or anything runs."""
    from ironbatch.simulation.out_dir import check_out_file

    repeats = _int("--repeats", args.repeats, 1, MAX_REPEATS)
    seed = _int("--seed", args.seed, 0, 2**63 - 1)
    threads = _int("--threads", args.threads, 1, 4096)
    if args.device is not None:
        if not re.fullmatch(r"cpu|cuda(:\d+)?", args.device):
            raise ValueError(f"--device must be cpu, cuda or cuda:N, got {args.device!r}")
        if args.device.startswith("cuda"):
            import torch

            count = torch.cuda.device_count()
            index = int(args.device.partition(":")[2] or 0)
            if index >= count:
                raise ValueError(
                    f"--device {args.device}: this machine has "
                    + (
                        f"{count} CUDA devices (cuda:0 to cuda:{count - 1})"
                        if count
                        else "no CUDA device; use --device cpu"
                    )  # fmt: skip
                )
    if args.model is not None and not os.path.isdir(args.model):
        raise ValueError(f"--model {args.model!r} is not a model directory")
    check_out_file(args.out, what="--out")
    assert repeats is not None and seed is not None
    return repeats, seed, threads


def profile_main(args: argparse.Namespace) -> int:
    from ironbatch.simulation.out_dir import writing
    from ironbatch.simulation.profile import fit_problems, profile_engine

    repeats, seed, threads = _check(args)
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    model = profile_engine(
        args.model,
        device=args.device,
        dtype=args.dtype,
        quick=args.quick,
        repeats=repeats,
        seed=seed,
        clock=args.clock,
        log=lambda s: print(s, file=sys.stderr),
    )
    fit = model.fit
    print(
        f"{model.description}: {fit['samples']} timed steps, R^2 {fit['r2']:.4f}, "
        f"median |error| {fit['median_abs_rel_error'] * 100:.1f}%, "
        f"p90 |error| {fit['p90_abs_rel_error'] * 100:.1f}%"
    )
    problems = fit_problems(fit)
    for line in problems:
        print(f"ironbatch profile: warning: {line}", file=sys.stderr)
    if problems and not args.force:
        print(
            f"ironbatch profile: the fit is too poor to simulate with; {args.out} not written "
            "(pass --force to write it anyway)",
            file=sys.stderr,
        )
        return 1
    with writing(Path(args.out)):
        model.save(args.out)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0
