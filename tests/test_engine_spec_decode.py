"""N-gram speculative decoding in the engine: greedy outputs token-identical
to decoding without drafts (prefix caching on and off, chunked prompts,
preemption, the twin scheduler), stops inside an accepted run trimmed as
without drafts, penalties and min_tokens applied per verified position,
one logprobs entry per token, seeded sampling reproducible, rejection
sampling that keeps the target distribution, the proposer's lookup as
vLLM's, and bad settings refused. A tiny random-weight Llama, float32 on
the CPU."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("transformers", reason="the engine tests need transformers ('.[test]')")

import torch  # noqa: E402
from engine_models import build  # noqa: E402

from ironbatch import SamplingParams  # noqa: E402
from ironbatch.engine import LLM, LLMEngine  # noqa: E402
from ironbatch.engine.ngram_proposer import NgramProposer  # noqa: E402
from ironbatch.engine.spec_decoding_stats import SpecDecodingStats  # noqa: E402
from ironbatch.engine.speculative_config import SpeculativeConfig  # noqa: E402
from ironbatch.model.rejection_sampler import verify_row  # noqa: E402
from ironbatch.model.sampler import RowParams, sample_row  # noqa: E402

MAX_NEW = 24
# Prompts that repeat (so lookups find matches) and ones that do not.
REPEATING = [
    [5, 6, 7, 8, 9, 10, 11, 12] * 3,
    [20, 21, 22] * 6 + [20, 21],
    [40, 41, 42, 43, 44, 45] * 4 + [40],
]
OTHER = [list(range(60, 90)), [3, 99, 4, 98, 5], [7]]
PROMPTS = REPEATING + OTHER
CONFIGS: dict[str, dict[str, Any]] = {
    "ample": dict(num_blocks=256, max_num_seqs=8),
    "no-prefix-caching": dict(num_blocks=256, max_num_seqs=8, enable_prefix_caching=False),
    "chunked": dict(
        num_blocks=256, max_num_batched_tokens=8, max_num_seqs=4, long_prefill_token_threshold=5
    ),
    # 64-token sequences need 16 blocks of 4; 17 usable blocks cannot hold six.
    "tight-kv": dict(num_blocks=18, block_size=4, max_model_len=64, max_num_seqs=6),
    "twin": dict(num_blocks=256, max_num_seqs=8, block_size=4, scheduler_backend="python"),
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("llama")
    build("llama", path)
    return path


def spec(k: int, lookup_max: int = 3) -> dict[str, Any]:
    return {
        "method": "ngram",
        "num_speculative_tokens": k,
        "prompt_lookup_min": 1,
        "prompt_lookup_max": lookup_max,
    }


def generate(path: Path, prompts: list[list[int]], params: SamplingParams, **engine: Any):
    llm = LLM(str(path), dtype="float32", **engine)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return llm, [o.outputs[0] for o in outs]


GREEDY = SamplingParams(max_tokens=MAX_NEW, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def reference(model_dir: Path) -> list[list[int]]:
    """Greedy outputs without speculation."""
    _, outs = generate(model_dir, PROMPTS, GREEDY, **CONFIGS["ample"])
    return [o.token_ids for o in outs]


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("k", [1, 3, 5])
def test_greedy_outputs_equal_decoding_without_drafts(
    model_dir: Path, reference: list[list[int]], k: int, config: str
) -> None:
    llm, outs = generate(model_dir, PROMPTS, GREEDY, speculative_config=spec(k), **CONFIGS[config])
    assert [o.token_ids for o in outs] == reference
    stats = llm.llm_engine.spec_decoding_stats
    assert stats.num_drafts > 0 and stats.num_draft_tokens >= stats.num_drafts
    assert 0 < stats.num_accepted_tokens <= stats.num_draft_tokens
    assert sum(stats.num_accepted_tokens_per_pos) == stats.num_accepted_tokens
    assert len(stats.num_accepted_tokens_per_pos) == k
    assert stats.num_proposed_tokens >= stats.num_proposals > 0
    if config == "tight-kv":
        assert llm.llm_engine.num_preemptions > 0


def stream(engine: LLMEngine, prompt: list[int], params: SamplingParams) -> list[list[int]]:
    """One request stepped to the end: the tokens each step gave it."""
    engine.add_request("r", {"prompt_token_ids": prompt}, params)
    steps = []
    while engine.has_unfinished_requests():
        steps += [o.new_token_ids for o in engine.step()]
    return steps


@pytest.mark.parametrize("prompt", REPEATING)
def test_each_repeating_prompt_accepts_drafts_and_takes_fewer_steps(
    model_dir: Path, reference: list[list[int]], prompt: list[int]
) -> None:
    llm = LLM(str(model_dir), dtype="float32", num_blocks=256, speculative_config=spec(3))
    steps = stream(llm.llm_engine, prompt, GREEDY)
    assert sum(steps, []) == reference[PROMPTS.index(prompt)]
    accepted = llm.llm_engine.spec_decoding_stats.num_accepted_tokens
    assert accepted > 0
    # Each step gives 1 + its accepted drafts (max_tokens may trim the last).
    assert MAX_NEW - accepted <= len(steps) < MAX_NEW


def test_a_full_prefix_hit_padded_with_placeholder_drafts_decodes_alike(model_dir: Path) -> None:
    """A prompt of whole cached blocks plus one token is admitted with just
    that token to compute; while another request decodes, the scheduler pads
    it with placeholder drafts (-1), which the runner must reject."""
    other, hit = REPEATING[0], list(range(60, 77))  # 17 tokens: 4 blocks of 4 + 1

    def run(**settings: Any) -> tuple[dict[str, list[int]], list[int]]:
        llm = LLM(str(model_dir), dtype="float32", num_blocks=256, block_size=4, **settings)
        engine, drafts = llm.llm_engine, []
        execute = engine.runner.execute

        def recording(out: Any, eos: tuple[int, ...]) -> Any:
            drafts.extend(out.spec_token_ids.tolist())
            return execute(out, eos)

        engine.runner.execute = recording  # type: ignore[method-assign]
        engine.add_request("first", {"prompt_token_ids": hit}, GREEDY)
        engine.add_request("other", {"prompt_token_ids": other}, GREEDY)
        done: dict[str, list[int]] = {}
        steps = 0
        while engine.has_unfinished_requests():
            finished = [o for o in engine.step() if o.finished]
            done.update({o.request_id: o.outputs[0].token_ids for o in finished})
            steps += 1
            if steps == 4:  # "first" is cached and "other" decodes
                engine.add_request("again", {"prompt_token_ids": hit}, GREEDY)
        return done, drafts

    plain, _ = run()
    drafted, drafts = run(speculative_config=spec(3))
    assert drafted == plain and len(plain) == 3
    assert -1 in drafts


@pytest.fixture(scope="module")
def multi_token_steps(model_dir: Path) -> list[list[int]]:
    """The first repeating prompt's output, step by step, with drafts."""
    llm = LLM(str(model_dir), dtype="float32", num_blocks=256, speculative_config=spec(5))
    steps = stream(llm.llm_engine, REPEATING[0], GREEDY)
    assert any(len(s) >= 3 for s in steps)
    return steps


def inside_accepted_runs(steps: list[list[int]]) -> list[int]:
    """Output indices of tokens that a step emitted after an accepted draft
    (not as the step's first token), each the first occurrence of its token."""
    flat = sum(steps, [])
    starts = np.cumsum([0] + [len(s) for s in steps])
    inside = [i for s, n in zip(starts, map(len, steps), strict=False) for i in range(s + 1, s + n)]
    return [i for i in inside if flat.index(flat[i]) == i]


def both_ways(path: Path, prompt: list[int], params: SamplingParams, k: int = 5) -> tuple[Any, Any]:
    """The output without and with speculation."""
    _, plain = generate(path, [prompt], params, num_blocks=256)
    _, drafted = generate(path, [prompt], params, num_blocks=256, speculative_config=spec(k))
    return plain[0], drafted[0]


def same(a: Any, b: Any) -> None:
    assert (a.token_ids, a.finish_reason, a.stop_reason) == (
        b.token_ids,
        b.finish_reason,
        b.stop_reason,
    )


def test_max_tokens_and_stop_tokens_inside_an_accepted_run_trim_alike(
    model_dir: Path, multi_token_steps: list[list[int]]
) -> None:
    flat = sum(multi_token_steps, [])
    cuts = inside_accepted_runs(multi_token_steps)
    assert cuts
    for i in cuts[:3]:
        length = SamplingParams(max_tokens=i + 1, temperature=0.0, ignore_eos=True)
        plain, drafted = both_ways(model_dir, REPEATING[0], length)
        same(plain, drafted)
        assert drafted.token_ids == flat[: i + 1] and drafted.finish_reason == "length"
        stop = SamplingParams(
            max_tokens=MAX_NEW, temperature=0.0, ignore_eos=True, stop_token_ids=[flat[i]]
        )
        plain, drafted = both_ways(model_dir, REPEATING[0], stop)
        same(plain, drafted)
        assert drafted.token_ids == flat[: i + 1] and drafted.stop_reason == flat[i]


def with_eos(model_dir: Path, directory: Path, eos: int) -> Path:
    """A copy of the model whose EOS is ``eos``."""
    shutil.copytree(model_dir, directory)
    for name in ("config.json", "generation_config.json"):
        config = json.loads((directory / name).read_text())
        config["eos_token_id"] = eos
        (directory / name).write_text(json.dumps(config))
    return directory


def test_eos_inside_an_accepted_run_and_min_tokens_alike(
    model_dir: Path, multi_token_steps: list[list[int]], tmp_path: Path
) -> None:
    flat = sum(multi_token_steps, [])
    i = inside_accepted_runs(multi_token_steps)[0]
    path = with_eos(model_dir, tmp_path / "eos", flat[i])
    plain, drafted = both_ways(
        path, REPEATING[0], SamplingParams(max_tokens=MAX_NEW, temperature=0)
    )
    same(plain, drafted)
    assert drafted.token_ids == flat[: i + 1] and drafted.finish_reason == "stop"
    # min_tokens masks that EOS at each verified position it covers, so the
    # output goes elsewhere; with and without drafts alike.
    held = SamplingParams(max_tokens=MAX_NEW, temperature=0, min_tokens=i + 3)
    plain, drafted = both_ways(path, REPEATING[0], held)
    same(plain, drafted)
    assert drafted.token_ids[: i + 1] != flat[: i + 1]


def test_penalties_apply_per_verified_position(model_dir: Path) -> None:
    """The sampler path (not the argmax fast path): penalties see the drafts
    before each position, so greedy stays exact."""
    # Mild: strong penalties stop the random model from repeating itself,
    # and then no draft is ever accepted.
    params = SamplingParams(
        max_tokens=MAX_NEW,
        temperature=0.0,
        ignore_eos=True,
        repetition_penalty=1.02,
        frequency_penalty=0.02,
        presence_penalty=0.02,
    )
    _, plain = generate(model_dir, REPEATING, params, num_blocks=256)
    llm, drafted = generate(
        model_dir, REPEATING, params, num_blocks=256, speculative_config=spec(3)
    )
    assert [o.token_ids for o in drafted] == [o.token_ids for o in plain]
    assert llm.llm_engine.spec_decoding_stats.num_accepted_tokens > 0


def test_greedy_verification_equals_decoding_one_token_at_a_time() -> None:
    """Random logits and drafts through the full sampler: penalties and the
    min_tokens mask at each position see the drafts accepted before it."""
    vocab, eos = 6, 3
    gen = torch.Generator().manual_seed(0)
    rng = np.random.default_rng(0)
    params = SamplingParams(
        temperature=0.0,
        repetition_penalty=1.3,
        frequency_penalty=0.6,
        presence_penalty=0.3,
        min_tokens=4,
        stop_token_ids=[4],
    )
    accepted = 0
    for _ in range(300):
        d = int(rng.integers(0, 5))
        logits = torch.from_numpy(rng.normal(size=(d + 1, vocab)).astype(np.float32))
        drafts = rng.integers(0, vocab, size=d).tolist()
        row = RowParams(
            params=params,
            prompt=torch.tensor([1, 2]),
            output=torch.from_numpy(rng.integers(0, vocab, size=int(rng.integers(0, 4)))),
            eos_token_ids=(eos,),
        )
        want: list[int] = []
        for j in range(d + 1):  # one token at a time, each after the ones before
            now = RowParams(
                params,
                row.prompt,
                torch.cat([row.output, torch.tensor(want, dtype=torch.long)]),
                (eos,),
            )
            want.append(sample_row(logits[j].clone(), now, gen))
            if j == d or want[-1] != drafts[j]:
                break
        assert verify_row(logits, row, drafts, gen) == want
        accepted += len(want) - 1
    assert accepted > 50


def test_one_logprobs_entry_per_token(model_dir: Path) -> None:
    params = SamplingParams(max_tokens=MAX_NEW, temperature=0.0, ignore_eos=True, logprobs=2)
    _, plain = generate(model_dir, REPEATING, params, num_blocks=256)
    llm, drafted = generate(
        model_dir, REPEATING, params, num_blocks=256, speculative_config=spec(3)
    )
    assert llm.llm_engine.spec_decoding_stats.num_accepted_tokens > 0
    for a, b in zip(plain, drafted, strict=True):
        assert b.token_ids == a.token_ids and len(b.logprobs) == len(b.token_ids)
        for token, ea, eb in zip(b.token_ids, a.logprobs, b.logprobs, strict=True):
            assert token in eb and ea.keys() == eb.keys()
            assert np.allclose(list(ea.values()), list(eb.values()), atol=1e-4)
        assert b.cumulative_logprob == pytest.approx(a.cumulative_logprob, abs=1e-3)


def test_seeded_sampling_with_drafts_is_reproducible(model_dir: Path) -> None:
    # The random model's distributions are flat: top-k leaves drafts a chance.
    seeded = [
        SamplingParams(max_tokens=MAX_NEW, temperature=t, seed=s, ignore_eos=True, top_k=k)
        for t, s, k in ((0.8, 7, 2), (0.5, 11, 3), (1.0, None, 2))
    ]

    def run() -> tuple[list[list[int]], SpecDecodingStats]:
        llm = LLM(str(model_dir), dtype="float32", num_blocks=256, speculative_config=spec(3))
        outs = llm.generate([{"prompt_token_ids": p} for p in REPEATING], seeded, use_tqdm=False)
        return [o.outputs[0].token_ids for o in outs], llm.llm_engine.spec_decoding_stats

    first, stats = run()
    second, _ = run()
    assert first == second
    assert all(len(t) == MAX_NEW for t in first)
    assert stats.num_accepted_tokens > 0


def test_rejection_sampling_keeps_the_target_distribution() -> None:
    """Whatever the draft, the first emitted token is distributed as the
    target: p(d) accepted, else drawn from p without d."""
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0], [0.0] * 5])
    target = torch.softmax(logits[0], -1).numpy()
    row = RowParams(
        params=SamplingParams(temperature=1.0),
        prompt=torch.tensor([1]),
        output=torch.zeros(0, dtype=torch.long),
        eos_token_ids=(),
    )
    gen = torch.Generator().manual_seed(0)
    n = 6000
    for draft in (0, 3, -1):
        counts = np.bincount(
            [verify_row(logits, row, [draft], gen)[0] for _ in range(n)], minlength=5
        )
        assert np.abs(counts / n - target).max() < 0.025, (draft, counts / n, target)


@pytest.mark.parametrize(
    ("tokens", "lookup", "k", "max_model_len", "want"),
    [
        # The longest suffix that occurred earlier wins: [3, 4] (n=2) over [4].
        ([1, 4, 9, 3, 4, 7, 8, 3, 4], (1, 3), 3, 100, [7, 8, 3]),
        # Its first occurrence, not its latest.
        ([3, 4, 5, 3, 4, 6, 3, 4], (2, 2), 2, 100, [5, 3]),
        # Shorter than prompt_lookup_min: nothing.
        ([1, 4, 9, 3, 4, 7, 8, 3, 4], (3, 4), 3, 100, []),
        # No more drafts than max_model_len leaves room for.
        ([5, 6, 5, 6, 5, 6], (1, 2), 4, 8, [5, 6]),
        # Fewer tokens after the match than k.
        ([7, 7], (1, 3), 4, 100, [7]),
        ([1, 2, 3], (1, 3), 2, 100, []),
    ],
)
def test_the_proposer_looks_up_as_vllm(
    tokens: list[int], lookup: tuple[int, int], k: int, max_model_len: int, want: list[int]
) -> None:
    proposer = NgramProposer(
        num_speculative_tokens=k,
        prompt_lookup_min=lookup[0],
        prompt_lookup_max=lookup[1],
        max_model_len=max_model_len,
    )
    assert proposer.propose(np.array(tokens)).tolist() == want


def test_vllm_defaults_for_the_lookup_window() -> None:
    def config(k: int, lo: int, hi: int) -> SpeculativeConfig:
        return SpeculativeConfig(
            num_speculative_tokens=k, prompt_lookup_min=lo, prompt_lookup_max=hi
        )

    of = SpeculativeConfig.of
    assert of({"method": "ngram", "num_speculative_tokens": 2}) == config(2, 5, 5)
    assert of({"model": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3}) == (
        config(2, 3, 3)
    )
    assert of({"method": "[ngram]", "num_speculative_tokens": 2, "prompt_lookup_min": 2}) == (
        config(2, 2, 2)
    )
    assert of(None) is None


NGRAM = {"method": "ngram", "num_speculative_tokens": 2}


@pytest.mark.parametrize(
    ("config", "match"),
    [
        ({**NGRAM, "method": "eagle"}, "method must be 'ngram'"),
        ({"model": "some/draft-model", "num_speculative_tokens": 2}, "model must be 'ngram'"),
        ({"num_speculative_tokens": 2}, "needs method='ngram'"),
        ({"method": "ngram"}, "needs num_speculative_tokens"),
        ({**NGRAM, "num_speculative_tokens": 0}, "num_speculative_tokens must be >= 1, got 0"),
        ({**NGRAM, "prompt_lookup_min": 0}, "prompt_lookup_min must be >= 1, got 0"),
        ({**NGRAM, "prompt_lookup_max": -1}, "prompt_lookup_max must be >= 1, got -1"),
        (
            {**NGRAM, "prompt_lookup_min": 4, "prompt_lookup_max": 2},
            "prompt_lookup_min=4 must be <= prompt_lookup_max=2",
        ),
        ({**NGRAM, "draft_tp": 1}, "unsupported keys"),
    ],
)
def test_bad_speculative_configs_are_refused(
    model_dir: Path, config: dict[str, Any], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        LLM(str(model_dir), dtype="float32", num_blocks=64, speculative_config=config)


def test_generate_cli_takes_a_speculative_config(
    model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ironbatch.cli import main

    argv = ["generate", "--model", str(model_dir), "--prompt", "ids:5,6,7,5,6,7,5,6"]
    good = json.dumps({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 2})
    assert main([*argv, "--max-tokens", "4", "--speculative-config", good]) == 0
    assert "[length]" in capsys.readouterr().out
    assert main([*argv, "--speculative-config", "{not json"]) == 2
    assert "not valid JSON" in capsys.readouterr().err
