"""Greedy outputs token-identical to transformers' generate, for tiny Llama,
Qwen2 (qkv bias, tied embeddings) and Qwen3 (q/k norm) models, on a batch of
prompts of mixed lengths, under: ample KV; a KV cache so small that requests
are preempted; shared prefixes with prefix caching; a token budget so small
that prompts are chunked. float32 on the CPU."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="the parity tests need transformers ('.[test]')")

from engine_models import build, hf_greedy  # noqa: E402

from ironbatch import SamplingParams  # noqa: E402
from ironbatch.engine import LLM  # noqa: E402

MAX_NEW = 12
rng = random.Random(0)
SHARED = [rng.randrange(3, 150) for _ in range(24)]
PROMPTS = [[rng.randrange(3, 150) for _ in range(n)] for n in (3, 17, 40, 9, 31, 1)]
PREFIXED = [SHARED + [rng.randrange(3, 150) for _ in range(n)] for n in (1, 5, 12, 20)]


@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen3"])
def model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    path = tmp_path_factory.mktemp(request.param)
    hf = build(request.param, path)
    refs = {tuple(p): hf_greedy(hf, p, MAX_NEW) for p in PROMPTS + PREFIXED}
    return path, refs


def generate(path: Path, prompts: list[list[int]], **engine: object):
    llm = LLM(str(path), dtype="float32", **engine)
    params = SamplingParams(max_tokens=MAX_NEW, temperature=0.0, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return llm, [o.outputs[0].token_ids for o in outs]


def test_ample_kv(model) -> None:
    path, refs = model
    _, got = generate(path, PROMPTS, num_blocks=256, max_num_seqs=8)
    assert got == [refs[tuple(p)] for p in PROMPTS]


def test_tiny_kv_preempts(model) -> None:
    path, refs = model
    # 64-token sequences need 16 blocks of 4; 17 usable blocks cannot hold
    # six requests at once.
    llm, got = generate(
        path, PROMPTS, num_blocks=18, block_size=4, max_model_len=64, max_num_seqs=6
    )
    assert got == [refs[tuple(p)] for p in PROMPTS]
    assert llm.llm_engine.num_preemptions > 0


def test_shared_prefixes_hit_the_cache(model) -> None:
    path, refs = model
    llm, got = generate(path, PREFIXED, num_blocks=256, block_size=8, max_num_seqs=8)
    assert got == [refs[tuple(p)] for p in PREFIXED]
    stats = llm.llm_engine.scheduler.make_stats().prefix_cache_stats
    assert stats.hits >= 3 * len(SHARED)  # every request after the first hits the prefix


def test_small_budget_chunks_prompts(model) -> None:
    path, refs = model
    llm, got = generate(
        path,
        PROMPTS,
        num_blocks=256,
        max_num_batched_tokens=8,
        max_num_seqs=4,
        long_prefill_token_threshold=5,
    )
    assert got == [refs[tuple(p)] for p in PROMPTS]


def test_python_twin_scheduler_gives_the_same_tokens(model) -> None:
    path, refs = model
    _, got = generate(
        path,
        PROMPTS[:3],
        num_blocks=18,
        block_size=4,
        max_model_len=64,
        max_num_seqs=3,
        scheduler_backend="python",
    )
    assert got == [refs[tuple(p)] for p in PROMPTS[:3]]


def test_triton_backend_in_the_interpreter(model) -> None:
    pytest.importorskip("triton")
    path, refs = model
    prompts = PROMPTS[:2]
    _, got = generate(
        path,
        prompts,
        num_blocks=64,
        max_num_seqs=4,
        max_num_batched_tokens=16,
        attention_backend="triton",
    )
    assert got == [refs[tuple(p)] for p in prompts]


def test_triton_backend_on_the_cpu_needs_the_interpreter(model, monkeypatch) -> None:
    path, _ = model
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        LLM(str(path), dtype="float32", num_blocks=64, attention_backend="triton")


def test_min_tokens_masks_eos_even_with_ignore_eos(tmp_path: Path) -> None:
    """vLLM 0.33 masks the model's EOS during min_tokens whatever ignore_eos
    says; so does transformers' min_new_tokens. Make EOS the greedy first
    token, so the mask decides the output."""
    import json

    import torch

    hf = build("qwen3", tmp_path)
    prompt = PROMPTS[2]
    eos = hf_greedy(hf, prompt, 1)[0]
    for name in ("config.json", "generation_config.json"):
        config = json.loads((tmp_path / name).read_text())
        config["eos_token_id"] = eos
        (tmp_path / name).write_text(json.dumps(config))
    with torch.no_grad():
        want = hf.generate(
            torch.tensor([prompt]),
            min_new_tokens=4,
            max_new_tokens=4,
            eos_token_id=eos,
            do_sample=False,
            pad_token_id=0,
        )[0, len(prompt) :].tolist()
    assert eos not in want
    params = SamplingParams(max_tokens=4, min_tokens=4, ignore_eos=True, temperature=0.0)
    llm = LLM(str(tmp_path), dtype="float32", num_blocks=64)
    got = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
    assert got[0].outputs[0].token_ids == want
