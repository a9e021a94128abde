"""The sampler: masks and penalties against direct computations, and seeded
requests that reproduce whatever else is in the batch."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from ironbatch import SamplingParams  # noqa: E402
from ironbatch.model.sampler import (  # noqa: E402
    RowParams,
    apply_penalties,
    filter_top_k_top_p_min_p,
    mask_min_tokens,
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
