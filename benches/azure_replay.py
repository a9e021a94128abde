"""Replay an Azure LLM inference trace (Microsoft's public 2023 traces, or a
synthetic one of the conversation trace's shape) through vLLM's own
scheduler, the vLLM drop-in (``ironbatch.vllm.Scheduler``) and the core
(``ironbatch.Scheduler``, backend "rust") in lockstep, checking that every
step's decisions are identical, and time each scheduler's ``schedule()`` +
``update_from_output()`` per step by running-request bucket: under sync
and async scheduling in one run (``--modes``), on the wall clock and in
thread CPU time, median and p90, ending with one table of the medians and
the ratios to vLLM's.

The deployment: block size 16, max_model_len 8192, 256 sequences, an
8,192-token budget (``--max-num-batched-tokens 2048`` for the smaller one),
prefix caching and chunked prefill on, a KV cache for 256 full-length
sequences unless ``--num-blocks`` says otherwise. Each step is assumed to
take ``--step-ms`` of model time (30 ms): requests arriving while a step runs
are added before the next one (python/ironbatch/bench/trace_workload.py has
the prompts and this mapping). Without vLLM installed the Python twin stands
in for vLLM's scheduler (and there is no drop-in to time).

``--floor`` adds the object floor (python/ironbatch/bench/vllm_floor.py):
a lane that only builds the objects vLLM's engine reads, replayed from
vLLM's own, after an untimed pass through vLLM's scheduler that records
them: an estimate of the least any scheduler behind vLLM's interface can
cost a step.

    python benches/azure_replay.py [--trace PATH | --synthetic N] [--seed S]
        [--rate-scale X] [--step-ms MS] [--modes sync,async] [--max-steps N]
        [--max-num-batched-tokens 2048] [--num-blocks B] [--twin] [--floor]
        [--lanes vllm,drop-in,core]
        [--buckets 16,64,128,192,256]

The real traces (CC-BY-4.0) are at
https://github.com/Azure/AzurePublicDataset (AzureLLMInferenceDataset2023).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import sys

# One thread per math library: idle worker threads of torch and OpenBLAS
# spin and steal the cores the schedulers are timed on.
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(var, "1")

from ironbatch.bench.azure_trace import CONV_RATE_PER_S, read_trace, synthetic_trace  # noqa: E402
from ironbatch.bench.lockstep import Lane, Replay, core_lane, replay, vllm_lane  # noqa: E402
from ironbatch.bench.step_buckets import BUCKETS, bucket_table, ratio_table  # noqa: E402
from ironbatch.bench.trace_workload import Deployment, deployment  # noqa: E402


def buckets_arg(text: str) -> list[tuple[int, int]]:
    """``16,64,128`` -> [(1, 16), (17, 64), (65, 128)]."""
    edges = [int(x) for x in text.split(",")]
    if not edges or edges[0] < 1 or any(b <= a for a, b in zip(edges, edges[1:], strict=False)):
        raise argparse.ArgumentTypeError(f"expected increasing positive edges, got {text!r}")
    return list(zip([1, *(e + 1 for e in edges[:-1])], edges, strict=True))


LANE_NAMES = ("vllm", "drop-in", "core")
MODES = ("sync", "async")


def modes_arg(text: str) -> tuple[str, ...]:
    """``async,sync`` -> ("sync", "async")."""
    names = {x.strip() for x in text.split(",") if x.strip()}
    if not names or names - set(MODES):
        raise argparse.ArgumentTypeError(f"expected some of {','.join(MODES)}, got {text!r}")
    return tuple(m for m in MODES if m in names)


def lanes_arg(text: str) -> tuple[str, ...]:
    """``drop-in,core`` -> ("drop-in", "core"), in the table's order."""
    names = tuple(x.strip() for x in text.split(",") if x.strip())
    unknown = [x for x in names if x not in LANE_NAMES]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"expected some of {','.join(LANE_NAMES)}, got {text!r}")
    return tuple(x for x in LANE_NAMES if x in names)


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min) on {os.cpu_count()} CPUs"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = ap.add_mutually_exclusive_group()
    source.add_argument("--trace", help="an Azure-trace-shaped CSV")
    source.add_argument(
        "--synthetic",
        type=int,
        metavar="N",
        default=3000,
        help="N requests shaped like the conversation trace (the default: 3000)",
    )
    ap.add_argument("--seed", type=int, default=0, help="the synthetic trace's seed")
    ap.add_argument(
        "--rate-scale", type=float, default=1.0, help="multiply the arrival rate (2: twice)"
    )
    ap.add_argument("--step-ms", type=float, default=30.0, help="model time per step")
    ap.add_argument(
        "--modes",
        type=modes_arg,
        default=("sync", "async"),
        help="scheduling modes to replay, in turn (default: sync,async)",
    )
    ap.add_argument("--async-scheduling", action="store_true", help="async only (--modes async)")
    ap.add_argument("--max-steps", type=int, help="stop after N steps")
    ap.add_argument("--max-num-batched-tokens", type=int, default=8192)
    ap.add_argument("--num-blocks", type=int, help="KV-cache blocks (default: ample)")
    ap.add_argument("--twin", action="store_true", help="also time the (slow) Python twin")
    ap.add_argument(
        "--floor",
        action="store_true",
        help="also time the object floor: vLLM's objects built from its recorded ones "
        "(needs vLLM; a first, untimed pass records them)",
    )
    ap.add_argument(
        "--lanes",
        type=lanes_arg,
        help="run only these of vllm,drop-in,core (to profile one, e.g. under py-spy)",
    )
    ap.add_argument(
        "--buckets",
        type=buckets_arg,
        default=list(BUCKETS),
        help="running-request buckets' upper edges (default: 16,64,128,192,256)",
    )
    a = ap.parse_args()

    if a.trace:
        rows = read_trace(a.trace)
        what = f"trace {os.path.basename(a.trace)} ({len(rows):,} requests)"
    else:
        rows = synthetic_trace(a.synthetic, seed=a.seed)
        what = (
            f"synthetic conversation-shaped trace ({len(rows):,} requests, seed {a.seed}, "
            f"{CONV_RATE_PER_S} req/s before scaling)"
        )
    deploy = deployment(max_num_batched_tokens=a.max_num_batched_tokens, cache_blocks=a.num_blocks)
    modes = ("async",) if a.async_scheduling else a.modes
    has_vllm = importlib.util.find_spec("vllm") is not None
    if a.floor and not has_vllm:
        ap.error("--floor needs vLLM installed")
    versions = ""
    if has_vllm:
        import vllm

        versions = f", vLLM {vllm.__version__}"
    else:
        print("vLLM is not installed: the Python twin stands in for it", file=sys.stderr)
    print(
        f"{what}, arrival rate ×{a.rate_scale:g}, {a.step_ms:g} ms of model time per step; "
        f"block 16, max_model_len {deploy.max_model_len}, max_num_seqs {deploy.max_num_seqs}, "
        f"max_num_batched_tokens {deploy.max_num_batched_tokens}, {deploy.num_blocks:,} blocks, "
        f"prefix caching and chunked prefill on"
    )
    print(
        f"{platform.machine()}, {platform.processor() or platform.system()}, Python "
        f"{platform.python_version()}{versions}; {load()}"
    )
    results: dict[str, Replay] = {}
    for mode in modes:
        lanes = make_lanes(deploy, mode == "async", has_vllm, a.twin, a.lanes)
        if a.floor:
            from ironbatch.bench.vllm_floor import floor_lane, record

            print(f"{mode}: recording vLLM's objects for the floor", file=sys.stderr)
            recording = record(
                rows,
                deployment=deploy,
                async_scheduling=mode == "async",
                step_ms=a.step_ms,
                rate_scale=a.rate_scale,
                max_steps=a.max_steps,
            )
            lanes.append(floor_lane(recording))
        result = replay(
            lanes,
            rows,
            deployment=deploy,
            step_ms=a.step_ms,
            rate_scale=a.rate_scale,
            max_steps=a.max_steps,
            log=lambda s: print(s, file=sys.stderr),
        )
        results[mode] = result
        steps = len(result.scheduled)
        print()
        print(
            f"{mode} scheduling: {steps:,} steps, identical decisions in every one "
            f"({', '.join(x.name for x in lanes)}); {result.requests_added:,} requests added, "
            + ("all finished" if result.finished else f"stopped at step {steps:,}")
            + f", peak {max(result.scheduled, default=0)} scheduled in a step; "
            f"{result.wall_s:,.1f} s; after it: {load()}"
        )
        print(
            "µs per step of schedule() + update_from_output() (the previous step's under "
            "async), wall clock and thread CPU time, by requests scheduled in the step:"
        )
        print()
        print(bucket_table(result, a.buckets))
    print()
    print(
        f"Median wall-clock µs per step and each lane's speed-up on the first ({', '.join(modes)}):"
    )
    print()
    print(ratio_table(results, a.buckets))
    return 0


def make_lanes(
    deploy: Deployment,
    async_scheduling: bool,
    has_vllm: bool,
    twin: bool,
    only: tuple[str, ...] | None,
) -> list[Lane]:
    """vLLM's scheduler, the drop-in and the core (and the twin if asked);
    without vLLM, the twin stands in for it."""
    core = core_lane(deploy, backend="rust", async_scheduling=async_scheduling)
    if not has_vllm:
        return [core_lane(deploy, backend="python", async_scheduling=async_scheduling), core]
    lanes = [
        vllm_lane(deploy, kind="vllm", async_scheduling=async_scheduling),
        vllm_lane(deploy, kind="ironbatch", async_scheduling=async_scheduling),
        core,
    ]
    if twin:
        lanes.append(core_lane(deploy, backend="python", async_scheduling=async_scheduling))
    if only:
        lanes = [lane for lane, name in zip(lanes, LANE_NAMES, strict=False) if name in only]
    return lanes


if __name__ == "__main__":
    sys.exit(main())
