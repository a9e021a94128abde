"""The sampler: masks and penalties against direct computations, and seeded
requests that reproduce whatever else is in the batch."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from ironbatch import SamplingParams  # noqa: E402
from ironbatch.model.sampler import (  # noqa: E402
    BatchParams,
    RowParams,
    apply_penalties,
    draw,
    filter_rows,
    filter_top_k_top_p_min_p,
    mask_min_tokens,
    sample_batch,
    sample_row,
    sample_rows,
)

LOGITS = torch.tensor([2.0, -1.0, 0.5, 3.0, 0.0, 1.5, -2.0, 1.0])


def kept(x: torch.Tensor) -> list[int]:
    return sorted(torch.nonzero(x > float("-inf")).flatten().tolist())


def test_top_k() -> None:
    # The three largest logits: 3.0 (3), 2.0 (0), 1.5 (5).
    assert kept(filter_top_k_top_p_min_p(LOGITS, 3, 1.0, 0.0)) == [0, 3, 5]
    assert kept(filter_top_k_top_p_min_p(LOGITS, 0, 1.0, 0.0)) == list(range(8))
    assert kept(filter_top_k_top_p_min_p(LOGITS, -1, 1.0, 0.0)) == list(range(8))


@pytest.mark.parametrize("top_p", [0.3, 0.5, 0.8, 0.95, 1.0])
def test_top_p_is_the_smallest_set_reaching_p(top_p: float) -> None:
    probs = LOGITS.softmax(-1).tolist()
    order = sorted(range(8), key=lambda i: -probs[i])
    want, total = [], 0.0
    for i in order:  # direct: take tokens by probability until the mass reaches top_p
        if total >= top_p:
            break
        want.append(i)
        total += probs[i]
    assert kept(filter_top_k_top_p_min_p(LOGITS, 0, top_p, 0.0)) == sorted(want)


@pytest.mark.parametrize("min_p", [0.05, 0.2, 0.5, 0.9])
def test_min_p(min_p: float) -> None:
    probs = LOGITS.softmax(-1)
    want = [i for i in range(8) if probs[i] >= min_p * probs.max()]
    assert kept(filter_top_k_top_p_min_p(LOGITS, 0, 1.0, min_p)) == want


def row(params: SamplingParams, prompt: list[int], output: list[int]) -> RowParams:
    return RowParams(params, torch.tensor(prompt), torch.tensor(output, dtype=torch.long), (2,))


def test_penalties_match_the_formulas() -> None:
    p = SamplingParams(repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.25)
    got = apply_penalties(LOGITS.clone(), row(p, prompt=[0, 1], output=[3, 3, 6]))
    want = LOGITS.clone().tolist()
    for t in {0, 1, 3, 6}:  # repetition: prompt and output tokens
        want[t] = want[t] / 1.3 if want[t] > 0 else want[t] * 1.3
    want[3] -= 0.25 * 2 + 0.5  # frequency x count + presence, output tokens only
    want[6] -= 0.25 * 1 + 0.5
    assert got.tolist() == pytest.approx(want)


def test_min_tokens_masks_eos_and_stop_tokens_until_reached() -> None:
    p = SamplingParams(min_tokens=3, stop_token_ids=[5])
    masked = mask_min_tokens(LOGITS.clone(), row(p, [1], [4, 4]))
    assert kept(masked) == [0, 1, 3, 4, 6, 7]  # 2 (EOS) and 5 (stop) gone
    assert kept(mask_min_tokens(LOGITS.clone(), row(p, [1], [4, 4, 4]))) == list(range(8))
    # vLLM 0.33 masks the model's EOS during min_tokens whatever ignore_eos
    # says: its all_stop_token_ids always hold it.
    ignore = SamplingParams(min_tokens=3, ignore_eos=True, stop_token_ids=[5])
    assert kept(mask_min_tokens(LOGITS.clone(), row(ignore, [1], []))) == [0, 1, 3, 4, 6, 7]
    assert kept(mask_min_tokens(LOGITS.clone(), row(ignore, [1], [4, 4, 4]))) == list(range(8))


def test_no_row_draws_from_non_finite_logits() -> None:
    gen = torch.Generator().manual_seed(0)
    hot = SamplingParams(temperature=0.01)
    # +inf logits share the probability; NaN never wins.
    logits = torch.tensor([[0.0, float("inf"), float("nan"), float("inf")]])
    for _ in range(20):
        assert sample_row(logits[0].clone(), row(hot, [0], []), gen) in (1, 3)
    assert sample_row(logits[0].clone(), row(SamplingParams(temperature=0.0), [0], []), gen) in (
        1,
        3,
    )
    # A repetition penalty near zero sends seen positive logits to +inf.
    tiny = SamplingParams(temperature=1.0, repetition_penalty=1e-45)
    assert sample_row(LOGITS.clone(), row(tiny, [3], []), gen) == 3
    # Nothing finite left: that row fails alone, the others are drawn.
    masked = SamplingParams(temperature=1.0, min_tokens=1, stop_token_ids=[0])
    two = torch.tensor([[0.0, float("nan")], [0.0, 1.0]])
    drawn = sample_rows(
        two,
        [
            RowParams(masked, torch.tensor([0]), torch.tensor([], dtype=torch.long), (1,)),
            row(SamplingParams(temperature=0.0), [0], []),
        ],
        gen,
    )
    assert drawn.tokens.tolist() == [-1, 1]
    assert list(drawn.errors) == [0] and "finite" in drawn.errors[0]


def test_seeded_requests_reproduce_regardless_of_batch(tmp_path) -> None:
    pytest.importorskip("transformers")
    from engine_models import build

    from ironbatch.engine import LLM

    build("llama", tmp_path)
    seeded = SamplingParams(max_tokens=10, temperature=0.9, top_p=0.95, seed=1234, ignore_eos=True)
    noise = SamplingParams(max_tokens=6, temperature=1.2, ignore_eos=True)
    prompt = {"prompt_token_ids": [5, 9, 11, 40, 3]}
    alone = (
        LLM(str(tmp_path), dtype="float32", num_blocks=64, seed=1)
        .generate([prompt], seeded, use_tqdm=False)[0]
        .outputs[0]
        .token_ids
    )
    crowd = (
        LLM(str(tmp_path), dtype="float32", num_blocks=64, seed=2)
        .generate(
            [{"prompt_token_ids": [7] * 9}, prompt, {"prompt_token_ids": [1, 2, 3]}],
            [noise, seeded, noise],
            use_tqdm=False,
        )[1]
        .outputs[0]
        .token_ids
    )
    assert alone == crowd
    other_seed = SamplingParams(
        max_tokens=10, temperature=0.9, top_p=0.95, seed=99, ignore_eos=True
    )
    differs = (
        LLM(str(tmp_path), dtype="float32", num_blocks=64)
        .generate([prompt], other_seed, use_tqdm=False)[0]
        .outputs[0]
        .token_ids
    )
    assert differs != alone  # the seed matters (a 1-in-160^10 coincidence otherwise)


def direct_kept(row: list[float], top_k: int, top_p: float, min_p: float) -> list[int]:
    """The tokens the filters keep, computed directly (no ties in ``row``)."""
    order = sorted(range(len(row)), key=lambda i: -row[i])
    keep = order[:top_k] if 0 < top_k < len(row) else order
    if top_p < 1.0:
        weights = [math.exp(row[i]) for i in keep]
        total, mass, kept = sum(weights), 0.0, []
        for i, w in zip(keep, weights, strict=True):
            if mass >= top_p:
                break
            kept.append(i)
            mass += w / total
        keep = kept
    if min_p > 0.0:
        weights = {i: math.exp(row[i]) for i in keep}
        top = max(weights.values())
        keep = [i for i in keep if weights[i] >= min_p * top]
    return sorted(keep)


def test_batched_filters_keep_each_rows_own_set() -> None:
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(7, 30, generator=g) * 2
    top_k = [0, 3, 10, 30, 45, 4, 0]
    top_p = [1.0, 1.0, 0.6, 0.9, 1.0, 0.5, 0.3]
    min_p = [0.0, 0.2, 0.0, 0.05, 0.0, 0.1, 0.0]
    got = filter_rows(
        logits.clone(),
        torch.tensor(top_k),
        torch.tensor(top_p),
        torch.tensor(min_p),
    )
    for r in range(7):
        want = direct_kept(logits[r].tolist(), top_k[r], top_p[r], min_p[r])
        assert kept(got[r]) == want, r


def test_draws_follow_the_distribution() -> None:
    probs = torch.tensor([0.5, 0.25, 0.15, 0.1, 0.0])
    gen = torch.Generator().manual_seed(0)
    tokens = draw(probs.expand(40000, -1).contiguous(), gen)
    freq = torch.bincount(tokens, minlength=5).float() / len(tokens)
    assert freq[4] == 0  # a zero-probability token is never drawn
    assert torch.allclose(freq, probs, atol=0.01), freq.tolist()


def batch_params(temperature: list[float], top_k: list[int], top_p: list[float]) -> BatchParams:
    return BatchParams(
        temperature=torch.tensor(temperature),
        top_k=torch.tensor(top_k),
        top_p=torch.tensor(top_p),
        min_p=torch.zeros(len(temperature)),
        all_greedy=all(t == 0.0 for t in temperature),
        any_greedy=any(t == 0.0 for t in temperature),
        use_top_k=any(k > 0 for k in top_k),
        use_top_p=any(p < 1.0 for p in top_p),
        use_min_p=False,
    )


def test_a_batch_fails_only_rows_without_a_finite_choice() -> None:
    gen = torch.Generator().manual_seed(1)
    nan, inf = float("nan"), float("inf")
    logits = torch.tensor(
        [
            [nan, nan, nan, nan],  # nothing to choose: -1
            [0.0, inf, nan, inf],  # +inf entries share; NaN never wins
            [0.0, inf, nan, inf],
            [1.0, 5.0, 2.0, -1.0],
            [float("-inf")] * 4,
        ]
    )
    params = batch_params([0.0, 0.0, 0.9, 0.0, 0.9], [0, 0, 0, 0, 0], [1.0, 1.0, 1.0, 0.5, 1.0])
    shared = set()
    for _ in range(40):
        tokens = sample_batch(logits, params, gen).tolist()
        assert tokens[0] == -1 and tokens[4] == -1
        assert tokens[1] == 1 and tokens[3] == 1  # greedy: the first of the +inf
        shared.add(tokens[2])
    assert shared == {1, 3}  # a draw: the +inf entries split it


def test_the_step_sampler_draws_alone_only_what_needs_it(monkeypatch) -> None:
    from ironbatch.model import sampler as sampler_module
    from ironbatch.model.step_sampler import StepSampler

    alone = []
    real = sampler_module.sample_row

    def counting(logits, row, gen):  # type: ignore[no-untyped-def]
        alone.append(row.params)
        return real(logits, row, gen)

    monkeypatch.setattr(sampler_module, "sample_row", counting)
    s = StepSampler(torch.device("cpu"), max_rows=8, seed=0)
    s.grow(8)
    kinds = [
        SamplingParams(temperature=0.0),  # plain
        SamplingParams(temperature=0.8, top_k=3),  # batched
        SamplingParams(temperature=0.8, repetition_penalty=1.2),  # alone: a penalty
        SamplingParams(temperature=0.0, logprobs=1),  # batched, with logprobs
        SamplingParams(temperature=0.7, seed=11),  # alone: its own generator
        SamplingParams(temperature=0.0, min_tokens=3),  # alone until 3 outputs
    ]
    for slot, params in enumerate(kinds):
        s.begin_request(slot, params)
    logits = torch.randn(6, 16, generator=torch.Generator().manual_seed(2))
    slots = np.arange(6)

    def rows(j: int) -> RowParams:
        return row(kinds[j], [1, 2], [4] * int(num_outputs[j]))

    num_outputs = np.array([5, 5, 5, 5, 5, 1])
    draws = s.sample(logits, slots, num_outputs, rows)
    assert [p for p in alone] == [kinds[2], kinds[4], kinds[5]]
    assert draws.logprobs is not None and draws.logprobs[0].tolist() == [3]
    assert torch.allclose(draws.logprobs[1], logits[3:4].log_softmax(-1))
    assert draws.tokens[0] == int(logits[0].argmax()) and not draws.errors
    alone.clear()
    num_outputs = np.array([5, 5, 5, 5, 5, 5])
    draws = s.sample(logits[[0, 1, 5]], np.array([0, 1, 5]), num_outputs[:3], rows)
    assert alone == [] and draws.logprobs is None  # min_tokens reached; nobody asked
    plain = s.sample(logits[[0, 5]], np.array([0, 5]), np.array([5, 5]), rows)
    assert plain.tokens.tolist() == logits[[0, 5]].argmax(-1).tolist()
