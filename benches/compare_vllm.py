"""Scheduler wall-clock time per step: ironbatch's Rust core, the vLLM drop-in
(``ironbatch.vllm.Scheduler``, the core behind vLLM's interface), the Python
twin and vLLM's own V1 Scheduler, on the same workloads, taking turns in one
run. The drop-in and vLLM take the same vLLM Requests and ModelRunnerOutputs
and both return vLLM's SchedulerOutput and EngineCoreOutputs; the drop-in's
time minus the core's is the cost of building those objects.

Run it in an environment that has both vLLM and ironbatch installed (the
README shows how):

    python benches/compare_vllm.py [--steps 100] [--turn 1] [--async-scheduling]
                                   [--workloads decode-256,...] [--no-twin]
                                   [--spec ngram | --layout LAYOUT | --lora | --vision | --pd]
    (LAYOUT: gpt-oss, qwen3-next, jamba, qwen3-next-align or jamba-align)
    python benches/compare_vllm.py --offload [--steps 100] [--async-scheduling]

``--offload`` times vLLM's CPU offloading connector under KV pressure on
the drop-in and vLLM only: the connector is vLLM's object, so the core
alone has nothing to run it with.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys

# One thread per math library: on a small machine, torch's and OpenBLAS's
# idle worker threads spin and steal the cores the schedulers are timed on.
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(var, "1")

from ironbatch.bench import WORKLOADS, IronbatchDriver, format_table, run  # noqa: E402
from ironbatch.bench.vllm_driver import VERSION, VllmDriver  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--workloads",
        default="decode-64,decode-256,decode-1024,mixed",
        help="also: json-64, json-256 (a third of the requests with a JSON schema), "
        "kv-events-64, kv-events-256 (KV-cache events published), ngram3-64, ngram3-256, "
        "ngram5-64, ngram5-256 (n-gram speculative decoding, k drafts a step), gpt-oss-64, "
        "gpt-oss-256 (a sliding-window group beside full attention, 4k-token contexts), "
        "lora-64, lora-256 (8 adapters, max_loras 4: half the requests run, half wait), "
        "vision-64, vision-256 (1 to 3 images a request, requests arriving and finishing), "
        "pd-decode-64, pd-decode-256 (a P/D decode instance: NIXL loads every prompt's KV)",
    )
    ap.add_argument(
        "--offload",
        action="store_true",
        help="time CPU offloading under KV pressure (offload-64, offload-256): the drop-in "
        "and vLLM only",
    )
    ap.add_argument(
        "--spec",
        choices=["ngram"],
        help="time the speculative workloads (k = 3 and 5, 64 and 256 running)",
    )
    ap.add_argument(
        "--layout",
        choices=["gpt-oss", "qwen3-next", "jamba", "qwen3-next-align", "jamba-align"],
        help="time a hybrid KV cache (gpt-oss: a 128-token window beside full attention; "
        "qwen3-next: three linear-attention groups beside it, jamba: one Mamba group, both "
        "with prefix caching off, or with -align on: vLLM's mamba_cache_mode 'align') at 64 "
        "and 256 running requests with 4k-token contexts",
    )
    ap.add_argument(
        "--lora",
        action="store_true",
        help="time LoRA (8 adapters, max_loras 4) at 64 and 256 running requests",
    )
    ap.add_argument(
        "--vision",
        action="store_true",
        help="time a vision model (1 to 3 images a request) at 64 and 256 running requests",
    )
    ap.add_argument(
        "--pd",
        action="store_true",
        help="time a P/D decode instance (NIXL, every prompt's KV loaded remotely) "
        "at 64 and 256 running requests",
    )
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--turn", type=int, default=1)
    ap.add_argument("--no-twin", action="store_true", help="skip the (slow) Python twin")
    ap.add_argument(
        "--async-scheduling",
        action="store_true",
        help="vLLM's default: each step is scheduled before the previous output arrives",
    )
    a = ap.parse_args()
    if a.spec:
        a.workloads = "decode-256,ngram3-64,ngram3-256,ngram5-64,ngram5-256"
    if a.layout:
        a.workloads = f"decode-256,{a.layout}-64,{a.layout}-256"
    if a.lora:
        a.workloads = "decode-256,lora-64,lora-256"
    if a.vision:
        a.workloads = "decode-256,vision-64,vision-256"
    if a.pd:
        a.workloads = "decode-256,pd-decode-64,pd-decode-256"
    if a.offload:
        a.workloads = "offload-64,offload-256"
    asy = a.async_scheduling
    drivers = [] if a.offload else [lambda w: IronbatchDriver(w, "rust", asy)]
    drivers.append(lambda w: VllmDriver(w, "ironbatch", asy))
    if not (a.no_twin or a.offload):
        drivers.append(lambda w: IronbatchDriver(w, "python", asy))
    drivers.append(lambda w: VllmDriver(w, "vllm", asy))
    rows = run(
        drivers,
        [WORKLOADS[w] for w in a.workloads.split(",")],
        steps=a.steps,
        turn=a.turn,
        log=lambda s: print(s, file=sys.stderr),
    )
    print(
        f"{platform.machine()}, Python {platform.python_version()}, vLLM {VERSION}; "
        f"{'async' if asy else 'sync'} scheduling; {a.steps} timed steps per workload, turns "
        f"of {a.turn} step(s); median wall-clock time of schedule() + update_from_output() per "
        f"step, Python boundary included"
    )
    print(format_table(rows))
    print()
    print("| workload | vLLM / drop-in | drop-in − core (µs/step): vLLM objects, Request state |")
    print("|---|---|---|")
    for r in rows:
        m = r["medians"]
        dropin, ref = m["drop-in"], m[f"vllm-{VERSION}"]
        core = m.get("ironbatch-rust")
        over = "—" if core is None else f"{(dropin - core) * 1e6:,.1f}"
        print(f"| {r['workload']} | {ref / dropin:,.1f}× | {over} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
