"""nano-vllm's benchmark workload on ironbatch: 256 sequences, prompt and
output lengths uniform in 100..1024, random token ids below 10,000,
temperature 0.6, ignore_eos, max_model_len 4096 (the draws of Python's
``random`` seeded with 0, in that benchmark's order, so the workload is the
one its published figures used), for random-weight bf16 models shaped like
Qwen3-0.6B and Llama-3.2-1B. Reports output tokens per second (the sum of
``max_tokens`` over the timed ``generate``) with CUDA graphs on and off
(``enforce_eager``), where the engine's step time went, and transformers'
``generate`` on the first sequences for reference. Prints a short table
last.

    python benches/gpu/nano_bench.py               # on the GPU
    python benches/gpu/nano_bench.py --dry-run     # CPU, toy sizes, seconds
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ironbatch import SamplingParams
from ironbatch.engine import LLM
from ironbatch.model.random_model import write_random_llama

sys.path.insert(0, str(Path(__file__).parent))
from shapes import LLAMA32_1B, QWEN3_06B, toy  # noqa: E402

MODELS = {"Qwen3-0.6B": QWEN3_06B, "Llama-3.2-1B": LLAMA32_1B}


@dataclass(frozen=True)
class Workload:
    prompts: list[list[int]]
    max_tokens: list[int]

    @property
    def output_tokens(self) -> int:
        return sum(self.max_tokens)


def nano_workload(
    num_seqs: int, lowest: int, longest: int, *, top_id: int = 10000, seed: int = 0
) -> Workload:
    """Prompts first (a length, then its token ids up to ``top_id``, per
    sequence), then the output lengths: the order in which nano-vllm's
    bench.py draws them."""
    rng = random.Random(seed)
    prompts = [
        [rng.randint(0, top_id) for _ in range(rng.randint(lowest, longest))]
        for _ in range(num_seqs)
    ]
    max_tokens = [rng.randint(lowest, longest) for _ in range(num_seqs)]
    return Workload(prompts, max_tokens)


@dataclass
class EngineRun:
    tokens_per_second: float
    seconds: float
    startup_seconds: float
    outputs: list[list[int]]
    breakdown: dict[str, float]


@dataclass
class ModelResult:
    name: str
    graphs_on: EngineRun
    graphs_off: EngineRun
    transformers_tokens_per_second: float


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def run_engine(path: str, work: Workload, *, enforce_eager: bool, dry: bool) -> EngineRun:
    start = time.perf_counter()
    llm = LLM(
        path,
        dtype="float32" if dry else "bfloat16",
        max_num_seqs=len(work.prompts),
        max_num_batched_tokens=16384,
        max_model_len=4096,
        enforce_eager=enforce_eager,
    )
    startup = time.perf_counter() - start
    # Compile the kernels for batches of 1, 2 and 16 sequences (Triton
    # specialises integer arguments equal to 1 and divisible by 16).
    for batch in () if dry else (1, 2, 16):
        llm.generate(
            [{"prompt_token_ids": [7] * 32} for _ in range(batch)],
            SamplingParams(max_tokens=3, temperature=0.6, ignore_eos=True),
            use_tqdm=False,
        )
    engine = llm.llm_engine
    for timings in (engine.timings, engine.runner.timings):
        for k in timings:
            timings[k] = 0.0
    engine.runner.sampler.wait_seconds = 0.0
    params = [
        SamplingParams(max_tokens=n, temperature=0.6, ignore_eos=True) for n in work.max_tokens
    ]
    sync()
    start = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p in work.prompts], params, use_tqdm=False)
    sync()
    seconds = time.perf_counter() - start
    e, r = engine.timings, engine.runner.timings
    breakdown = {
        "schedule": e["schedule"],
        "prepare": r["prepare"],
        "forward (launch/replay)": r["forward"],
        "sample (incl. wait)": r["sample"],
        "wait for the device": engine.runner.sampler.wait_seconds,
        "update": e["update"],
        "outputs": e["outputs"],
        "step": e["step"],
    }
    run = EngineRun(
        tokens_per_second=work.output_tokens / seconds,
        seconds=seconds,
        startup_seconds=startup,
        outputs=[o.outputs[0].token_ids for o in outs],
        breakdown=breakdown,
    )
    del llm, engine, outs
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return run


def run_transformers(path: str, work: Workload, *, count: int, new: int, dry: bool) -> float:
    """transformers' generate on the first ``count`` prompts (left-padded, one
    batch), ``new`` tokens each, sampling at temperature 0.6."""
    from transformers import AutoModelForCausalLM

    device = "cpu" if dry else "cuda"
    dtype = torch.float32 if dry else torch.bfloat16
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    prompts = work.prompts[:count]
    longest = max(map(len, prompts))
    ids = torch.zeros(len(prompts), longest, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, longest - len(p) :] = torch.tensor(p)
        mask[i, longest - len(p) :] = 1
    ids, mask = ids.to(device), mask.to(device)
    kwargs = dict(do_sample=True, temperature=0.6, top_k=0, pad_token_id=0, attention_mask=mask)
    with torch.no_grad():
        model.generate(ids[:2], max_new_tokens=2, **{**kwargs, "attention_mask": mask[:2]})
        sync()
        start = time.perf_counter()
        model.generate(ids, max_new_tokens=new, min_new_tokens=new, **kwargs)
        sync()
        seconds = time.perf_counter() - start
    del model
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return count * new / seconds


def agreement(a: list[list[int]], b: list[list[int]]) -> float:
    """Share of sequences whose first 16 tokens agree (sampling with the
    engine's generator: equal on the CPU; on the GPU bf16 rounding differs
    between padded and exact batch shapes, so draws part ways)."""
    return sum(x[:16] == y[:16] for x, y in zip(a, b, strict=True)) / len(a)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="CPU, toy models and sizes")
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated")
    ap.add_argument("--hf-seqs", type=int, default=32, help="sequences for transformers")
    ap.add_argument("--hf-new", type=int, default=256, help="new tokens for transformers")
    a = ap.parse_args()
    dry = a.dry_run
    if not dry and not torch.cuda.is_available():
        print("no CUDA device; use --dry-run", file=sys.stderr)
        return 2
    work = nano_workload(4, 8, 16, top_id=500) if dry else nano_workload(256, 100, 1024)
    print(
        f"workload: {len(work.prompts)} sequences, {sum(map(len, work.prompts))} prompt "
        f"tokens, {work.output_tokens} output tokens",
        flush=True,
    )
    rows = []
    for name in a.models.split(","):
        config = toy(MODELS[name]) if dry else MODELS[name]
        with tempfile.TemporaryDirectory() as tmp:
            start = time.perf_counter()
            write_random_llama(
                tmp,
                config=config,
                dtype=torch.float32 if dry else torch.bfloat16,
                device="cpu" if dry else "cuda",
            )
            print(f"{name}: weights written in {time.perf_counter() - start:.1f} s", flush=True)
            runs = {}
            for graphs in (True, False):
                run = run_engine(tmp, work, enforce_eager=not graphs, dry=dry)
                runs[graphs] = run
                share = 1 - run.breakdown["wait for the device"] / run.breakdown["step"]
                parts = ", ".join(f"{k} {v:.2f}" for k, v in run.breakdown.items())
                print(
                    f"{name} graphs {'on' if graphs else 'off'}: {run.tokens_per_second:,.0f} "
                    f"tok/s ({run.seconds:.2f} s, start-up {run.startup_seconds:.1f} s); "
                    f"seconds: {parts}; host share of the step {share:.0%}",
                    flush=True,
                )
            count, new = (2, 4) if dry else (a.hf_seqs, a.hf_new)
            hf = run_transformers(tmp, work, count=count, new=new, dry=dry)
            print(f"{name} transformers ({count} seqs x {new} tokens): {hf:,.0f} tok/s", flush=True)
        rows.append(ModelResult(name, runs[True], runs[False], hf))
    print("\n| model | graphs on tok/s | graphs off tok/s | on / off | transformers tok/s |")
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        on, off = r.graphs_on.tokens_per_second, r.graphs_off.tokens_per_second
        hf = r.transformers_tokens_per_second
        print(f"| {r.name} | {on:,.0f} | {off:,.0f} | {on / off:.2f}x | {hf:,.0f} |")
    agree = [f"{r.name} {agreement(r.graphs_on.outputs, r.graphs_off.outputs):.0%}" for r in rows]
    print("graphs on/off first-16-token agreement: " + ", ".join(agree))
    print("nano bench: done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
