"""Offline throughput on the GPU: a Qwen3-0.6B-shaped random-weight model in
bf16, 256 requests of 512 prompt tokens and 256 new tokens (ignore_eos),
through ironbatch (Triton attention) and through transformers' generate on
the same prompts; plus where ironbatch's step time goes.

    python benches/gpu/engine_bench.py               # on the GPU
    python benches/gpu/engine_bench.py --dry-run     # CPU, toy sizes
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time

import torch

from ironbatch import SamplingParams
from ironbatch.engine import LLM
from ironbatch.model.random_model import write_random_llama

QWEN3_06B = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "vocab_size": 151936,
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
    "tie_word_embeddings": True,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "dtype": "bfloat16",
}
TOY = {
    **QWEN3_06B,
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "dtype": "float32",
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true")
    a = ap.parse_args()
    dry = a.dry_run
    n, prompt_len, new = (8, 32, 8) if dry else (256, 512, 256)
    config = TOY if dry else QWEN3_06B
    dtype = torch.float32 if dry else torch.bfloat16
    rng = random.Random(0)
    prompts = [
        [rng.randrange(10, config["vocab_size"] - 10) for _ in range(prompt_len)] for _ in range(n)
    ]
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        t = time.time()
        write_random_llama(tmp, config=config, dtype=dtype)
        print(f"model written in {time.time() - t:.1f} s", flush=True)
        llm = LLM(
            tmp,
            dtype="float32" if dry else "bfloat16",
            max_num_seqs=n,
            max_num_batched_tokens=8192,
            max_model_len=prompt_len + new + 16,
            attention_backend="torch" if dry else "triton",
        )
        params = SamplingParams(max_tokens=new, temperature=0.0, ignore_eos=True)
        llm.generate(
            [{"prompt_token_ids": p} for p in prompts[:2]],  # compile the kernels
            SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True),
            use_tqdm=False,
        )
        engine = llm.llm_engine
        engine.runner.sync_for_timings = True  # "forward" is device time here
        for timings in (engine.timings, engine.runner.timings):
            for k in timings:
                timings[k] = 0.0
        sync()
        t = time.time()
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        sync()
        elapsed = time.time() - t
        tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        rows["ironbatch"] = tokens / elapsed
        e, r = engine.timings, engine.runner.timings
        print(
            f"ironbatch: {tokens} tokens in {elapsed:.2f} s = {tokens / elapsed:,.0f} tok/s; "
            f"step {e['step']:.2f} s: forward {r['forward']:.2f}, prepare {r['prepare']:.2f}, "
            f"sample {r['sample']:.2f}, schedule {e['schedule']:.2f}, update "
            f"{e['update']:.2f}, outputs {e['outputs']:.2f}",
            flush=True,
        )
        outside = (e["step"] - r["forward"]) / e["step"]
        del llm, engine
        torch.cuda.empty_cache() if torch.cuda.is_available() else None
        hf_tps, match = transformers_generate(tmp, prompts, new, dtype, outs, dry)
        rows["transformers"] = hf_tps
    print("\n| engine | output tokens/s |")
    print("|---|---:|")
    for k, v in rows.items():
        print(f"| {k} | {v:,.0f} |")
    print(
        f"ironbatch / transformers: {rows['ironbatch'] / rows['transformers']:.1f}x; "
        f"ironbatch step time outside the model forward: {outside:.1%}; "
        f"greedy first-8-token agreement with transformers: {match:.0%}"
    )
    return 0


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def transformers_generate(
    path: str, prompts: list[list[int]], new: int, dtype: torch.dtype, ours: list, dry: bool
) -> tuple[float, float]:
    from transformers import AutoModelForCausalLM

    device = "cpu" if dry else "cuda"
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    ids = torch.tensor(prompts, device=device)
    with torch.no_grad():
        model.generate(ids[:2], max_new_tokens=2, do_sample=False, pad_token_id=0)  # warm up
        sync()
        t = time.time()
        out = model.generate(
            ids, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0
        )
        sync()
        elapsed = time.time() - t
    gen = out[:, ids.shape[1] :].tolist()
    tokens = sum(len(g) for g in gen)
    print(
        f"transformers: {tokens} tokens in {elapsed:.2f} s = {tokens / elapsed:,.0f} tok/s",
        flush=True,
    )
    agree = sum(g[:8] == o.outputs[0].token_ids[:8] for g, o in zip(gen, ours, strict=True))
    return tokens / elapsed, agree / len(gen)


if __name__ == "__main__":
    sys.exit(main())
