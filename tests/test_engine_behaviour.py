"""Engine behaviour beyond greedy parity: aborts mid-stream give their
blocks back, max_model_len ends a request as "length", priority order,
prefix caching and chunked prefill off, and EOS handling from the model's
generation config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from engine_models import build, hf_greedy  # noqa: E402

from ironbatch import SamplingParams  # noqa: E402
from ironbatch.engine import LLM, EngineArgs, LLMEngine  # noqa: E402

GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory):
    path = tmp_path_factory.mktemp("llama")
    return path, build("llama", path)


def engine(path: Path, **kw: object) -> LLMEngine:
    return LLMEngine(EngineArgs(model=str(path), dtype="float32", **kw))


def test_abort_mid_stream_frees_everything(model) -> None:
    path, _ = model
    e = engine(path, num_blocks=64)
    for i in range(3):
        e.add_request(f"r{i}", {"prompt_token_ids": [5 + i] * 30}, GREEDY)
    e.step()
    e.step()
    e.abort_request(["r1"])
    finished = []
    while e.has_unfinished_requests():
        finished += [o.request_id for o in e.step() if o.finished]
    assert sorted(finished) == ["r0", "r2"]
    assert e.scheduler.num_free_blocks == 63  # every block back (cached ones count as free)


def test_max_model_len_ends_as_length(model) -> None:
    path, hf = model
    prompt = list(range(3, 30))  # 27 tokens, max_model_len 32: 5 outputs fit
    out = LLM(str(path), dtype="float32", num_blocks=16, max_model_len=32).generate(
        [{"prompt_token_ids": prompt}],
        SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True),
        use_tqdm=False,
    )[0]
    c = out.outputs[0]
    assert (len(c.token_ids), c.finish_reason) == (5, "length")
    assert c.token_ids == hf_greedy(hf, prompt, 5)


@pytest.mark.parametrize(
    "flags", [{"enable_prefix_caching": False}, {"enable_chunked_prefill": False}]
)
def test_features_off_keep_parity(model, flags: dict) -> None:
    path, hf = model
    prompts = [[7] * 20, list(range(3, 45)), [9, 8, 7]]
    outs = LLM(str(path), dtype="float32", num_blocks=64, **flags).generate(
        [{"prompt_token_ids": p} for p in prompts], GREEDY, use_tqdm=False
    )
    assert [o.outputs[0].token_ids for o in outs] == [hf_greedy(hf, p, 8) for p in prompts]


def test_priority_policy_admits_the_urgent_request_first(model) -> None:
    path, _ = model
    e = engine(path, num_blocks=64, max_num_seqs=1, policy="priority")
    e.add_request("late", {"prompt_token_ids": [5] * 10}, GREEDY, arrival_time=1.0, priority=5)
    e.add_request("urgent", {"prompt_token_ids": [6] * 10}, GREEDY, arrival_time=2.0, priority=0)
    order = []
    while e.has_unfinished_requests():
        order += [o.request_id for o in e.step() if o.finished]
    assert order == ["urgent", "late"]


def test_eos_and_generation_config_eos_stop(model, tmp_path: Path) -> None:
    path, hf = model
    prompt = [11, 12, 13]
    ref = hf_greedy(hf, prompt, 8)
    first = ref[2]  # make the model's 3rd output token an EOS id
    for f in path.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, first]}))
    llm = LLM(str(tmp_path), dtype="float32", num_blocks=64)
    params = SamplingParams(max_tokens=8, temperature=0.0)
    c = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)[0].outputs[0]
    stop_at = ref.index(first) + 1  # the first time the model emits that id
    assert c.token_ids == ref[:stop_at] and c.finish_reason == "stop"
    assert c.stop_reason == first
    ignore = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    c = llm.generate([{"prompt_token_ids": prompt}], ignore, use_tqdm=False)[0].outputs[0]
    assert c.token_ids == ref and c.finish_reason == "length"


def test_cache_salt_isolates_prefix_hits(model) -> None:
    path, hf = model
    e = engine(path, num_blocks=64, block_size=4, max_model_len=128)
    prompt = list(range(3, 23))
    for rid, salt in (("a", "tenant-1"), ("b", "tenant-2"), ("c", "tenant-1")):
        e.add_request(rid, {"prompt_token_ids": prompt, "cache_salt": salt}, GREEDY)
        while e.has_unfinished_requests():
            outs = e.step()
        assert outs[-1].outputs[0].token_ids == hf_greedy(hf, prompt, 8)
    stats = e.scheduler.make_stats().prefix_cache_stats
    # b (another tenant) misses; only c, a's own tenant again, hits.
    assert stats.requests == 3 and stats.hits == 16


def test_malformed_prompts(model) -> None:
    path, _ = model
    e = engine(path, num_blocks=40)
    with pytest.raises(TypeError, match=r"prompt_token_ids\[1\]"):
        e.add_request("x", {"prompt_token_ids": [5, "six"]}, GREEDY)
    with pytest.raises(ValueError, match="needs 'prompt_token_ids'"):
        e.add_request("y", {"text": "hi"}, GREEDY)
    assert not e.has_unfinished_requests()


def test_kv_cache_sized_from_a_memory_budget(model) -> None:
    path, _ = model
    # 2 layers x 2 KV heads x head_dim 16 x 16 tokens x K and V x 4 bytes = 8 KiB a block.
    e = engine(path, kv_cache_memory_bytes=300 * 8192 + 100, block_size=16, max_model_len=256)
    assert e.num_blocks == 300
    assert e.scheduler.num_free_blocks == 299
    k = e.runner.attn.k_caches[0]
    # One block past the scheduler's: where padding rows of decode steps write.
    assert tuple(k.shape) == (301, 16, 2, 16) and len(e.runner.attn.k_caches) == 2
    with pytest.raises(ValueError, match="num_blocks"):  # too small for one max_model_len sequence
        engine(path, kv_cache_memory_bytes=10 * 8192, max_model_len=256)
