"""'ironbatch demo': continuous batching on a small random-weight Llama.

A few hundred requests that share system prompts go through the Rust
scheduler on a deliberately tight KV cache (so requests are preempted and
prefixes are reused), with a progress bar on a terminal; first a few lines
saying what runs, at the end a summary table."""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import numpy as np

from ironbatch.cli.options import integer, progress
from ironbatch.sampling_params import SamplingParams

RANDOM = "random"
BLOCK_SIZE = 16
MAX_MODEL_LEN = 512
MAX_NUM_BATCHED_TOKENS = 1024
DEFAULT_NUM_BLOCKS = 200
# A request is a system prompt (64-128 tokens), a user turn (8-64) and
# 16-64 output tokens: at most 256 tokens, 16 blocks.
MAX_REQUEST_BLOCKS = (128 + 64 + 64) // BLOCK_SIZE
# The fewest blocks the engine starts with: one max_model_len sequence, and
# the null block. More than the most requests that can run at once hold at
# their longest is never used.
MIN_NUM_BLOCKS = MAX_MODEL_LEN // BLOCK_SIZE + 1
MAX_DEMO_BLOCKS = MAX_NUM_BATCHED_TOKENS * MAX_REQUEST_BLOCKS + 1
SEED_MAX = 2**63 - 1


def add_parser(sub: argparse._SubParsersAction) -> None:
    d = sub.add_parser(
        "demo",
        help="continuous batching on a small random-weight Llama",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    d.add_argument(
        "--model",
        default=RANDOM,
        help="a local Hugging Face model directory, or 'random': a 4-layer Llama with random "
        "weights, written to a temporary folder (default: random)",
    )
    d.add_argument(
        "--requests", type=integer(1, 1_000_000), default=300, help="requests to run (default 300)"
    )
    d.add_argument(
        "--max-num-seqs",
        type=integer(1, MAX_NUM_BATCHED_TOKENS),
        default=64,
        help=f"requests running at once (default 64; at most {MAX_NUM_BATCHED_TOKENS}, "
        "the demo's tokens per step)",
    )
    d.add_argument(
        "--num-blocks",
        type=integer(MIN_NUM_BLOCKS, MAX_DEMO_BLOCKS),
        default=DEFAULT_NUM_BLOCKS,
        help=f"KV-cache blocks of {BLOCK_SIZE} tokens, the null block included (default: a "
        f"tight {DEFAULT_NUM_BLOCKS}, so requests are preempted; at least {MIN_NUM_BLOCKS}, one "
        f"{MAX_MODEL_LEN}-token sequence; max_num_seqs x {MAX_REQUEST_BLOCKS} + 1 holds every "
        "running request at its longest)",
    )
    d.add_argument(
        "--seed",
        type=integer(0, SEED_MAX),
        default=0,
        help="seeds the random weights, the prompts and the sampling (default 0)",
    )


def demo_main(args: argparse.Namespace) -> int:
    model = check_model_dir(args.model)
    summary = run_demo(
        model, args.requests, args.max_num_seqs, args.num_blocks, args.seed, on_start=print
    )
    print(format_summary(summary))
    return 0


def check_model_dir(text: str) -> str | None:
    """``--model``: None for 'random', else a folder (checked before the
    engine loads anything)."""
    if text == RANDOM:
        return None
    path = Path(text)
    if path.is_file():
        raise ValueError(
            f"--model {text!r} is a file, not a model directory (a folder with config.json "
            "and *.safetensors), or 'random'"
        )
    if not path.is_dir():
        raise ValueError(f"--model {text!r} does not exist; give a model directory or 'random'")
    return text


@contextmanager
def model_directory(model: str | None, seed: int) -> Iterator[str]:
    """``model``, or for None the random-weight Llama written to a temporary
    folder for the duration."""
    if model is not None:
        yield model
        return
    from ironbatch.model.random_model import write_random_llama

    with tempfile.TemporaryDirectory(prefix="ironbatch-demo-") as tmp:
        yield str(write_random_llama(tmp, seed=seed))


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def run_demo(
    model: str | None,
    num_requests: int,
    max_num_seqs: int,
    num_blocks: int | None,
    seed: int,
    quiet: bool = False,
    on_start: Callable[[str], Any] | None = None,
) -> dict[str, Any]:
    """The demo's summary; ``on_start`` gets the lines saying what runs,
    once the engine is built."""
    from ironbatch.engine import EngineArgs, LLMEngine

    num_blocks = DEFAULT_NUM_BLOCKS if num_blocks is None else num_blocks
    with model_directory(model, seed) as path:
        engine = LLMEngine(
            EngineArgs(
                model=path,
                dtype="float32",
                block_size=BLOCK_SIZE,
                num_blocks=num_blocks,
                max_num_seqs=max_num_seqs,
                max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
                max_model_len=MAX_MODEL_LEN,
                seed=seed,
            )
        )
        if on_start is not None:
            on_start(describe(engine, model, num_requests, max_num_seqs))
        finished, peak_usage, elapsed = _run(engine, num_requests, seed, quiet)
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


def _run(engine: Any, num_requests: int, seed: int, quiet: bool) -> tuple[list[Any], float, float]:
    """The requests through the engine: the finished outputs, the peak KV
    usage and the seconds it took."""
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
            seed=(seed * 100003 + i) % 2**63,  # an int64, whatever --seed
            ignore_eos=True,
        )
        engine.add_request(f"demo-{i}", {"prompt_token_ids": rng.choice(systems) + user}, params)
    finished = []
    peak_usage = 0.0
    start = time.time()
    with nullcontext(None) if quiet else progress(num_requests, "demo") as bar:
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    finished.append(out)
                    if bar is not None:
                        bar.update(1)
            used = 1 - engine.scheduler.num_free_blocks / (engine.num_blocks - 1)
            peak_usage = max(peak_usage, used)
    return finished, peak_usage, time.time() - start


def describe(engine: Any, model: str | None, num_requests: int, max_num_seqs: int) -> str:
    """What the demo runs: the model's shape, the settings, and why the KV
    cache is as small as it is."""
    c = engine.model_config
    name = "a random-weight Llama" if model is None else repr(model)
    blocks = engine.num_blocks
    loose = max_num_seqs * MAX_REQUEST_BLOCKS + 1
    lines = [
        f"model: {name}: {c.num_layers} layers, hidden size {c.hidden_size:,}, "
        f"{c.num_heads} attention heads ({c.num_kv_heads} KV), vocabulary {c.vocab_size:,}; "
        f"float32 on {engine.device}",
        f"settings: {num_requests:,} requests (4 shared system prompts), max_num_seqs "
        f"{max_num_seqs}, num_blocks {blocks:,} of {BLOCK_SIZE} tokens, max_model_len "
        f"{MAX_MODEL_LEN}",
    ]
    if blocks < loose:
        lines.append(
            f"The KV cache is deliberately tight ({blocks - 1:,} usable blocks for up to "
            f"{max_num_seqs} requests of up to {MAX_REQUEST_BLOCKS} blocks), so requests are "
            f"preempted and recomputed; --num-blocks {loose:,} holds them all."
        )
    else:
        lines.append(
            f"The KV cache holds {max_num_seqs} requests at their longest: no preemptions."
        )
    return "\n".join(lines)


def format_summary(summary: dict[str, Any]) -> str:
    lines = ["| metric | value |", "|---|---:|"]
    for k, v in summary.items():
        if isinstance(v, float):
            cell = f"{v:.1%}" if k in ("prefix-cache hit rate", "peak KV usage") else f"{v:,.3f}"
        else:
            cell = f"{v:,}"
        lines.append(f"| {k} | {cell} |")
    return "\n".join(lines)
