"""The recorder's random drafts and verdicts (benches/record_vllm.py --spec)
stay inside what vLLM's scheduler accepts: at most k drafts of token ids, and
an accepted prefix that never takes a placeholder; a seed draws the same."""

from __future__ import annotations

import random

from ironbatch.bench.random_speculation import PLACEHOLDER, RandomSpeculation


def speculation(seed: int, k: int) -> RandomSpeculation:
    return RandomSpeculation(
        num_speculative_tokens=k, rng=random.Random(seed), eos_token_id=2, vocab_size=256
    )


def test_drafts_are_at_most_k_token_ids_with_some_stops() -> None:
    spec = speculation(seed=1, k=4)
    drawn = [spec.drafts(history=list(range(3, 40)), stop_token_ids=[7]) for _ in range(2000)]
    assert {len(d) for d in drawn} == {0, 1, 2, 3, 4}
    tokens = [t for d in drawn for t in d]
    assert all(0 <= t < 256 for t in tokens)
    assert 2 in tokens and 7 in tokens  # EOS and the stop token both turn up
    assert any(d and d[0] >= 3 and d == list(range(d[0], d[0] + len(d))) for d in drawn)


def test_acceptance_is_a_prefix_without_placeholders() -> None:
    spec = speculation(seed=2, k=3)
    counts = [spec.num_accepted([10, 11, 12]) for _ in range(1000)]
    assert set(counts) == {0, 1, 2, 3}
    assert all(spec.num_accepted([PLACEHOLDER] * 3) == 0 for _ in range(100))
    assert spec.num_accepted([]) == 0


def test_a_seed_draws_the_same() -> None:
    a, b = speculation(seed=3, k=5), speculation(seed=3, k=5)
    for _ in range(50):
        assert a.drafts(history=[5, 6, 7], stop_token_ids=[]) == b.drafts(
            history=[5, 6, 7], stop_token_ids=[]
        )
        assert a.num_accepted([1, 2, 3]) == b.num_accepted([1, 2, 3])
