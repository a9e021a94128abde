"""Hybrid KV caches (full attention beside sliding windows or chunked local
attention, one block pool) on both backends, against numbers vLLM 0.33.0
itself printed: its KVCacheManager driven the way its scheduler drives it
(/tmp/research_hybrid_kv.md §4.4, §5.4; the scripts ex1.py, ex2.py, ex3.py
and ex7.py of that note). Block size 16, window 128, a fresh pool of 100
blocks, synchronous scheduling."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from ironbatch import CacheConfig, KVCacheGroup, Request, SamplingParams, Scheduler, SchedulerConfig
from ironbatch.config import check_fits
from ironbatch.reference.attention_group import (
    ChunkedLocal,
    Full,
    Mamba,
    SlidingWindow,
    group_key,
)
from ironbatch.reference.block_pool import BlockPool
from ironbatch.reference.prefix_hit import HitQuery, find_longest_hit, lookup_groups

from scheduler_helpers import BACKENDS, make, req
from scheduler_helpers import step as run_step

FULL = KVCacheGroup("full")
SWA = KVCacheGroup("sliding_window", 128)
PROMPT = list(range(1000, 1300))  # vLLM's 300-token prompt


def hybrid(backend: str, groups: tuple[KVCacheGroup, ...], **kw: Any) -> Scheduler:
    kw.setdefault("max_num_batched_tokens", 1024)
    return make(
        backend, num_blocks=100, block_size=16, kv_cache_groups=groups, max_model_len=512, **kw
    )


def tables(s: Scheduler, rid: str) -> list[list[int]]:
    return s.debug_state()["requests"][rid]["tables"]


def free_queue(s: Scheduler) -> list[int]:
    return s.debug_state()["free_block_ids"]


def run_one(s: Scheduler, max_tokens: int) -> dict[int, Any]:
    """Run request A (the 300-token prompt) to the end, one token per step;
    what each step saw, by A's computed tokens before it: its new blocks
    per group, A's tables and the free queue right after the schedule."""
    s.add_request(req("A", PROMPT, max_tokens=max_tokens, ignore_eos=True))
    seen = {}
    while s.has_unfinished_requests():
        out = s.schedule()
        c = int(out.num_computed_tokens[0])
        seen[c] = {
            "new": out.block_ids_per_group(0),
            "tables": tables(s, "A"),
            "free": free_queue(s),
        }
        s.update_from_output(out, {"A": [7]} if out.samples[0] else {})
    return seen


def nulls(table: list[int]) -> int:
    return sum(1 for b in table if b == 0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_sliding_window_gives_blocks_back(backend: str) -> None:
    """§4.4: a one-chunk prefill takes blocks in every group, group by
    group; each decode step gives back the window blocks no later token
    reads, highest first, uncached ones to the head of the free queue,
    where the next allocation (of any group) takes them."""
    s = hybrid(backend, (FULL, SWA))
    seen = run_one(s, max_tokens=51)
    assert seen[0]["new"] == [list(range(1, 20)), list(range(20, 39))]
    assert seen[0]["free"][:3] == [39, 40, 41]
    # c=300: 173 tokens skipped → SWA positions 9..0 (ids 29..20, uncached).
    assert seen[300]["new"] == [[], []]
    assert nulls(seen[300]["tables"][1]) == 10 and nulls(seen[300]["tables"][0]) == 0
    assert seen[300]["free"][:11] == [29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 39]
    # c=303: position 10 (id 30) is cached: to the tail, still findable.
    assert seen[303]["free"][-4:] == [97, 98, 99, 30]
    # A new position per group once 16 more tokens need one.
    assert seen[304]["new"] == [[29], [28]]
    assert seen[320]["new"] == [[27], [26]]
    assert seen[336]["new"] == [[25], [24]]
    assert seen[349]["tables"] == [
        [*range(1, 20), 29, 27, 25],
        [0] * 13 + [*range(33, 39), 28, 26, 24],
    ]
    # Freed group by group, each last block first (§7).
    free = free_queue(s)
    assert free[:12] == [24, 26, 28, 38, 25, 23, 22, 21, 20, 39, 40, 41]
    assert free[-30:] == [99, 30, 31, 32, 27, 29, *range(19, 0, -1), 37, 36, 35, 34, 33]
    assert len(free) == 99


@pytest.mark.parametrize("backend", BACKENDS)
def test_group_order_is_vllm_order(backend: str) -> None:
    """The same with the window group first (gpt-oss's layer order): the
    ids trade places and the window's freed blocks come from the front."""
    s = hybrid(backend, (SWA, FULL))
    seen = run_one(s, max_tokens=51)
    assert seen[0]["new"] == [list(range(1, 20)), list(range(20, 39))]
    assert seen[300]["free"][:6] == [10, 9, 8, 7, 6, 5]
    assert seen[303]["free"][-4:] == [97, 98, 99, 11]
    assert seen[304]["new"] == [[10], [9]]
    assert seen[320]["new"] == [[8], [7]]
    assert seen[336]["new"] == [[6], [5]]
    assert seen[349]["tables"] == [
        [0] * 13 + [*range(14, 20), 10, 8, 6],
        [*range(20, 39), 9, 7, 5],
    ]
    free = free_queue(s)
    assert free[:9] == [5, 6, 8, 10, 19, 4, 3, 2, 1]
    assert free[-30:] == [99, 11, 12, 13, *range(18, 13, -1), 7, 9, *range(38, 19, -1)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_chunked_prefill_frees_between_chunks(backend: str) -> None:
    """§4.4's chunked variant (128/128/44): the third chunk's allocation
    first gives back the window's first 8 blocks, which both groups then
    take."""
    s = hybrid(backend, (FULL, SWA), max_num_batched_tokens=128)
    seen = run_one(s, max_tokens=22)
    assert seen[0]["new"] == [list(range(1, 9)), list(range(9, 17))]
    assert seen[128]["new"] == [list(range(17, 25)), list(range(25, 33))]
    assert seen[256]["new"] == [[16, 15, 14], [13, 12, 11]]
    assert seen[256]["tables"][1][:9] == [0] * 8 + [25]
    assert seen[256]["free"][:3] == [10, 9, 33]
    assert seen[300]["free"][:6] == [26, 25, 10, 9, 33, 34]
    assert seen[304]["new"] == [[26], [25]]
    assert seen[320]["new"] == [[10], [9]]


def sparse_example(backend: str, sparse_retention: bool) -> Scheduler:
    """§5.4: A (300 tokens) runs and is freed; B resends A's prompt; C and D
    share its first 200 tokens, admitted together while B decodes."""
    s = hybrid(backend, (FULL, SWA), sparse_retention=sparse_retention)
    s.add_request(req("A", PROMPT, max_tokens=1))
    out = s.schedule()
    s.update_from_output(out, {"A": [1]})
    s.add_request(req("B", PROMPT, max_tokens=100, ignore_eos=True))
    out = s.schedule()
    s.update_from_output(out, {"B": [1]})
    shared = list(range(1000, 1200))
    s.add_request(req("C", shared + list(range(5000, 5100)), max_tokens=100))
    s.add_request(req("D", shared + list(range(6000, 6100)), max_tokens=100))
    return s


@pytest.mark.parametrize("backend", BACKENDS)
def test_sparse_retention_pins_the_shared_prefix(backend: str) -> None:
    """Under sparse retention the window group caches only the blocks that
    end at the prompt's last token, so C, sharing 192 cacheable tokens with
    A, gets no hit but learns where the shared prefix ends; its window
    group then caches the blocks before it, and D hits them (A's older
    duplicates first)."""
    s = sparse_example(backend, sparse_retention=True)
    state = s.debug_state()["requests"]
    assert state["B"]["num_computed_tokens"] == 300
    assert state["B"]["tables"] == [
        [*range(1, 19), 38],
        [0] * 10 + [*range(30, 38), 29],
    ]
    assert free_queue(s)[:11] == [*range(28, 18, -1), 39]
    out = s.schedule()
    assert out.req_ids == ["B", "C", "D"]
    assert out.num_computed_tokens.tolist() == [300, 0, 192]
    state = s.debug_state()["requests"]
    assert state["C"]["shared_prefix_boundary"] == 192
    assert state["D"]["shared_prefix_boundary"] == 0
    assert state["C"]["tables"] == [
        [*range(28, 18, -1), *range(39, 48)],
        list(range(48, 67)),
    ]
    assert state["D"]["tables"] == [
        [*range(1, 13), *range(67, 74)],
        [0, 0, 0, 0, *range(52, 58), 30, 31, *range(74, 81)],
    ]
    assert out.block_ids_per_group(2) == state["D"]["tables"]
    stats = s.make_stats().prefix_cache_stats
    assert (stats.queries, stats.hits) == (1200, 480)


@pytest.mark.parametrize("backend", BACKENDS)
def test_dense_retention_hits_at_once(backend: str) -> None:
    """Caching every window block (vLLM's retention None), C hits too."""
    s = sparse_example(backend, sparse_retention=False)
    assert tables(s, "B")[1] == [0] * 10 + [*range(30, 38), 19]
    out = s.schedule()
    assert out.num_computed_tokens.tolist() == [300, 192, 192]
    state = s.debug_state()["requests"]
    window_hit = [0, 0, 0, 0, *range(24, 32)]
    assert state["C"]["tables"] == [
        [*range(1, 13), *range(39, 46)],
        [*window_hit, *range(46, 53)],
    ]
    assert state["D"]["tables"] == [
        [*range(1, 13), *range(53, 60)],
        [*window_hit, *range(60, 67)],
    ]
    assert state["C"]["shared_prefix_boundary"] == 0
    stats = s.make_stats().prefix_cache_stats
    assert (stats.queries, stats.hits) == (1200, 672)


@pytest.mark.parametrize("backend", BACKENDS)
def test_chunked_local_attention(backend: str) -> None:
    """ex3.py, chunks of 64: whole chunks go back at once; a hit needs only
    the cached blocks of its last chunk (B's two), or none at a chunk's end
    (C's 192 tokens)."""
    s = hybrid(backend, (FULL, KVCacheGroup("chunked_local", 64)))
    s.add_request(req("A", PROMPT, max_tokens=100, ignore_eos=True))
    seen = {}
    for _ in range(41):
        out = s.schedule()
        seen[int(out.num_computed_tokens[0])] = (out.block_ids_per_group(0), tables(s, "A"))
        s.update_from_output(out, {"A": [1]})
    assert seen[0][0] == [list(range(1, 20)), list(range(20, 39))]
    assert seen[300][1][1] == [0] * 16 + [36, 37, 38]
    assert seen[304][0] == [[39], [40]]
    assert seen[320][0] == [[41], [42]] and seen[320][1][1] == [0] * 20 + [42]
    assert seen[336][0] == [[43], [44]]
    assert free_queue(s)[-4:] == [40, 38, 37, 36]
    # B resends A's prompt, C shares 200 tokens; both join A's step.
    s.add_request(req("B", PROMPT, max_tokens=10))
    s.add_request(req("C", list(range(1000, 1200)) + [5] * 50, max_tokens=10))
    out = s.schedule()
    assert out.req_ids == ["A", "B", "C"]
    assert out.num_computed_tokens.tolist() == [340, 288, 192]
    assert out.block_ids_per_group(1) == [[*range(1, 19), 45], [0] * 16 + [36, 37, 46]]
    assert out.block_ids_per_group(2) == [
        [*range(1, 13), *range(47, 51)],
        [0] * 12 + [51, 52, 53, 54],
    ]


@pytest.mark.parametrize("backend", BACKENDS)
def test_several_windows_and_the_free_order(backend: str) -> None:
    """ex7.py, Gemma's order (windows first, full last): each group takes
    its blocks in turn; freed group by group, the last group's uncached
    blocks end up at the very head."""
    s = hybrid(backend, (SWA, SWA, FULL))
    s.add_request(req("A", list(range(1000, 1100)), max_tokens=1))
    out = s.schedule()
    assert out.block_ids_per_group(0) == [
        list(range(1, 8)),
        list(range(8, 15)),
        list(range(15, 22)),
    ]
    s.update_from_output(out, {"A": [1]})
    assert free_queue(s)[:5] == [21, 14, 7, 22, 23]


@pytest.mark.parametrize("backend", BACKENDS)
def test_output_views_per_group(backend: str) -> None:
    """vLLM's shapes: a new request's whole table per group; a running
    request's new blocks per group, None when no group grew."""
    s = hybrid(backend, (FULL, SWA))
    s.add_request(req("A", PROMPT, max_tokens=10, ignore_eos=True))
    out = s.schedule()
    new = out.scheduled_new_reqs[0]
    assert new.block_ids == list(range(1, 20))  # group 0's, as with one group
    assert new.block_ids_per_group == [list(range(1, 20)), list(range(20, 39))]
    assert out.block_ids_of(0, group=1) == list(range(20, 39))
    with pytest.raises(IndexError):
        out.block_ids_of(0, group=2)
    for _ in range(4):  # up to c = 303
        s.update_from_output(out, {"A": [7]})
        out = s.schedule()
        cached = out.scheduled_cached_reqs
        assert cached.new_block_ids == [None] and cached.new_block_ids_per_group == [None]
    s.update_from_output(out, {"A": [7]})
    out = s.schedule()  # c = 304: a block per group
    cached = out.scheduled_cached_reqs
    assert cached.new_block_ids == [[29]]
    assert cached.new_block_ids_per_group == [[[29], [28]]]
    assert len(out.new_block_offsets) == 2 * len(out.req_ids) + 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_admission_cap_bounds_the_whole_prompt_check(backend: str) -> None:
    """The admission gate counts a window group's blocks only up to its cap:
    the 300-token prompt needs 19 + 19 blocks, 19 + 9 with a cap of 9; the
    step's own check is not capped (its first chunk takes 8 + 8)."""
    for cap, admitted in ((None, False), (9, True)):
        groups = (FULL, KVCacheGroup("sliding_window", 128, cap))
        s = make(
            backend,
            num_blocks=41,
            block_size=16,
            kv_cache_groups=groups,
            max_model_len=304,
            max_num_batched_tokens=128,
        )
        s.add_request(req("W", list(range(2000, 2016)), max_tokens=50, ignore_eos=True))
        out = s.schedule()
        s.update_from_output(out, {"W": [7]})
        s.add_request(req("A", PROMPT, max_tokens=2))
        out = s.schedule()  # W grows to 2 blocks per group: 36 of 40 free
        assert s.num_free_blocks == (20 if admitted else 36)
        assert out.req_ids == (["W", "A"] if admitted else ["W"]), cap


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_lookahead_hash_keys_every_groups_blocks(backend: str) -> None:
    """With an EAGLE drafter's lookahead hashes (vLLM's default beside
    window groups), a block hits in every group only when the token after
    it matches too: B shares A's first 64 tokens (three blocks hit), or
    those and the 65th (four)."""

    def hit(shared: int) -> int:
        s = hybrid(
            backend,
            (FULL, KVCacheGroup("sliding_window", 20)),
            num_hash_lookahead_tokens=1,
            num_speculative_tokens=1,
            sparse_retention=False,
        )
        s.add_request(req("A", PROMPT[:80], max_tokens=1, ignore_eos=True))
        out = s.schedule()
        s.update_from_output(out, {"A": [7]})
        s.add_request(req("B", PROMPT[:shared] + [5] * (80 - shared), max_tokens=1))
        return int(s.schedule().num_computed_tokens[0])

    assert (hit(64), hit(65)) == (48, 64)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_eagle_block_drop_beside_a_window(backend: str) -> None:
    # The 300-token prompt, run and sent again (at most 299 tokens hit).
    # Without a drop: 18 blocks, the window's 8 cached before block 18. An
    # EAGLE drafter's group drops a block: full attention looks a block
    # past (still 18, all the hashes) and drops one, so the hit is 17
    # blocks, and the window cached its 8 before block 17 (the resend's
    # resume point is a block lower). When the window drops too (every
    # group flagged: vLLM's fallback) it keeps a ninth block and drops it.
    with pytest.raises(ValueError, match="eagle_groups: group 2 is not one of the 2 KV-cache"):
        hybrid(backend, (FULL, SWA), drop_eagle_block=True, eagle_groups=(2,))
    with pytest.raises(ValueError, match=r"eagle_groups must be in \[0, .*got -1"):
        hybrid(backend, (FULL, SWA), drop_eagle_block=True, eagle_groups=(-1,))
    with pytest.raises(TypeError, match="eagle_groups must be a tuple of KV-cache group indices"):
        hybrid(backend, (FULL, SWA), drop_eagle_block=True, eagle_groups=0)
    for drop, flagged, hit in [(False, None, 288), (True, (0,), 272), (True, None, 272)]:
        s = hybrid(backend, (FULL, SWA), drop_eagle_block=drop, eagle_groups=flagged)
        run_one(s, 1)
        s.add_request(req("B", PROMPT, max_tokens=1))
        out = s.schedule()
        assert int(out.num_computed_tokens[0]) == hit, (drop, flagged)
        window = tables(s, "B")[1]
        assert nulls(window) == (hit - 127) // 16 and 0 not in window[nulls(window) :]


def test_group_settings_are_checked() -> None:
    with pytest.raises(ValueError, match=r"KVCacheGroup.kind must be one of .*'sliding'"):
        KVCacheGroup("sliding", 4)
    with pytest.raises(ValueError, match=r"KVCacheGroup.size must be in \[1, .*got 0"):
        KVCacheGroup("sliding_window")
    with pytest.raises(ValueError, match="size must be 0 for a full-attention group, got 8"):
        KVCacheGroup("full", 8)
    with pytest.raises(ValueError, match="admission_cap_blocks must be None for a full"):
        KVCacheGroup("full", admission_cap_blocks=3)
    with pytest.raises(ValueError, match=r"admission_cap_blocks must be in \[1, .*got 0"):
        KVCacheGroup("chunked_local", 64, 0)
    with pytest.raises(TypeError, match="KVCacheGroup.size must be an int, got str"):
        KVCacheGroup("chunked_local", "64")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"kv_cache_groups\[1\] must be a KVCacheGroup, got tuple"):
        CacheConfig(kv_cache_groups=(FULL, ("sliding_window", 4)))  # type: ignore[arg-type]
    # None is a model without a KV cache (test_no_kv_cache.py): nothing to cache.
    with pytest.raises(
        ValueError, match="kv_cache_groups is empty .*enable_prefix_caching must be false"
    ):
        CacheConfig(kv_cache_groups=())
    with pytest.raises(ValueError, match=r"kv_cache_groups must be in \[0, 64\], got 65"):
        CacheConfig(kv_cache_groups=(FULL,) * 65)
    with pytest.raises(TypeError, match="sparse_retention must be a bool"):
        CacheConfig(sparse_retention=0)  # type: ignore[arg-type]
    c = CacheConfig(kv_cache_groups=[FULL, SWA])  # type: ignore[arg-type]
    assert c.kv_cache_groups == (FULL, SWA) and c.num_kv_cache_groups == 2


def test_recurrent_group_settings_are_checked() -> None:
    """A Mamba group's size is its state block, its scratch states a count;
    neither a cap nor scratch states on other kinds."""
    with pytest.raises(ValueError, match=r"KVCacheGroup.size must be in \[1, .*mamba group, got 0"):
        KVCacheGroup("mamba")
    with pytest.raises(ValueError, match=r"speculative_blocks must be in \[0, .*got -1"):
        KVCacheGroup("mamba", 512, speculative_blocks=-1)
    with pytest.raises(TypeError, match="speculative_blocks must be an int, got bool"):
        KVCacheGroup("mamba", 512, speculative_blocks=True)
    with pytest.raises(ValueError, match="admission_cap_blocks must be None for a mamba group"):
        KVCacheGroup("mamba", 512, admission_cap_blocks=2)
    with pytest.raises(ValueError, match="speculative_blocks must be 0 for a sliding_window"):
        KVCacheGroup("sliding_window", 128, speculative_blocks=1)
    with pytest.raises(ValueError, match=r"prefill_checkpoint_alignment must be in \[1, .*got 0"):
        KVCacheGroup("mamba", 16, prefill_checkpoint_alignment=0)
    with pytest.raises(ValueError, match="prefill_checkpoint_alignment must be None for a full"):
        KVCacheGroup("full", prefill_checkpoint_alignment=1)
    # Prefix caching off: one state per model length plus the scratch
    # states, in the start-up check.
    sched = SchedulerConfig(max_model_len=320)
    mamba = KVCacheGroup("mamba", 320, speculative_blocks=2)
    off = {"kv_cache_groups": (mamba, FULL), "enable_prefix_caching": False}
    check_fits(sched, CacheConfig(num_blocks=24, **off))
    with pytest.raises(ValueError, match="fewer than the 23 one sequence"):
        check_fits(sched, CacheConfig(num_blocks=23, **off))
    # On (vLLM's "align"): two states, a prefill checkpoint's, the scratch
    # states.
    aligned = KVCacheGroup("mamba", 16, speculative_blocks=2, prefill_checkpoint_alignment=1)
    check_fits(sched, CacheConfig(num_blocks=26, kv_cache_groups=(aligned, FULL)))
    with pytest.raises(ValueError, match="fewer than the 25 one sequence"):
        check_fits(sched, CacheConfig(num_blocks=25, kv_cache_groups=(aligned, FULL)))


@pytest.mark.parametrize("backend", BACKENDS)
def test_recurrent_groups_refuse_what_align_mode_does_not_model(backend: str) -> None:
    """vLLM caches recurrent states in its "align" mode, with chunked
    prefill (which it requires), of the cache's block size or less (a state
    block that divides the attention blocks: §7.16); the core does not
    model a state block larger than a hash block (vLLM's hits inside a
    state block): a clear refusal, on both backends alike."""
    with pytest.raises(
        ValueError, match=r"mamba_block_size \(2048\) must divide every other KV-cache group"
    ):
        make(backend, caching=True, kv_cache_groups=(KVCacheGroup("mamba", 2048), FULL))
    with pytest.raises(ValueError, match=r"mamba_block_size \(32\) must divide every other"):
        make(backend, caching=True, kv_cache_groups=(KVCacheGroup("mamba", 32), FULL))
    make(backend, caching=True, kv_cache_groups=(KVCacheGroup("mamba", 8), FULL))
    mamba = KVCacheGroup("mamba", 16)
    with pytest.raises(ValueError, match="enable_chunked_prefill must be true"):
        make(backend, kv_cache_groups=(mamba, FULL), enable_chunked_prefill=False)
    # Lookahead hashes past a token (multi-module MTP's) are taken.
    make(
        backend,
        kv_cache_groups=(mamba, FULL),
        num_speculative_tokens=2,
        num_lookahead_tokens=2,
        num_hash_lookahead_tokens=2,
    )
    make(backend, caching=True, kv_cache_groups=(mamba, FULL))
    make(backend, caching=False, kv_cache_groups=(KVCacheGroup("mamba", 2048), FULL))


def test_the_cache_must_hold_one_sequence_in_every_group() -> None:
    """Start-up: one max_model_len sequence's blocks in every group, a
    window group's capped at its admission cap."""
    sched = SchedulerConfig(max_model_len=320)
    check_fits(sched, CacheConfig(num_blocks=41, kv_cache_groups=(FULL, SWA)))
    with pytest.raises(ValueError, match="fewer than the 40 one sequence"):
        check_fits(sched, CacheConfig(num_blocks=40, kv_cache_groups=(FULL, SWA)))
    capped = KVCacheGroup("sliding_window", 128, admission_cap_blocks=9)
    check_fits(sched, CacheConfig(num_blocks=30, kv_cache_groups=(FULL, capped)))


def test_one_group_is_asked_once() -> None:
    """vLLM's unitary coordinator (one KV-cache group) asks its group once;
    its hybrid one iterates (printed by vLLM: chunks of 3 tokens in blocks of
    2, blocks 3 and 4 evicted, a 12-token resend). The twin's lookup; the
    core's is rust/src/prefix_hit.rs's test of the same name."""
    hashes = list(range(1, 7))
    kind = ChunkedLocal(3)
    for num_groups, tokens, shared in ((1, 8, 0), (2, 6, 8)):
        pool = BlockPool(40)
        for g in range(num_groups):
            for i, block in enumerate(pool.take_free_blocks(len(hashes))):
                if i < 3 or i == 5:
                    pool.cache_block(block, group_key(hashes[i], g))
        groups = lookup_groups([kind] * num_groups, [2] * num_groups)
        hit = find_longest_hit(pool, groups, HitQuery(hashes, 11, 2, 2), num_groups)
        assert (hit.tokens, hit.shared_prefix_boundary) == (tokens, shared)
        assert [[b.block_id for b in blocks] for blocks in hit.blocks] == [
            [0] * (tokens // 2)
        ] * num_groups


def test_a_window_of_smaller_blocks_ends_its_hit_on_the_scheduler_block() -> None:
    """vLLM 0.33, a mixed-precision hybrid: full attention in blocks of 4
    tokens, a 3-token window in blocks of 2, hashes per 2 tokens, hits on
    multiples of 4. The window cached its blocks 3 and 4 (tokens 6..10); a
    run ending at token 10 is skipped, the hit ends at 8. The twin's lookup;
    the core's is rust/src/prefix_hit.rs's test of the same name."""
    hashes = list(range(1, 9))
    pool = BlockPool(40)
    blocks = pool.take_free_blocks(8)
    for k in range(3):
        pool.cache_block(blocks[k], group_key(hashes[2 * k + 1], 0))
    for k in (3, 4):
        pool.cache_block(blocks[3 + k], group_key(hashes[k], 1))
    groups = lookup_groups([Full(), SlidingWindow(3)], [4, 2])
    hit = find_longest_hit(pool, groups, HitQuery(hashes, 15, 2, 4), 2)
    assert hit.tokens == 8
    assert [b.block_id for b in hit.blocks[0]] == [b.block_id for b in blocks[:2]]
    assert [b.block_id for b in hit.blocks[1]] == [0, 0, 0, blocks[6].block_id]


def test_a_state_smaller_than_the_attention_blocks_hits_on_the_scheduler_block() -> None:
    """vLLM 0.33, Qwen3-Next with MTP in small: full attention in blocks of
    4 tokens, recurrent states of 2, hashes per 2 tokens, hits on multiples
    of 4. Full attention cached tokens 0..12, the states after 4, 6 and 10
    tokens: those after 10 and 6 are skipped (off the alignment), the hit
    is the state after 4 (12 shared). The twin's lookup; the core's is
    rust/src/prefix_hit.rs's test of the same name."""
    hashes = list(range(1, 9))
    pool = BlockPool(40)
    blocks = pool.take_free_blocks(6)
    for k in range(3):
        pool.cache_block(blocks[k], group_key(hashes[2 * k + 1], 0))
    for block, k in zip(blocks[3:], (1, 2, 4), strict=True):
        pool.cache_block(block, group_key(hashes[k], 1))
    groups = lookup_groups([Full(), Mamba(2)], [4, 2])
    hit = find_longest_hit(pool, groups, HitQuery(hashes, 15, 2, 4), 2)
    assert (hit.tokens, hit.shared_prefix_boundary) == (4, 12)
    assert [b.block_id for b in hit.blocks[0]] == [blocks[0].block_id]
    assert [b.block_id for b in hit.blocks[1]] == [0, blocks[3].block_id]


def test_full_attention_of_smaller_blocks_rounds_its_hit_to_the_scheduler_block() -> None:
    """Full attention in blocks of 2 cached tokens 0..6, a window in blocks
    of 4 nothing: no hit, and the prefix the requests share ends on the
    scheduler block, at 4 (vLLM rounds the full-attention hit down so). The
    twin's lookup; the core's is rust/src/prefix_hit.rs's test of the same
    name."""
    hashes = list(range(1, 9))
    pool = BlockPool(40)
    blocks = pool.take_free_blocks(3)
    for k in range(3):
        pool.cache_block(blocks[k], group_key(hashes[k], 0))
    groups = lookup_groups([Full(), SlidingWindow(3)], [2, 4])
    hit = find_longest_hit(pool, groups, HitQuery(hashes, 15, 2, 4), 2)
    assert (hit.tokens, hit.shared_prefix_boundary) == (0, 4)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_full_attention_prompt_tail_is_keyed_inside_its_block(backend: str) -> None:
    """vLLM 0.33 keys the full-attention block the prompt's last hash-block
    boundary falls inside, when its own hash is not known yet (hashes one
    token ahead): full attention in blocks of 8 beside a window in blocks of
    4, an 8-token prompt, the tail after 4 tokens. Aborted before its
    output arrives, the request frees that block to the queue's tail as a
    cached block (unkeyed, it would go to the head)."""
    groups = (KVCacheGroup("sliding_window", 64), KVCacheGroup("full", block_size=8))
    s = make(
        backend,
        block_size=4,
        kv_cache_groups=groups,
        num_speculative_tokens=1,
        num_lookahead_tokens=1,
        num_hash_lookahead_tokens=1,
    )
    s.add_request(req("A", list(range(100, 108)), max_tokens=1))
    s.schedule()
    window, full = tables(s, "A")
    s.finish_requests("A")
    queue = free_queue(s)
    assert queue[:4] == [full[1], *window[::-1]] and queue[-1] == full[0], queue


def test_groups_of_different_block_sizes_take_drafters_and_refuse_odd_groups() -> None:
    """Beside groups of different block sizes the core and the twin take
    lookahead hashes, EAGLE's last-block drop, multi-module MTP's read-ahead
    and KV-cache events, and refuse a block size on a group that cannot
    have its own."""
    from ironbatch.core_scheduler import CoreScheduler
    from ironbatch.reference.scheduler import Scheduler as Twin

    groups = (
        KVCacheGroup("sliding_window", 64, block_size=32),
        KVCacheGroup("full", block_size=64),
    )
    sched = SchedulerConfig(max_model_len=512, max_num_seqs=4, max_num_batched_tokens=256)
    cache = CacheConfig(num_blocks=100, block_size=32, kv_cache_groups=groups)
    spec = dataclasses.replace(sched, num_speculative_tokens=2, num_lookahead_tokens=2)
    for build in (CoreScheduler, Twin):
        s = build(sched, cache)
        core = s.core if isinstance(s, CoreScheduler) else s
        core.enable_kv_events()
        build(dataclasses.replace(spec, num_hash_lookahead_tokens=1), cache)
        build(dataclasses.replace(spec, drop_eagle_block=True), cache)
        build(dataclasses.replace(spec, drafter_read_ahead=2), cache)
    with pytest.raises(ValueError, match="a Mamba group's block size is its size"):
        KVCacheGroup("mamba", 8, block_size=32)


@pytest.mark.parametrize("backend", BACKENDS)
def test_chunked_local_groups_of_their_own_block_size(backend: str) -> None:
    """A chunked-local group may have blocks of its own size (Llama 4 with
    its chunked layers at another precision): with prefix caching off at
    any size, with it on only at the largest, the scheduler block its hits
    end on (vLLM asserts so at a lookup). A 64-token prompt then takes two
    blocks of 32 in the chunked group and four of 16 in the full one."""

    def groups(chunked: int, full: int) -> tuple[KVCacheGroup, ...]:
        return (
            KVCacheGroup("chunked_local", 64, block_size=chunked),
            KVCacheGroup("full", block_size=full),
        )

    s = hybrid(backend, groups(32, 16))
    s.add_request(req("a", range(100, 164), max_tokens=2))
    run_step(s)
    chunked, full = tables(s, "a")
    assert (len(chunked), len(full)) == (2, 4)
    hybrid(backend, groups(16, 32), caching=False)
    with pytest.raises(ValueError, match=r"chunked-local-attention group's blocks must be"):
        hybrid(backend, groups(16, 32))


@pytest.mark.parametrize("backend", ["rust", "python"])
def test_slot_mapping_has_one_run_of_the_tokens_per_group(backend: str) -> None:
    """The step's slots, group by group: the window group's run first (its
    blocks 1–19 for the 300-token prompt), then the full group's (20–38)."""
    groups = (
        KVCacheGroup(kind="sliding_window", size=128),
        KVCacheGroup(kind="full"),
    )
    s = Scheduler(
        SchedulerConfig(max_model_len=512, max_num_seqs=4, max_num_batched_tokens=512),
        CacheConfig(num_blocks=100, block_size=16, kv_cache_groups=groups),
        backend=backend,
    )
    s.add_request(Request("a", list(range(3, 303)), SamplingParams(max_tokens=4)))
    out = s.schedule()
    slots = out.slot_mapping.tolist()
    assert len(slots) == 2 * 300 == 2 * len(out.positions)
    assert slots[:300] == [16 + p for p in range(300)]  # blocks 1, 2, ...
    assert slots[300:] == [20 * 16 + p for p in range(300)]  # blocks 20, 21, ...


@pytest.mark.parametrize("backend", BACKENDS)
def test_qwen3_next_states_without_prefix_caching(backend: str) -> None:
    """docs/scheduling.md §7.15's worked example: three linear-attention
    groups of one state block each (the model's 512 tokens) beside full
    attention in blocks of 16, prefix caching off. A state block comes with
    a request's first chunk and stays; only attention blocks are listed for
    zeroing; a preempted request gives every block back and takes one state
    block per group again when it resumes."""
    mamba = KVCacheGroup("mamba", 512)
    s = make(
        backend,
        num_blocks=47,
        caching=False,
        kv_cache_groups=(mamba, mamba, mamba, KVCacheGroup("full")),
        max_model_len=512,
        max_num_seqs=4,
        max_num_batched_tokens=1024,
    )
    s.add_request(req("A", [5] * 300, max_tokens=40, ignore_eos=True))
    s.add_request(req("B", [6] * 280, max_tokens=40, ignore_eos=True))
    seen: dict[int, Any] = {}
    for step in range(41):
        out = s.schedule()
        ids = {rid: out.block_ids_per_group(i) for i, rid in enumerate(out.req_ids)}
        seen[step] = (ids, sorted(out.preempted_req_ids), out.new_block_ids_to_zero)
        s.update_from_output(out, {rid: [7] for rid in out.req_ids})
    ids, _, zero = seen[0]
    assert ids["A"] == [[1], [2], [3], list(range(4, 23))]
    assert ids["B"] == [[23], [24], [25], list(range(26, 44))]
    assert zero == [*range(4, 23), *range(26, 44)]  # attention blocks only
    assert seen[5] == ({"A": [[], [], [], [44]], "B": [[], [], [], []]}, [], [44])
    assert seen[25][1] == ["B"]  # no 20th block for B: it goes
    ids, _, zero = seen[40]  # A finished; B resumes with its 305 tokens
    assert ids["B"] == [[45], [46], [44], list(range(22, 2, -1))]
    assert zero == list(range(22, 2, -1))


@pytest.mark.parametrize("backend", BACKENDS)
def test_qwen3_next_states_cached_in_align_mode(backend: str) -> None:
    """docs/scheduling.md §7.15's second worked example: Qwen3-Next's groups
    with prefix caching on (vLLM's cache mode "align"), states in blocks of
    16 like attention's. Prefill chunks end on block boundaries and at the
    prompt's checkpoint; a state cached this step is hit only the next; a
    hit needs a cached state, so the preempted B, whose states were
    evicted, starts over although its attention blocks are cached."""
    mamba = KVCacheGroup("mamba", 16)
    s = make(
        backend,
        num_blocks=24,
        kv_cache_groups=(mamba, mamba, mamba, KVCacheGroup("full")),
        max_model_len=256,
        max_num_seqs=4,
        max_num_batched_tokens=44,
    )
    prompt = list(range(1, 101))
    s.add_request(req("A", prompt, max_tokens=80, ignore_eos=True))
    seen: dict[int, Any] = {}
    for n in range(90):
        if n == 2:  # A's first 96 tokens, then its own
            s.add_request(req("B", prompt[:96] + [500 + i for i in range(10)], max_tokens=80))
        out = s.schedule()
        ids = {rid: out.block_ids_per_group(i) for i, rid in enumerate(out.req_ids)}
        scheduled = dict(zip(out.req_ids, (e.num_tokens for e in out.entries()), strict=True))
        computed = {e.request_id: e.num_computed_tokens for e in out.entries()}
        seen[n] = (ids, scheduled, computed, sorted(out.preempted_req_ids))
        s.update_from_output(out, {rid: [7] for i, rid in enumerate(out.req_ids) if out.samples[i]})
    # Chunks of 32, not the budget's 44: each ends on a block, its state in
    # the block it ends in, nulls before.
    assert seen[0][:2] == ({"A": [[0, 1], [0, 2], [0, 3], [4, 5]]}, {"A": 32})
    assert seen[1][:2] == ({"A": [[0, 6], [0, 7], [0, 8], [9, 10]]}, {"A": 32})
    # The third stops at the prompt's checkpoint (96 = 99 rounded down to a
    # block), reusing the states freed once passed; B, arriving, would hit
    # the state cached this very step: it waits.
    assert seen[2][:2] == ({"A": [[0, 3], [0, 2], [0, 1], [11, 12]]}, {"A": 32})
    ids, scheduled, computed, _ = seen[3]
    assert scheduled == {"A": 4, "B": 10} and computed == {"A": 96, "B": 96}
    assert ids["B"] == [
        [0, 0, 0, 0, 0, 3, 14],
        [0, 0, 0, 0, 0, 2, 15],
        [0, 0, 0, 0, 0, 1, 16],
        [4, 5, 9, 10, 11, 12, 17],
    ]
    # Decoding, a state moves to a new block at each block boundary.
    assert seen[10][0]["B"] == [[18], [19], [20], [21]]
    assert seen[58][3] == ["B"]
    # B's attention prefix is cached still, but the states at 96 went to A's
    # growth (blocks 1-3): no state, no hit.
    ids, scheduled, computed, _ = seen[83]
    assert (scheduled, computed) == ({"B": 32}, {"B": 0})
    assert ids["B"] == [[0, 19], [0, 8], [0, 7], [6, 14]]


def three_mtp_modules(
    backend: str, groups: tuple[KVCacheGroup, ...], budget: int, **kw: Any
) -> Scheduler:
    """DeepSeek's three MTP modules (they read three prompt tokens ahead)
    beside cached states, blocks of 8, chunked prefill within ``budget``."""
    return make(
        backend,
        num_blocks=60,
        block_size=8,
        max_model_len=64,
        max_num_seqs=4,
        max_num_batched_tokens=budget,
        kv_cache_groups=groups,
        caching=True,
        enable_chunked_prefill=True,
        num_speculative_tokens=3,
        num_lookahead_tokens=3,
        drafter_read_ahead=3,
        **kw,
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_multi_module_mtp_beside_cached_states_stalls_as_vllm_does(backend: str) -> None:
    """vLLM's own stall, kept (docs/scheduling.md §7.15; the drop-in's
    test_vllm_differential.py runs the same case against vLLM): three MTP
    modules read three prompt tokens ahead, states are cached in blocks of
    8, the budget is 8. A 9-token prompt's first chunk stops at 6, three
    short of its end; the next must stop at the block's end, 8, inside the
    read-ahead, so the request is never scheduled again."""
    groups = (KVCacheGroup("full"), KVCacheGroup("mamba", 8))
    s = three_mtp_modules(backend, groups, budget=8, num_hash_lookahead_tokens=3)
    s.add_request(req("a", list(range(100, 109)), max_tokens=2))
    scheduled = []
    for _ in range(4):
        out, _ = run_step(s)
        scheduled.append(out.num_scheduled_tokens.get("a", 0))
    assert scheduled == [6, 0, 0, 0] and s.has_unfinished_requests()


@pytest.mark.parametrize("backend", BACKENDS)
def test_eagle_drop_beside_multi_module_mtp_keys_no_state_inside_a_block(backend: str) -> None:
    """vLLM's hybrid coordinator hands a group that drops an EAGLE block
    its finalized tokens up to a block past the scheduler block (§7.15;
    the drop-in's test_vllm_differential.py runs the same case against
    vLLM). Three MTP modules may prefill the last two again: when the
    41-token prompt's last chunk ends, the state group gets 39 tokens, a
    count inside a block, so it keys no state, not even the prompt's
    checkpoint at 32. Nothing of the prompt counts as cached then."""
    groups = (KVCacheGroup("full", block_size=16), KVCacheGroup("mamba", 8))
    s = three_mtp_modules(backend, groups, budget=24, drop_eagle_block=True)
    s.add_request(req("a", list(range(100, 141)), max_tokens=4, ignore_eos=True))
    seen = []
    for _ in range(3):
        out = s.schedule()
        update = s.update_from_output(out, {"a": [7]} if out.samples[0] else {})
        seen.append((out.num_scheduled_tokens["a"], update.cached_tokens.tolist()))
    assert seen == [(24, []), (8, []), (9, [0])]
