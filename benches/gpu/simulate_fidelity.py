"""The simulator's fidelity on this device: ``ironbatch profile`` fits a
step-time model of the engine here (wall clock), then the engine serves a
300-request online workload with arrivals on the wall clock and the
simulator runs the same workload on the fitted model; median and p90 TTFT
and E2E side by side (the CPU test's comparison, tests/
test_simulate_fidelity.py, on the GPU). ``--dry-run``: the demo model on the
CPU at toy size, on the thread clock.

    python benches/gpu/simulate_fidelity.py --model /path/to/hf-model
    python benches/gpu/simulate_fidelity.py --dry-run
"""

from __future__ import annotations

import argparse
import sys
import tempfile

from ironbatch.simulation import synthetic_workload
from ironbatch.simulation.fidelity import measure
from ironbatch.simulation.profile import QUICK_GRID, ProfileGrid, profile

GPU_WORKLOAD = (
    "synthetic:requests=300,rate={rate},prompt_mean=512,prompt_sigma=0.6,output_mean=128,"
    "output_sigma=0.6,prefix_groups=4,prefix_tokens=256,seed=1"
)
DRY_WORKLOAD = (
    "synthetic:requests=30,rate=15,prompt_mean=64,prompt_sigma=0.5,output_mean=8,"
    "output_sigma=0.5,seed=1"
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", help="a local HF model directory (default: the demo model)")
    ap.add_argument("--rate", type=float, default=4.0, help="requests per second")
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args()
    import torch

    from ironbatch.engine import EngineArgs, LLMEngine
    from ironbatch.model.random_model import write_random_llama

    tmp = tempfile.TemporaryDirectory(prefix="ironbatch-fidelity-")
    model = args.model or str(write_random_llama(tmp.name, seed=0))
    if args.dry_run:
        torch.set_num_threads(1)
        engine_args = {"max_num_seqs": 32, "max_num_batched_tokens": 512, "num_blocks": 600,
                       "max_model_len": 512, "device": "cpu", "dtype": "float32"}  # fmt: skip
        grid, clock, spec = QUICK_GRID, "thread", DRY_WORKLOAD
    else:
        dtype = "bfloat16" if args.model else "float32"
        engine_args = {"max_num_seqs": 128, "max_num_batched_tokens": 4096,
                       "max_model_len": 4096, "dtype": dtype}  # fmt: skip
        grid = ProfileGrid(decode_batches=(1, 4, 16, 64, 128), contexts=(256, 1024, 3072),
                           prefills=(256, 1024, 4000), mixed_batches=(4, 32))  # fmt: skip
        clock, spec = "wall", GPU_WORKLOAD.format(rate=args.rate)
    engine = LLMEngine(EngineArgs(model=model, seed=0, **engine_args))
    fitted = profile(engine, args.model or "demo model", grid=grid,
                     clock="cpu" if clock == "thread" else "wall")  # fmt: skip
    print(
        f"{fitted.description}: {fitted.fit['samples']} steps, median |error| "
        f"{fitted.fit['median_abs_rel_error']:.1%}, p90 {fitted.fit['p90_abs_rel_error']:.1%}"
    )
    result = measure(engine, synthetic_workload(spec), fitted, clock=clock)
    print(f"workload: {spec}; engine on {engine.device} ({clock} clock)")
    print(result.table())
    tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
