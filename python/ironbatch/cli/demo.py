"""``ironbatch demo``: continuous batching on a small random-weight Llama.

A few hundred requests that share system prompts go through the Rust
scheduler on a deliberately tight KV cache (so requests are preempted and
prefixes are reused), with a progress bar, and a summary table at the end."""

from __future__ import annotations

import random
import tempfile
import time
from typing import Any

import numpy as np

from ironbatch.sampling_params import SamplingParams


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def run_demo(
    model: str | None,
    num_requests: int,
    max_num_seqs: int,
    num_blocks: int | None,
    seed: int,
    quiet: bool = False,
) -> dict[str, Any]:
    from tqdm.auto import tqdm

    from ironbatch.engine import EngineArgs, LLMEngine
    from ironbatch.model.random_model import write_random_llama

    tmp = None
    if model is None:
        tmp = tempfile.TemporaryDirectory(prefix="ironbatch-demo-")
        model = str(write_random_llama(tmp.name, seed=seed))
    engine = LLMEngine(
        EngineArgs(
            model=model,
            dtype="float32",
            block_size=16,
            num_blocks=num_blocks or 200,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=1024,
            max_model_len=512,
            seed=seed,
        )
    )
    vocab = engine.model_config.vocab_size
    rng = random.Random(seed)
    systems = [
        [rng.randrange(3, vocab) for _ in range(rng.choice([64, 96, 128]))] for _ in range(4)
    ]
    for i in range(num_requests):
        user = [rng.randrange(3, vocab) for _ in range(rng.randint(8, 64))]
        params = SamplingParams(
            max_tokens=rng.randint(16, 64),
            temperature=0.8,
            top_p=0.95,
            seed=seed * 100003 + i,
            ignore_eos=True,
        )
        engine.add_request(f"demo-{i}", {"prompt_token_ids": rng.choice(systems) + user}, params)
    finished = []
    peak_usage = 0.0
    start = time.time()
    with tqdm(total=num_requests, desc="demo", disable=quiet, dynamic_ncols=True) as bar:
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    finished.append(out)
                    bar.update(1)
            used = 1 - engine.scheduler.num_free_blocks / (engine.num_blocks - 1)
            peak_usage = max(peak_usage, used)
    elapsed = time.time() - start
    stats = engine.scheduler.make_stats().prefix_cache_stats
    ttft = [o.metrics.first_token_time - o.metrics.arrival_time for o in finished]
    tpot = [
        (o.metrics.finished_time - o.metrics.first_token_time) / (len(o.outputs[0].token_ids) - 1)
        for o in finished
        if len(o.outputs[0].token_ids) > 1
    ]
    out_tokens = sum(len(o.outputs[0].token_ids) for o in finished)
    queries = stats.queries + stats.preempted_queries
    hits = stats.hits + stats.preempted_hits
    if tmp is not None:
        tmp.cleanup()
    return {
        "requests": len(finished),
        "seconds": elapsed,
        "requests/s": len(finished) / elapsed,
        "output tokens/s": out_tokens / elapsed,
        "TTFT p50 (s)": percentile(ttft, 50),
        "TTFT p99 (s)": percentile(ttft, 99),
        "TPOT p50 (ms)": percentile(tpot, 50) * 1e3,
        "TPOT p99 (ms)": percentile(tpot, 99) * 1e3,
        "preemptions": engine.num_preemptions,
        "prefix-cache hit rate": hits / queries if queries else 0.0,
        "peak KV usage": peak_usage,
        "KV blocks": engine.num_blocks,
    }


def format_summary(summary: dict[str, Any]) -> str:
    lines = ["| metric | value |", "|---|---:|"]
    for k, v in summary.items():
        if isinstance(v, float):
            cell = f"{v:.1%}" if k in ("prefix-cache hit rate", "peak KV usage") else f"{v:,.3f}"
        else:
            cell = f"{v:,}"
        lines.append(f"| {k} | {cell} |")
    return "\n".join(lines)
