"""A scheduler without a KV cache, through the public API on both backends
(docs/scheduling.md §7.14, §4.18): an embedding model with encoder-only
attention (BERT and kin), whose admissions take no block and are bounded by
the token budget alone; and an encoder-only multimodal deployment (vLLM's
``--mm-encoder-only``), which samples nothing and ends each request once its
prompt is consumed."""

from __future__ import annotations

import numpy as np
import pytest

from ironbatch import CacheConfig, MultimodalInput, SchedulerConfig

from scheduler_helpers import BACKENDS, make, req

NO_GROUPS: tuple = ()


def bert(backend: str):  # type: ignore[no-untyped-def]
    return make(
        backend,
        num_blocks=1,
        caching=False,
        kv_cache_groups=NO_GROUPS,
        max_model_len=64,
        max_num_seqs=8,
        max_num_batched_tokens=64,
        enable_chunked_prefill=False,
        runner="pooling",
    )


def encoder_only(  # type: ignore[no-untyped-def]
    backend: str, *, chunked: bool = True, budget: int | None = None
):
    if budget is None:
        budget = 32 if chunked else 64
    return make(
        backend,
        num_blocks=1,
        caching=False,
        kv_cache_groups=NO_GROUPS,
        max_model_len=64,
        max_num_seqs=8,
        max_num_batched_tokens=budget,
        enable_chunked_prefill=chunked,
        runner="encoder_only",
        encoder_compute_budget=24,
        encoder_cache_size=48,
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_embedding_model_without_a_kv_cache_is_bounded_by_the_budget_alone(
    backend: str,
) -> None:
    s = bert(backend)
    for rid, n in (("a", 40), ("b", 20), ("c", 30), ("d", 64)):
        s.add_request(req(rid, range(3, 3 + n), max_tokens=1))
    seen = []
    while s.has_unfinished_requests():
        out = s.schedule()
        assert out.block_ids_per_group(0) == [] and out.slot_mapping.size == 0
        counts = out.num_scheduled_tokens.values()
        assert np.array_equal(out.positions, np.concatenate([np.arange(n) for n in counts]))
        assert s.make_stats().kv_cache_usage == 0.0 and s.num_free_blocks == 0
        seen.append(dict(out.num_scheduled_tokens))
        s.update_from_pooler_output(out, out.req_ids)
    assert seen == [{"a": 40, "b": 20}, {"c": 30}, {"d": 64}]


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_encoder_only_request_ends_once_its_prompt_is_consumed(backend: str) -> None:
    s = encoder_only(backend)
    s.add_request(req("img", [1] * 40, images=[MultimodalInput(4, 20, "x")]))
    s.add_request(req("text", [2] * 10))
    out = s.schedule()
    assert out.num_scheduled_tokens == {"img": 32}
    assert out.scheduled_encoder_inputs == {"img": [0]}
    assert s.update_from_output(out, {}).finished_req_ids == []
    out = s.schedule()
    assert out.num_scheduled_tokens == {"img": 8, "text": 10}
    updates = s.update_from_output(out, {})
    assert updates.finished_req_ids == ["img", "text"]
    assert [u.finish_reason for u in updates] == ["stop", "stop"]
    assert not s.has_unfinished_requests()


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_encoder_only_deployment_chunks_with_chunked_prefill_off(backend: str) -> None:
    s = encoder_only(backend, chunked=False)
    s.add_request(req("a", [1] * 40))
    s.add_request(req("b", [2] * 40))
    out = s.schedule()
    assert out.num_scheduled_tokens == {"a": 40, "b": 24}
    assert s.update_from_output(out, {}).finished_req_ids == ["a"]
    out = s.schedule()
    assert out.num_scheduled_tokens == {"b": 16}
    assert s.update_from_output(out, {}).finished_req_ids == ["b"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_encoder_only_runner_refuses_tokens_and_sessions_unchanged(backend: str) -> None:
    s = encoder_only(backend)
    s.add_request(req("a", [1] * 8))
    out = s.schedule()
    before = s.debug_state()
    with pytest.raises(ValueError, match="encoder-only runner samples no tokens"):
        s.update_from_output(out, {"a": [5]})
    with pytest.raises(ValueError, match="runner 'encoder_only' takes no streaming sessions"):
        s.add_request(req("s", [1] * 8, resumable=True))
    assert s.debug_state() == before
    assert s.update_from_output(out, {}).finished_req_ids == ["a"]


def test_bad_setups_name_the_field() -> None:
    with pytest.raises(
        ValueError, match="kv_cache_groups is empty .*enable_prefix_caching must be false"
    ):
        CacheConfig(num_blocks=1, kv_cache_groups=NO_GROUPS)
    with pytest.raises(ValueError, match="num_blocks must be in"):
        CacheConfig(num_blocks=1, enable_prefix_caching=False)  # one group needs a block
    with pytest.raises(ValueError, match="runner 'encoder_only' runs a multimodal encoder"):
        SchedulerConfig(max_model_len=64, runner="encoder_only")
    with pytest.raises(ValueError, match=r"must be 0 for runner 'encoder_only'"):
        SchedulerConfig(
            max_model_len=64,
            runner="encoder_only",
            num_speculative_tokens=1,
            encoder_compute_budget=8,
            encoder_cache_size=8,
        )


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_encoder_only_budget_may_be_below_max_model_len_without_chunking(
    backend: str,
) -> None:
    """vLLM's engine turns chunked prefill off for a model without a KV cache
    after its config check, so an encoder-only deployment runs unchunked with
    a budget below max_model_len; its prompts are cut to the budget anyway."""
    s = encoder_only(backend, chunked=False, budget=16)
    s.add_request(req("a", [1] * 40))
    seen = []
    while s.has_unfinished_requests():
        out = s.schedule()
        seen.append(out.num_scheduled_tokens["a"])
        s.update_from_output(out, {})
    assert seen == [16, 16, 8]
    with pytest.raises(ValueError, match=r"must be >= max_model_len \(64\) when chunked prefill"):
        SchedulerConfig(
            max_model_len=64,
            max_num_seqs=4,
            max_num_batched_tokens=16,
            enable_chunked_prefill=False,
        )
