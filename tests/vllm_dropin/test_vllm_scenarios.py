"""Scheduler scenarios from vLLM's own scheduler unit tests, restated for the
drop-in: every test runs against vLLM 0.33.0's scheduler ("vllm") and against
``ironbatch.vllm.Scheduler`` ("ironbatch"), built the way EngineCore builds
them (see ``vllm_setup``).

The expected values are derived from vLLM's scheduling rules, not recorded
from a run; each carries a short reason. Facts the block ids rely on:

* block 0 is the null block, so a fresh pool hands out blocks 1, 2, 3, ... in
  order, and a request needs ``ceil(num_tokens / block_size)`` blocks for the
  tokens it computes this step;
* a request frees its blocks tail first; freed blocks that carry a prefix-cache
  hash go to the back of the free queue (LRU), blocks without one go to the
  front (reused first);
* a prefix-cache hit covers whole blocks and never the last prompt token, whose
  logits the model must produce.

Only the public scheduler surface is used: ``add_request``, ``schedule``,
``update_from_output``, ``finish_requests``, ``reset_prefix_cache``,
``make_stats``, ``get_request_counts``, ``get_num_unfinished_requests`` and
``has_finished_requests``, plus the outputs they return.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import NamedTuple

import pytest

pytest.importorskip("vllm")


from vllm.v1.core.sched.output import SchedulerOutput  # noqa: E402
from vllm.v1.engine import FinishReason  # noqa: E402
from vllm.v1.metrics.stats import PrefixCacheStats, SchedulerStats  # noqa: E402
from vllm.v1.request import RequestStatus  # noqa: E402

import fake_grammar  # noqa: E402
import vllm_setup  # noqa: E402
from scenario_helpers import (  # noqa: E402
    by_req,
    new_data,
    new_ids,
    one_token_each,
    pipeline,
    req,
    stats_of,
    structured,
    sync_and_async,
    update,
)

EOS = vllm_setup.EOS
BS = vllm_setup.DEFAULTS["block_size"]
ABORTED = RequestStatus.FINISHED_ABORTED

BlockIds = tuple[list[int], ...]


# --------------------------------------------------------------------------- fixtures


# --------------------------------------------------------------------------- helpers


@functools.cache
def _v2_runner() -> bool:
    """Whether EngineCore would pair the scheduler with model runner V2.

    It decides how a resumed request is sent: V2 gets it as a NewRequestData
    carrying all its tokens, V1 as a cached request in ``resumed_req_ids``."""
    vllm_cfg, _ = vllm_setup.vllm_config(None)
    return bool(vllm_cfg.use_v2_model_runner)


def _prompt(n: int, base: int) -> list[int]:
    """``n`` distinct token ids from ``base`` (far from EOS and stop ids)."""
    return list(range(base, base + n))


def _prefix(stats: SchedulerStats) -> tuple[int, int, int]:
    pcs: PrefixCacheStats = stats.prefix_cache_stats
    return pcs.requests, pcs.queries, pcs.hits


def _preempted_prefix(stats: SchedulerStats) -> tuple[int, int, int]:
    pcs: PrefixCacheStats = stats.prefix_cache_stats
    return pcs.preempted_requests, pcs.preempted_queries, pcs.preempted_hits


class Cached(NamedTuple):
    """One request's row in ``scheduled_cached_reqs``."""

    num_computed_tokens: int
    new_block_ids: BlockIds | None
    num_output_tokens: int


def _cached(so: SchedulerOutput) -> dict[str, Cached]:
    """``scheduled_cached_reqs`` as an ordered ``req_id -> row`` mapping."""
    c = so.scheduled_cached_reqs
    return {
        rid: Cached(c.num_computed_tokens[i], c.new_block_ids[i], c.num_output_tokens[i])
        for i, rid in enumerate(c.req_ids)
    }


def _assert_new(
    so: SchedulerOutput,
    req_id: str,
    prompt: Sequence[int],
    *,
    num_computed: int,
    block_ids: BlockIds,
) -> None:
    """A first-time request's NewRequestData, field by field."""
    new = new_data(so, req_id)
    assert new.prompt_token_ids == list(prompt)
    assert new.num_computed_tokens == num_computed
    assert new.block_ids == block_ids
    assert new.mm_features == []
    assert new.lora_request is None
    # V2 sends the tokens to prefill; V1 leaves the field unset.
    assert new.prefill_token_ids == (list(prompt) if _v2_runner() else None)


def _assert_resumed(
    so: SchedulerOutput,
    req_id: str,
    all_tokens: Sequence[int],
    *,
    num_computed: int,
    block_ids: BlockIds,
) -> None:
    """A preempted request coming back: recompute from ``num_computed`` with
    its whole block table, carrying prompt + output tokens so far."""
    if _v2_runner():
        new = new_data(so, req_id)
        assert new.num_computed_tokens == num_computed
        assert new.block_ids == block_ids
        assert list(new.prefill_token_ids) == list(all_tokens)
        assert req_id not in so.scheduled_cached_reqs.req_ids
    else:
        assert req_id not in new_ids(so)
        cached = so.scheduled_cached_reqs
        assert req_id in cached.resumed_req_ids
        assert cached.all_token_ids[req_id] == list(all_tokens)
        assert _cached(so)[req_id][:2] == (num_computed, block_ids)


# --------------------------------------------------------------------------- basics


@sync_and_async
def test_new_requests_then_decode(kind: str, async_scheduling: bool) -> None:
    """New requests get their whole prompt and fresh blocks, in the order added;
    the next step decodes one token each and only grows the block table when
    a request crosses a block boundary."""
    sched = vllm_setup.make_scheduler(kind, async_scheduling=async_scheduling)
    prompts = {"a": _prompt(40, 1000), "b": _prompt(16, 2000), "c": _prompt(1, 3000)}
    for rid, prompt in prompts.items():
        sched.add_request(req(rid, prompt))
    assert sched.get_request_counts() == (0, 3)

    so = sched.schedule()
    # Budget 256 covers all 57 prompt tokens, so each prompt is scheduled whole.
    assert so.num_scheduled_tokens == {"a": 40, "b": 16, "c": 1}
    assert so.total_num_scheduled_tokens == 57
    assert new_ids(so) == ["a", "b", "c"]
    # ceil(40/16)=3, ceil(16/16)=1, ceil(1/16)=1 blocks, handed out in order.
    _assert_new(so, "a", prompts["a"], num_computed=0, block_ids=([1, 2, 3],))
    _assert_new(so, "b", prompts["b"], num_computed=0, block_ids=([4],))
    _assert_new(so, "c", prompts["c"], num_computed=0, block_ids=([5],))
    assert _cached(so) == {}
    assert so.finished_req_ids == set()
    assert so.scheduled_spec_decode_tokens == {}
    assert sched.get_request_counts() == (3, 0)

    outs = by_req(update(sched, so, {"a": [500], "b": [501], "c": [502]}))
    assert {rid: out.new_token_ids for rid, out in outs.items()} == {
        "a": [500],
        "b": [501],
        "c": [502],
    }
    assert all(out.finish_reason is None for out in outs.values())

    so = sched.schedule()
    assert so.num_scheduled_tokens == {"a": 1, "b": 1, "c": 1}
    assert so.scheduled_new_reqs == []
    assert so.scheduled_cached_reqs.resumed_req_ids == set()
    assert _cached(so) == {
        # 41 tokens still fit 3 blocks: no new block (None, not an empty list).
        "a": Cached(40, None, 1),
        # The 17th token opens a 2nd block: the next free one, 6.
        "b": Cached(16, ([6],), 1),
        "c": Cached(1, None, 1),
    }


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_admission_order_by_policy(kind: str, policy: str) -> None:
    """FCFS admits in add_request order whatever the priority or arrival time;
    priority admits by (priority, arrival_time), lowest first, and keeps the
    rest waiting in that order under max_num_seqs."""
    sched = vllm_setup.make_scheduler(kind, policy=policy, max_num_seqs=3)
    specs = {"a": (2, 1.0), "b": (0, 2.0), "c": (1, 3.0), "d": (0, 0.5), "e": (1, 0.1)}
    for i, (rid, (prio, arrival)) in enumerate(specs.items()):
        sched.add_request(req(rid, _prompt(8, 1000 * (i + 1)), priority=prio, arrival_time=arrival))

    so = sched.schedule()
    if policy == "fcfs":
        running, later = ["a", "b", "c"], ["d", "e"]
    else:
        # Sorted by (priority, arrival): d(0,.5) b(0,2) e(1,.1) c(1,3) a(2,1).
        running, later = ["d", "b", "e"], ["c", "a"]
    assert new_ids(so) == running
    assert sched.get_request_counts() == (3, 2)

    # Finish the oldest running request (EOS) to free a slot; the next waiting
    # request in policy order takes it.
    for expected in later:
        update(sched, so, {rid: [EOS if rid == running[0] else 500] for rid in running})
        running = running[1:] + [expected]
        so = sched.schedule()
        assert new_ids(so) == [expected]


# --------------------------------------------------------------------------- chunking


@sync_and_async
def test_chunked_prefill_splits_long_prompt(kind: str, async_scheduling: bool) -> None:
    """A prompt longer than the token budget is prefilled in budget-sized
    chunks; running requests are served before waiting ones, so a short
    request behind it waits until the budget has room."""
    sched = vllm_setup.make_scheduler(
        kind, async_scheduling=async_scheduling, max_num_batched_tokens=64
    )
    a, b = _prompt(150, 1000), _prompt(10, 2000)
    sched.add_request(req("a", a))
    sched.add_request(req("b", b))

    so = sched.schedule()
    # 64 of 150 tokens fill the budget; b gets nothing.
    assert so.num_scheduled_tokens == {"a": 64}
    _assert_new(so, "a", a, num_computed=0, block_ids=([1, 2, 3, 4],))
    assert sched.get_request_counts() == (1, 1)
    # A partial prefill samples nothing, so there is no output for it.
    assert by_req(update(sched, so)) == {}

    so = sched.schedule()
    assert so.num_scheduled_tokens == {"a": 64}
    # 128 tokens need 8 blocks: 4 more; no output tokens yet.
    assert _cached(so) == {"a": Cached(64, ([5, 6, 7, 8],), 0)}
    assert by_req(update(sched, so)) == {}

    so = sched.schedule()
    # The last 22 tokens of a, then b (10) fits in the remaining 42.
    assert so.num_scheduled_tokens == {"a": 22, "b": 10}
    assert _cached(so) == {"a": Cached(128, ([9, 10],), 0)}
    _assert_new(so, "b", b, num_computed=0, block_ids=([11],))
    outs = by_req(update(sched, so, {"a": [500], "b": [501]}))
    assert outs["a"].new_token_ids == [500]
    assert outs["b"].new_token_ids == [501]

    so = sched.schedule()
    assert so.num_scheduled_tokens == {"a": 1, "b": 1}


def test_long_prefill_token_threshold(kind: str) -> None:
    """long_prefill_token_threshold caps each prefill chunk while more than
    one request is in the system; a request alone may use the whole budget."""
    sched = vllm_setup.make_scheduler(kind, long_prefill_token_threshold=24)
    sched.add_request(req("a", _prompt(100, 1000)))
    sched.add_request(req("b", _prompt(50, 2000)))

    steps = []
    sampled_per_step = [{}, {}, {"b": [500]}, {"b": [501]}, {"a": [502], "b": [503]}]
    for sampled in sampled_per_step:
        so = sched.schedule()
        steps.append(so.num_scheduled_tokens)
        update(sched, so, sampled)
    assert steps == [
        {"a": 24, "b": 24},
        {"a": 24, "b": 24},
        # b has 2 prompt tokens left, then samples its first token.
        {"a": 24, "b": 2},
        # A decode is 1 token; a keeps 24-token chunks (100 = 4*24 + 4).
        {"a": 24, "b": 1},
        {"a": 4, "b": 1},
    ]

    alone = vllm_setup.make_scheduler(kind, long_prefill_token_threshold=24)
    alone.add_request(req("c", _prompt(100, 3000)))
    # Nobody to starve: the cap is lifted for a lone request.
    assert alone.schedule().num_scheduled_tokens == {"c": 100}


@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "unchunked"])
def test_prefill_that_does_not_fit(kind: str, chunked: bool) -> None:
    """With chunked prefill off, a waiting prompt larger than the budget left
    is not split: it stops admission for this step, and the (smaller) requests
    behind it wait too. With it on, the prompt takes the rest of the budget."""
    sched = vllm_setup.make_scheduler(
        kind, enable_chunked_prefill=chunked, max_model_len=128, max_num_batched_tokens=128
    )
    sched.add_request(req("a", _prompt(100, 1000)))
    sched.add_request(req("b", _prompt(50, 2000)))
    sched.add_request(req("c", _prompt(20, 3000)))

    so = sched.schedule()
    if chunked:
        # 28 tokens of budget left after a go to b; c gets none.
        assert so.num_scheduled_tokens == {"a": 100, "b": 28}
        assert sched.get_request_counts() == (2, 1)
    else:
        # b (50) > 28: admission stops at b, so c (20), which would fit, waits.
        assert so.num_scheduled_tokens == {"a": 100}
        assert sched.get_request_counts() == (1, 2)
        update(sched, so, {"a": [500]})
        # Next step: a decodes (1) and both b and c fit in 127.
        so = sched.schedule()
        assert so.num_scheduled_tokens == {"a": 1, "b": 50, "c": 20}
        assert new_ids(so) == ["b", "c"]


# --------------------------------------------------------------------------- prefix caching


@pytest.mark.parametrize("caching", [True, False], ids=["apc", "no-apc"])
def test_prefix_cache_hit_shared_prefix(kind: str, caching: bool) -> None:
    """A request sharing a 3-block prefix with a running one reuses those
    blocks and starts at num_computed_tokens=48; the prefix-cache stats count
    it. Without prefix caching nothing is looked up or counted."""
    sched = vllm_setup.make_scheduler(kind, enable_prefix_caching=caching)
    shared = _prompt(48, 1000)
    a, b = shared + _prompt(5, 2000), shared + _prompt(7, 3000)
    sched.add_request(req("a", a))
    so = sched.schedule()
    # 53 tokens -> 4 blocks.
    _assert_new(so, "a", a, num_computed=0, block_ids=([1, 2, 3, 4],))
    stats = stats_of(update(sched, so, {"a": [500]}))
    # One lookup of 53 tokens, nothing cached yet.
    assert _prefix(stats) == ((1, 53, 0) if caching else (0, 0, 0))

    sched.add_request(req("b", b))
    so = sched.schedule()
    if caching:
        # Blocks 1-3 hold the shared 48 tokens; b computes its last 7 in a new
        # block (a's 54th token still fits block 4, so 5 is the next free).
        assert so.num_scheduled_tokens == {"a": 1, "b": 7}
        _assert_new(so, "b", b, num_computed=48, block_ids=([1, 2, 3, 5],))
    else:
        assert so.num_scheduled_tokens == {"a": 1, "b": 55}
        _assert_new(so, "b", b, num_computed=0, block_ids=([5, 6, 7, 8],))
    stats = stats_of(update(sched, so, {"a": [501], "b": [502]}))
    # The counters were reset by the previous update: only b's lookup is here.
    assert _prefix(stats) == ((1, 55, 48) if caching else (0, 0, 0))
    assert _preempted_prefix(stats) == (0, 0, 0)


def test_full_prompt_hit_and_same_step_dedup(kind: str) -> None:
    """An exact repeat of a block-aligned prompt recomputes its whole last
    block (the last token's logits are needed); blocks are cached when they
    are allocated, so a duplicate admitted in the same step already hits."""
    sched = vllm_setup.make_scheduler(kind)
    prompt = _prompt(48, 1000)
    sched.add_request(req("a", prompt))
    so = sched.schedule()
    update(sched, so, {"a": [EOS]})  # a finishes; its 3 blocks stay cached

    sched.add_request(req("b", prompt))
    so = sched.schedule()
    # The hit stops at 47 tokens -> 2 whole blocks (32); b recomputes 16 in a
    # new block: free queue is 4..199 then a's cached blocks 3, 2, 1.
    assert so.num_scheduled_tokens == {"b": 16}
    _assert_new(so, "b", prompt, num_computed=32, block_ids=([1, 2, 4],))
    assert _prefix(stats_of(update(sched, so, {"b": [500]}))) == (1, 48, 32)

    dedup = vllm_setup.make_scheduler(kind, max_num_batched_tokens=1000)
    twin = _prompt(100, 5000)
    dedup.add_request(req("x", twin))
    dedup.add_request(req("y", twin))
    so = dedup.schedule()
    # x computes 100 tokens in 7 blocks and caches the 6 full ones at once;
    # y hits those 96 tokens and computes the last 4 in its own block.
    assert so.num_scheduled_tokens == {"x": 100, "y": 4}
    _assert_new(so, "x", twin, num_computed=0, block_ids=([1, 2, 3, 4, 5, 6, 7],))
    _assert_new(so, "y", twin, num_computed=96, block_ids=([1, 2, 3, 4, 5, 6, 8],))


def test_cache_salt_isolates_prefix_cache(kind: str) -> None:
    """cache_salt is part of the first block's hash: only requests with the
    same salt share cached blocks (no salt is a salt of its own)."""
    sched = vllm_setup.make_scheduler(kind)
    prompt = _prompt(48, 1000)
    sched.add_request(req("a", prompt, cache_salt="x"))
    so = sched.schedule()
    update(sched, so, {"a": [EOS]})

    sched.add_request(req("other_salt", prompt, cache_salt="y"))
    sched.add_request(req("no_salt", prompt))
    sched.add_request(req("same_salt", prompt, cache_salt="x"))
    so = sched.schedule()
    computed = {new.req_id: new.num_computed_tokens for new in so.scheduled_new_reqs}
    # Only the same salt hits: 2 whole blocks (the last token is recomputed).
    assert computed == {"other_salt": 0, "no_salt": 0, "same_salt": 32}


def test_prompt_logprobs_skip_reading_the_prefix_cache(kind: str) -> None:
    """A request that wants prompt logprobs (vLLM sets
    skip_reading_prefix_cache) computes its whole prompt and is left out of the
    prefix-cache stats, yet caches its blocks: duplicates of cached hashes,
    which a later reader does not pick over the blocks cached first."""
    sched = vllm_setup.make_scheduler(kind)
    prompt = _prompt(100, 1000)
    sched.add_request(req("a", prompt))
    update(sched, sched.schedule(), {"a": [500]})
    sched.add_request(req("b", prompt, prompt_logprobs=1))
    so = sched.schedule()
    assert so.num_scheduled_tokens == {"a": 1, "b": 100}
    _assert_new(so, "b", prompt, num_computed=0, block_ids=([8, 9, 10, 11, 12, 13, 14],))
    assert _prefix(stats_of(update(sched, so, {"a": [501], "b": [502]}))) == (0, 0, 0)
    sched.finish_requests(["a"], ABORTED)  # a's unhashed last block 7 is reused first
    sched.add_request(req("c", prompt))
    so = sched.schedule()
    _assert_new(so, "c", prompt, num_computed=96, block_ids=([1, 2, 3, 4, 5, 6, 7],))
    assert _prefix(stats_of(update(sched, so))) == (1, 100, 96)


# --------------------------------------------------------------------------- structured outputs


@sync_and_async
def test_structured_output_waits_for_its_grammar(kind: str, async_scheduling: bool) -> None:
    """A request whose grammar compiles is skipped, not a barrier: the
    requests behind it run, it keeps its place and counts as skipped; once
    compiled it is admitted as new and its rows get grammar masks."""
    sched = vllm_setup.make_scheduler(kind, async_scheduling=async_scheduling)
    fake_grammar.install(sched.structured_output_manager, reasoning=False)
    sched.add_request(req("a", _prompt(20, 1000)))
    compile_b = structured(sched, "b", _prompt(20, 2000))
    sched.add_request(req("c", _prompt(21, 3000)))
    so = sched.schedule()
    assert so.num_scheduled_tokens == {"a": 20, "c": 21}
    assert not so.has_structured_output_requests
    assert sched.get_grammar_bitmask(so) is None
    stats = stats_of(update(sched, so, {"a": [500], "c": [501]}))
    assert (stats.num_waiting_reqs, stats.num_skipped_waiting_reqs) == (0, 1)
    compile_b.set_result(fake_grammar.FakeGrammar())
    so = sched.schedule()
    assert so.num_scheduled_tokens == {"a": 1, "c": 1, "b": 20}
    assert new_ids(so) == ["b"] and so.has_structured_output_requests
    # Async: a and c still have a token in flight, but they have no grammar.
    assert not so.pending_structured_output_tokens
    mask = sched.get_grammar_bitmask(so)
    assert mask.structured_output_request_ids == ["b"]
    assert mask.grammar_bitmask.tolist() == [[1, 1]]  # nothing accepted yet
    if async_scheduling:
        # The engine schedules the next step before this one's output: b's
        # mask for it must wait for the token in flight.
        after = sched.schedule()
        assert after.pending_structured_output_tokens
        update(sched, so, {"a": [502], "b": [503], "c": [504]})
    else:
        update(sched, so, {"a": [502], "b": [503], "c": [504]})
        after = sched.schedule()
        assert not after.pending_structured_output_tokens
    # Taken after b's token was accepted.
    assert sched.get_grammar_bitmask(after).grammar_bitmask.tolist() == [[2, 2]]


def test_a_grammar_that_fails_to_compile_ends_its_request(kind: str) -> None:
    """Found failed by a waiting pass, the request is ended by the next
    update: FINISHED_ERROR with a validation error, after the step's outputs."""
    sched = vllm_setup.make_scheduler(kind)
    sched.add_request(req("a", _prompt(20, 1000)))
    structured(sched, "b", _prompt(20, 2000)).set_exception(ValueError("bad schema"))
    so = sched.schedule()
    assert so.num_scheduled_tokens == {"a": 20}
    outs = by_req(update(sched, so, {"a": [500]}))
    assert list(outs) == ["a", "b"]
    b = outs["b"]
    assert (b.new_token_ids, b.finish_reason) == ([], FinishReason.ERROR)
    assert (b.error.code, b.error.message) == (
        "validation_error",
        "Invalid structured outputs: bad schema",
    )
    assert not sched.has_request("b") and sched.get_request_counts() == (1, 0)
    assert "b" in sched.schedule().finished_req_ids


def test_a_refused_output_keeps_the_errors_for_the_next_one() -> None:
    """A model runner output the drop-in refuses (vLLM asserts) changes
    nothing: the grammar error it would have ended waits for the next
    update, which ends it."""
    sched = vllm_setup.make_scheduler("ironbatch")
    sched.add_request(req("a", _prompt(20, 1000)))
    structured(sched, "b", _prompt(20, 2000)).set_exception(ValueError("bad schema"))
    so = sched.schedule()
    with pytest.raises(ValueError):
        update(sched, so, {"a": [-7]})
    assert sched.has_request("b")
    outs = by_req(update(sched, so, {"a": [500]}))
    assert list(outs) == ["a", "b"]
    assert (outs["b"].finish_reason, outs["b"].error.code) == (
        FinishReason.ERROR,
        "validation_error",
    )
    assert not sched.has_request("b")


def test_tokens_the_grammar_rejects_end_the_request(kind: str) -> None:
    """A rejected token ends the request with ERROR even where the stop
    check said stop (here EOS); it still carries the token."""
    sched = vllm_setup.make_scheduler(kind)
    fake_grammar.install(sched.structured_output_manager, reasoning=False)
    for rid, base in (("a", 1000), ("b", 2000)):
        structured(sched, rid, _prompt(20, base)).set_result(fake_grammar.FakeGrammar())
    so = sched.schedule()
    sched.get_grammar_bitmask(so)
    outs = by_req(update(sched, so, {"a": [fake_grammar.REJECTED], "b": [EOS]}))
    assert (outs["a"].new_token_ids, outs["a"].finish_reason) == ([13], FinishReason.ERROR)
    assert outs["a"].error is None
    assert outs["b"].finish_reason == FinishReason.STOP
    assert sched.get_request_counts() == (0, 0)


# --------------------------------------------------------------------------- streaming input


@sync_and_async
def test_streaming_session_turns(kind: str, async_scheduling: bool) -> None:
    """A resumable request's stop ends its turn, not the request: it waits
    for its next chunk holding its KV cache; the chunk continues it from all
    but its last sampled token, admitted as new from what it computed; a
    chunk that is not resumable ends the input with the next turn."""
    sched = vllm_setup.make_scheduler(kind, async_scheduling=async_scheduling)
    prompt = _prompt(20, 1000)
    sched.add_request(req("a", prompt, 2, resumable=True))
    schedules, updates = pipeline(sched, one_token_each(500))
    ends = [o for ecos in updates for o in by_req(ecos).values() if o.finish_reason]
    assert [(o.request_id, o.finish_reason) for o in ends] == [("a", FinishReason.LENGTH)]
    assert sched.has_request("a") and sched.get_num_unfinished_requests() == 0
    assert sched.get_request_counts() == (0, 1)
    sched.add_request(req("a", [300, 301, 302], 1, resumable=True))
    so = sched.schedule()
    # 20 prompt + 1 kept output (the last sampled one is dropped) + 3 new.
    assert so.num_scheduled_tokens == {"a": 3}
    _assert_new(so, "a", [*prompt, 500, 300, 301, 302], num_computed=21, block_ids=([1, 2],))
    sched.add_request(req("a", [0], 1))  # not resumable: the end of input
    outs = by_req(update(sched, so, {"a": [501]}))
    assert outs["a"].finish_reason == FinishReason.LENGTH
    assert not sched.has_request("a")
    assert "a" in sched.schedule().finished_req_ids


def test_a_session_chunk_rewrites_its_priority_key_in_place(kind: str) -> None:
    """vLLM's priority heap is not re-sorted when a waiting session's chunk
    changes its arrival time: sessions queued a, b, c are admitted a, b, c."""
    sched = vllm_setup.make_scheduler(kind, policy="priority")
    for i, rid in enumerate("abc"):
        sched.add_request(req(rid, _prompt(5, 1000 + 10 * i), 1, arrival_time=i, resumable=True))
    update(sched, sched.schedule(), {rid: [500] for rid in "abc"})
    for rid, arrival in (("b", 5.0), ("a", 6.0), ("c", 7.0)):
        sched.add_request(req(rid, [300], 1, arrival_time=arrival, resumable=True))
    assert list(sched.schedule().num_scheduled_tokens) == ["a", "b", "c"]


# --------------------------------------------------------------------------- stopping


@sync_and_async
def test_stop_on_eos(kind: str, async_scheduling: bool) -> None:
    """Sampling EOS finishes a request with reason STOP and no stop_reason;
    it is reported in the next SchedulerOutput's finished_req_ids, and no
    finished_requests set is attached (include_finished_set=False)."""
    sched = vllm_setup.make_scheduler(kind, async_scheduling=async_scheduling)
    sched.add_request(req("a", _prompt(10, 1000), max_tokens=10))
    sched.add_request(req("b", _prompt(10, 2000), max_tokens=10))
    so = sched.schedule()
    ecos = update(sched, so, {"a": [EOS], "b": [500]})
    outs = by_req(ecos)
    assert (outs["a"].new_token_ids, outs["a"].finish_reason, outs["a"].stop_reason) == (
        [EOS],
        FinishReason.STOP,
        None,
    )
    assert outs["a"].finished
    assert (outs["b"].new_token_ids, outs["b"].finish_reason) == ([500], None)
    assert all(eco.finished_requests is None for eco in ecos.values())

    assert sched.has_finished_requests()
    assert sched.get_num_unfinished_requests() == 1
    assert sched.get_request_counts() == (1, 0)

    so = sched.schedule()
    assert so.finished_req_ids == {"a"}
    assert so.num_scheduled_tokens == {"b": 1}
    # The finished set is flushed into that one SchedulerOutput.
    assert not sched.has_finished_requests()
    update(sched, so, {"b": [501]})
    assert sched.schedule().finished_req_ids == set()


def test_stop_token_ids_and_ignore_eos(kind: str) -> None:
    """A stop token finishes with reason STOP and stop_reason set to it;
    ignore_eos makes EOS an ordinary token but keeps the stop tokens."""
    sched = vllm_setup.make_scheduler(kind)
    sched.add_request(req("plain", _prompt(10, 1000), stop_token_ids=[77]))
    sched.add_request(req("no_eos", _prompt(10, 2000), ignore_eos=True, stop_token_ids=[77, 78]))
    so = sched.schedule()
    outs = by_req(update(sched, so, {"plain": [77], "no_eos": [EOS]}))
    assert (outs["plain"].finish_reason, outs["plain"].stop_reason) == (FinishReason.STOP, 77)
    assert (outs["no_eos"].new_token_ids, outs["no_eos"].finish_reason) == ([EOS], None)

    so = sched.schedule()
    assert so.num_scheduled_tokens == {"no_eos": 1}
    outs = by_req(update(sched, so, {"no_eos": [78]}))
    assert (outs["no_eos"].finish_reason, outs["no_eos"].stop_reason) == (FinishReason.STOP, 78)
    assert outs["no_eos"].new_token_ids == [78]


@sync_and_async
def test_stop_on_max_tokens(kind: str, async_scheduling: bool) -> None:
    """The max_tokens-th token finishes a request with reason LENGTH; EOS on
    that same token wins (STOP), as EOS is checked first."""
    sched = vllm_setup.make_scheduler(kind, async_scheduling=async_scheduling)
    sched.add_request(req("a", _prompt(10, 1000), max_tokens=3))
    sched.add_request(req("b", _prompt(10, 2000), max_tokens=2))
    reasons: dict[str, list[FinishReason | None]] = {"a": [], "b": []}
    steps = [{"a": [500], "b": [500]}, {"a": [501], "b": [EOS]}, {"a": [502]}]
    for sampled in steps:
        so = sched.schedule()
        assert set(so.num_scheduled_tokens) == set(sampled)
        for rid, out in by_req(update(sched, so, sampled)).items():
            reasons[rid].append(out.finish_reason)
    assert reasons == {
        "a": [None, None, FinishReason.LENGTH],
        "b": [None, FinishReason.STOP],
    }
    assert sched.get_num_unfinished_requests() == 0


def test_min_tokens_is_not_checked_by_the_scheduler(kind: str) -> None:
    """vLLM 0.33.0 checks EOS and stop tokens before min_tokens: keeping them
    from being sampled early is the sampler's job (a logits processor), so a
    stop token that does arrive early still ends the request."""
    sched = vllm_setup.make_scheduler(kind)
    sched.add_request(req("eos", _prompt(10, 1000), min_tokens=4))
    sched.add_request(req("stop", _prompt(10, 2000), min_tokens=4, stop_token_ids=[77]))
    sched.add_request(req("other", _prompt(10, 3000), min_tokens=4))
    so = sched.schedule()
    outs = by_req(update(sched, so, {"eos": [EOS], "stop": [77], "other": [500]}))
    assert (outs["eos"].finish_reason, outs["eos"].stop_reason) == (FinishReason.STOP, None)
    assert (outs["stop"].finish_reason, outs["stop"].stop_reason) == (FinishReason.STOP, 77)
    assert outs["other"].finish_reason is None


@sync_and_async
def test_stop_at_max_model_len(kind: str, async_scheduling: bool) -> None:
    """A request whose prompt + output reaches max_model_len finishes with
    reason LENGTH even below max_tokens."""
    sched = vllm_setup.make_scheduler(kind, async_scheduling=async_scheduling, max_model_len=64)
    sched.add_request(req("a", _prompt(60, 1000), max_tokens=100))
    scheduled, reasons = [], []
    for token in range(500, 504):
        so = sched.schedule()
        scheduled.append(so.num_scheduled_tokens)
        reasons.append(by_req(update(sched, so, {"a": [token]}))["a"].finish_reason)
    # 60 prompt tokens then 3 decodes; the 4th sampled token makes 64.
    assert scheduled == [{"a": 60}, {"a": 1}, {"a": 1}, {"a": 1}]
    assert reasons == [None, None, None, FinishReason.LENGTH]
    so = sched.schedule()
    assert (so.num_scheduled_tokens, so.finished_req_ids) == ({}, {"a"})


# --------------------------------------------------------------------------- aborts, limits


@sync_and_async
def test_abort_running_and_waiting(kind: str, async_scheduling: bool) -> None:
    """finish_requests aborts running and waiting requests alike, returns only
    those it finished, frees their blocks, and lists them in the next step's
    finished_req_ids; a late model output for an aborted request is dropped."""
    sched = vllm_setup.make_scheduler(kind, async_scheduling=async_scheduling, max_num_seqs=2)
    for i, rid in enumerate("abc"):
        sched.add_request(req(rid, _prompt(10, 1000 * (i + 1))))
    so = sched.schedule()
    assert so.num_scheduled_tokens == {"a": 10, "b": 10}
    update(sched, so, {"a": [500], "b": [501]})

    aborted = sched.finish_requests(["a", "c", "unknown"], ABORTED)
    assert sorted(r.request_id for r in aborted) == ["a", "c"]
    assert sched.finish_requests("a", ABORTED) == []  # already finished
    assert sched.has_finished_requests()
    assert sched.get_num_unfinished_requests() == 1
    assert sched.get_request_counts() == (1, 0)

    so = sched.schedule()
    # c never ran, but the workers are told about it all the same.
    assert so.finished_req_ids == {"a", "c"}
    assert so.num_scheduled_tokens == {"b": 1}

    # Abort b while its step is "executing": its output is ignored.
    sched.finish_requests("b", ABORTED)
    assert by_req(update(sched, so, {"b": [502]})) == {}
    so = sched.schedule()
    assert (so.num_scheduled_tokens, so.finished_req_ids) == ({}, {"b"})
    assert sched.get_num_unfinished_requests() == 0
    stats = sched.make_stats()
    assert (stats.num_running_reqs, stats.num_waiting_reqs, stats.kv_cache_usage) == (0, 0, 0.0)


def test_max_num_seqs_caps_running(kind: str) -> None:
    """At most max_num_seqs requests run; a finished one frees a slot that the
    next waiting request takes in the same step as the others decode."""
    sched = vllm_setup.make_scheduler(kind, max_num_seqs=2)
    for i, rid in enumerate("abcd"):
        sched.add_request(req(rid, _prompt(10, 1000 * (i + 1))))
    so = sched.schedule()
    assert new_ids(so) == ["a", "b"]
    assert sched.get_request_counts() == (2, 2)
    update(sched, so, {"a": [EOS], "b": [500]})

    so = sched.schedule()
    assert so.finished_req_ids == {"a"}
    assert list(_cached(so)) == ["b"]
    assert new_ids(so) == ["c"]
    assert so.num_scheduled_tokens == {"b": 1, "c": 10}
    assert sched.get_request_counts() == (2, 1)


# --------------------------------------------------------------------------- preemption


@sync_and_async
def test_fcfs_preemption_and_resume(kind: str, async_scheduling: bool) -> None:
    """When a running request cannot get a block, FCFS preempts the last
    running request (recompute): it loses its blocks, goes back to waiting,
    admits nobody else that step, and later resumes from its prefix-cache hit
    with prompt + output tokens."""
    # 5 usable blocks (block 0 is the null block).
    sched = vllm_setup.make_scheduler(kind, async_scheduling=async_scheduling, num_blocks=6)
    a, b = _prompt(32, 1000), _prompt(48, 2000)
    sched.add_request(req("a", a))
    sched.add_request(req("b", b))
    so = sched.schedule()
    # a: 2 blocks, b: 3 blocks -> the pool is full.
    _assert_new(so, "a", a, num_computed=0, block_ids=([1, 2],))
    _assert_new(so, "b", b, num_computed=0, block_ids=([3, 4, 5],))
    update(sched, so, {"a": [500], "b": [600]})

    sched.add_request(req("c", _prompt(4, 3000)))
    so = sched.schedule()
    # a's 33rd token needs a 3rd block; none is free, so b (last) is preempted.
    # b's cached blocks go to the back of the queue tail first (5, 4, 3) and a
    # takes block 5. A step that preempts admits no waiting request (c).
    assert so.num_scheduled_tokens == {"a": 1}
    assert so.preempted_req_ids == {"b"}
    assert _cached(so) == {"a": Cached(32, ([5],), 1)}
    assert so.scheduled_new_reqs == []
    assert sched.get_request_counts() == (1, 2)
    update(sched, so, {"a": [EOS]})

    so = sched.schedule()
    assert so.finished_req_ids == {"a"}
    assert so.preempted_req_ids == set()
    # b resumes first (preempted requests go to the front of the queue). Its
    # blocks 3, 4 are still cached (block 5 was reused): a 32-token hit; it
    # recomputes 48 + 1 - 32 = 17 tokens in 2 blocks: a's uncached block 5
    # (front of the queue), then 2 (a's cached blocks 2, 1 are at the back).
    assert so.num_scheduled_tokens == {"b": 17, "c": 4}
    _assert_resumed(so, "b", b + [600], num_computed=32, block_ids=([3, 4, 5, 2],))
    stats = stats_of(update(sched, so, {"b": [601], "c": [602]}))
    # b's lookup counts as a preempted one; c's as a fresh miss.
    assert _preempted_prefix(stats) == (1, 49, 32)
    assert _prefix(stats) == (1, 4, 0)


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_preemption_victim_by_policy(kind: str, policy: str) -> None:
    """The victim is the last running request under FCFS, and the running
    request with the largest (priority, arrival_time) under priority, even if
    that is the request asking for the block: it then preempts itself and the
    requests after it still run."""
    sched = vllm_setup.make_scheduler(kind, policy=policy, num_blocks=6)
    lo, hi = _prompt(31, 1000), _prompt(48, 2000)
    sched.add_request(req("lo", lo, priority=5, arrival_time=1.0))
    so = sched.schedule()
    update(sched, so, {"lo": [500]})
    sched.add_request(req("hi", hi, priority=0, arrival_time=2.0))
    so = sched.schedule()
    # lo (32 tokens) still fits 2 blocks; hi takes the 3 others: pool full.
    assert so.num_scheduled_tokens == {"lo": 1, "hi": 48}
    _assert_new(so, "hi", hi, num_computed=0, block_ids=([3, 4, 5],))
    update(sched, so, {"lo": [501], "hi": [600]})

    so = sched.schedule()
    if policy == "fcfs":
        # lo needs a 3rd block: hi (last running) goes; lo takes its block 5.
        assert so.preempted_req_ids == {"hi"}
        assert so.num_scheduled_tokens == {"lo": 1}
        assert _cached(so) == {"lo": Cached(32, ([5],), 2)}
    else:
        # lo needs a 3rd block but is itself the lowest priority: it preempts
        # itself, and hi (49 tokens -> 4th block) takes lo's freed block 2.
        assert so.preempted_req_ids == {"lo"}
        assert so.num_scheduled_tokens == {"hi": 1}
        assert _cached(so) == {"hi": Cached(48, ([2],), 1)}
    assert sched.get_request_counts() == (1, 1)


@sync_and_async
def test_priority_preemption_unschedules_victim(kind: str, async_scheduling: bool) -> None:
    """Under priority, a high-priority request that needs a block preempts a
    lower-priority one already scheduled earlier in the same step: the victim
    is dropped from this step's batch and resumes once there is room."""
    sched = vllm_setup.make_scheduler(
        kind, async_scheduling=async_scheduling, policy="priority", num_blocks=6
    )
    lo, hi = _prompt(32, 1000), _prompt(32, 2000)
    sched.add_request(req("lo", lo, priority=5, arrival_time=1.0))
    so = sched.schedule()
    update(sched, so, {"lo": [500]})

    sched.add_request(req("hi", hi, priority=0, arrival_time=2.0))
    so = sched.schedule()
    # lo's 33rd token takes block 3; hi's 32 tokens take 4 and 5.
    assert so.num_scheduled_tokens == {"lo": 1, "hi": 32}
    assert _cached(so) == {"lo": Cached(32, ([3],), 1)}
    _assert_new(so, "hi", hi, num_computed=0, block_ids=([4, 5],))
    update(sched, so, {"lo": [501], "hi": [600]})

    so = sched.schedule()
    # lo decodes within its 3 blocks first, then hi's 33rd token needs a block:
    # lo (priority 5) is the victim and leaves the batch. Its uncached block 3
    # (2 tokens) goes to the front of the free queue and hi takes it.
    assert so.num_scheduled_tokens == {"hi": 1}
    assert so.preempted_req_ids == {"lo"}
    assert _cached(so) == {"hi": Cached(32, ([3],), 1)}
    assert sched.get_request_counts() == (1, 1)
    update(sched, so, {"hi": [EOS]})

    so = sched.schedule()
    assert so.finished_req_ids == {"hi"}
    # lo's prompt blocks 1, 2 are still cached: it recomputes 34 - 32 tokens,
    # in hi's freed uncached block 3 (front of the queue).
    assert so.num_scheduled_tokens == {"lo": 2}
    _assert_resumed(so, "lo", lo + [500, 501], num_computed=32, block_ids=([1, 2, 3],))


# --------------------------------------------------------------------------- async scheduling


@sync_and_async
def test_schedule_before_previous_output(kind: str, async_scheduling: bool) -> None:
    """Async scheduling counts an output placeholder per scheduled decode, so
    the next schedule() runs a decode before the previous step's token has
    arrived; the sync scheduler has nothing to run until it does."""
    sched = vllm_setup.make_scheduler(kind, async_scheduling=async_scheduling)
    sched.add_request(req("a", _prompt(20, 1000), max_tokens=5))
    first = sched.schedule()
    second = sched.schedule()
    if not async_scheduling:
        assert second.num_scheduled_tokens == {}
        assert by_req(update(sched, first, {"a": [500]}))["a"].new_token_ids == [500]
        return

    assert second.num_scheduled_tokens == {"a": 1}
    # Position 20 is computed next; 1 output (the placeholder) is pending.
    # 21 tokens still fit the 2 blocks of the prompt.
    assert _cached(second) == {"a": Cached(20, None, 1)}
    assert by_req(update(sched, first, {"a": [500]}))["a"].new_token_ids == [500]
    third = sched.schedule()
    # One output arrived, one placeholder is still in flight.
    assert _cached(third) == {"a": Cached(21, None, 2)}
    assert by_req(update(sched, second, {"a": [501]}))["a"].new_token_ids == [501]
    assert by_req(update(sched, third, {"a": [502]}))["a"].new_token_ids == [502]


@pytest.mark.parametrize("max_tokens", [1, 2, 3, 5])
@sync_and_async
def test_no_step_past_max_tokens(kind: str, async_scheduling: bool, max_tokens: int) -> None:
    """With two steps in flight, a request whose in-flight step already yields
    its max_tokens-th token is not scheduled again: over the whole run each
    request is scheduled exactly prompt + max_tokens - 1 tokens."""
    sched = vllm_setup.make_scheduler(kind, async_scheduling=async_scheduling)
    sched.add_request(req("a", _prompt(10, 1000), max_tokens=max_tokens))
    sched.add_request(req("b", _prompt(7, 2000), max_tokens=max_tokens))
    schedules, updates = pipeline(sched, one_token_each(500))

    # A prefill yields the first token; every further token needs one decode.
    assert sum(so.total_num_scheduled_tokens for so in schedules) == 10 + 7 + 2 * (max_tokens - 1)
    tokens: dict[str, int] = {"a": 0, "b": 0}
    reasons: dict[str, FinishReason | None] = {}
    for ecos in updates:
        for rid, out in by_req(ecos).items():
            tokens[rid] += len(out.new_token_ids)
            reasons[rid] = out.finish_reason
    assert tokens == {"a": max_tokens, "b": max_tokens}
    assert reasons == {"a": FinishReason.LENGTH, "b": FinishReason.LENGTH}
    assert sched.get_num_unfinished_requests() == 0


def test_async_aborts_with_steps_in_flight(kind: str) -> None:
    """Aborting while two steps are in flight: a request aborted before the
    k-th output is applied keeps exactly the k tokens it already got; its
    in-flight outputs are dropped and it is reported finished exactly once."""
    sched = vllm_setup.make_scheduler(kind, async_scheduling=True)
    ids = ["r0", "r1", "r2", "r3", "r4"]
    for i, rid in enumerate(ids):
        sched.add_request(req(rid, _prompt(10, 1000 * (i + 1)), max_tokens=20))
    abort_order = ["r3", "r0", "r4", "r1", "r2"]
    pending = list(abort_order)

    def abort_next() -> None:
        if pending:
            sched.finish_requests(pending.pop(0), ABORTED)

    schedules, updates = pipeline(sched, one_token_each(500), before_each_update=abort_next)
    got = dict.fromkeys(ids, 0)
    for ecos in updates:
        for rid, out in by_req(ecos).items():
            assert out.finish_reason is None  # aborts produce no output here
            got[rid] += len(out.new_token_ids)
    # Every update before the abort gave each live request one token.
    assert got == {rid: abort_order.index(rid) for rid in ids}
    reported = [rid for so in schedules for rid in so.finished_req_ids]
    assert sorted(reported) == ids
    assert sched.get_num_unfinished_requests() == 0


def test_async_output_after_eos_is_dropped(kind: str) -> None:
    """A request that stops on EOS while its next step is in flight: that
    step's token is discarded, and the next SchedulerOutput reports it."""
    sched = vllm_setup.make_scheduler(kind, async_scheduling=True)
    sched.add_request(req("a", _prompt(10, 1000)))
    sched.add_request(req("b", _prompt(10, 2000)))
    first, second = sched.schedule(), sched.schedule()
    assert second.num_scheduled_tokens == {"a": 1, "b": 1}

    outs = by_req(update(sched, first, {"a": [EOS], "b": [500]}))
    assert outs["a"].finish_reason == FinishReason.STOP
    outs = by_req(update(sched, second, {"a": [501], "b": [502]}))
    assert list(outs) == ["b"]
    so = sched.schedule()
    assert so.finished_req_ids == {"a"}
    assert so.num_scheduled_tokens == {"b": 1}


def test_async_preempted_request_keeps_in_flight_token(kind: str) -> None:
    """A request preempted while its step is in flight still receives that
    step's token (it is not resampled) and resumes with it."""
    sched = vllm_setup.make_scheduler(kind, async_scheduling=True, num_blocks=6)
    a, b = _prompt(32, 1000), _prompt(48, 2000)
    sched.add_request(req("a", a))
    sched.add_request(req("b", b))
    first = sched.schedule()
    # a's decode (position 32) needs a 3rd block while the pool is full: b,
    # the last running request, is preempted before its prefill output lands.
    second = sched.schedule()
    assert second.num_scheduled_tokens == {"a": 1}
    assert second.preempted_req_ids == {"b"}

    outs = by_req(update(sched, first, {"a": [500], "b": [600]}))
    assert {rid: out.new_token_ids for rid, out in outs.items()} == {"a": [500], "b": [600]}
    third = sched.schedule()
    # b needs 4 blocks for 49 tokens, 2 of them cached, but only 2 are free.
    assert third.num_scheduled_tokens == {"a": 1}
    assert sched.get_request_counts() == (1, 1)

    assert by_req(update(sched, second, {"a": [EOS]}))["a"].finish_reason == FinishReason.STOP
    assert by_req(update(sched, third, {"a": [501]})) == {}
    so = sched.schedule()
    assert so.finished_req_ids == {"a"}
    # Same resume as in the sync case: 32 cached tokens, 17 to recompute.
    assert so.num_scheduled_tokens == {"b": 17}
    _assert_resumed(so, "b", b + [600], num_computed=32, block_ids=([3, 4, 5, 2],))


# --------------------------------------------------------------------------- cache reset, stats


def test_reset_prefix_cache(kind: str) -> None:
    """reset_prefix_cache fails while running requests hold blocks; with
    reset_running_requests=True it preempts them all (reported in the next
    step's preempted_req_ids, stats flagged reset) and they recompute from
    scratch. Once idle, a reset makes earlier prompts miss."""
    sched = vllm_setup.make_scheduler(kind)
    a, b = _prompt(40, 1000), _prompt(20, 2000)
    sched.add_request(req("a", a))
    sched.add_request(req("b", b))
    so = sched.schedule()
    update(sched, so, {"a": [500], "b": [501]})

    assert sched.reset_prefix_cache() is False
    assert sched.reset_prefix_cache(reset_running_requests=True) is True
    assert sched.get_request_counts() == (0, 2)
    assert sched.get_num_unfinished_requests() == 2

    so = sched.schedule()
    assert so.preempted_req_ids == {"a", "b"}
    # No hits left: both recompute everything, in their original order.
    assert so.num_scheduled_tokens == {"a": 41, "b": 21}
    # Freed tail first, b before a (preempted last to first): uncached tails
    # 5 then 3 went to the front, so the queue starts 3, 5, 6, 7, 8, ...
    _assert_resumed(so, "a", a + [500], num_computed=0, block_ids=([3, 5, 6],))
    _assert_resumed(so, "b", b + [501], num_computed=0, block_ids=([7, 8],))
    stats = stats_of(update(sched, so, {"a": [EOS], "b": [EOS]}))
    assert stats.prefix_cache_stats.reset is True
    assert _preempted_prefix(stats) == (2, 62, 0)

    # a's prompt blocks are cached again; an idle reset drops them.
    assert sched.reset_prefix_cache() is True
    sched.add_request(req("again", a))
    so = sched.schedule()
    assert new_data(so, "again").num_computed_tokens == 0
    assert so.num_scheduled_tokens == {"again": 40}


@pytest.mark.parametrize("log_stats", [True, False])
def test_make_stats(kind: str, log_stats: bool) -> None:
    """make_stats reports queue sizes, KV usage and the prefix-cache counters
    gathered since the last call (then resets them); with log_stats off it
    returns None and updates carry no stats (nor an empty output)."""
    sched = vllm_setup.make_scheduler(
        kind, log_stats=log_stats, max_num_seqs=1, max_num_batched_tokens=16
    )
    sched.add_request(req("a", _prompt(20, 1000)))
    sched.add_request(req("b", _prompt(20, 2000)))
    so = sched.schedule()
    assert so.num_scheduled_tokens == {"a": 16}  # a first chunk
    stats = sched.make_stats()
    if not log_stats:
        assert stats is None
        # A partial prefill has no output and there are no stats to send.
        assert update(sched, so) == {}
        so = sched.schedule()
        ecos = update(sched, so, {"a": [500]})
        assert by_req(ecos)["a"].new_token_ids == [500]
        assert all(eco.scheduler_stats is None for eco in ecos.values())
        return

    assert (stats.num_running_reqs, stats.num_waiting_reqs) == (1, 1)
    assert stats.num_skipped_waiting_reqs == 0
    # a holds 1 of the 199 usable blocks.
    assert stats.kv_cache_usage == pytest.approx(1 / 199)
    # The lookup covers a's whole prompt, not just the chunk.
    assert _prefix(stats) == (1, 20, 0)
    assert stats.prefix_cache_stats.reset is False
    # Counters restart from zero after each make_stats.
    assert _prefix(sched.make_stats()) == (0, 0, 0)

    # With no request output, the stats still go out, to client 0.
    ecos = update(sched, so)
    assert list(ecos) == [0]
    assert ecos[0].outputs == []
    assert (ecos[0].scheduler_stats.num_running_reqs, ecos[0].scheduler_stats.num_waiting_reqs) == (
        1,
        1,
    )


def test_outputs_grouped_by_client(kind: str) -> None:
    """Outputs are grouped by each request's client_index; the step's stats
    ride on the first client that has outputs."""
    sched = vllm_setup.make_scheduler(kind)
    sched.add_request(req("a", _prompt(10, 1000), client_index=1))
    sched.add_request(req("b", _prompt(10, 2000), client_index=0))
    so = sched.schedule()
    ecos = update(sched, so, {"a": [500], "b": [501]})
    assert sorted(ecos) == [0, 1]
    assert [out.request_id for out in ecos[1].outputs] == ["a"]
    assert [out.request_id for out in ecos[0].outputs] == ["b"]
    # a was scheduled first, so client 1's EngineCoreOutputs carries the stats.
    assert ecos[1].scheduler_stats is not None
    assert ecos[0].scheduler_stats is None
