"""The KV-cache acceptance scenarios of docs/scheduling.md §9.1 (K1–K6), whose expected
values are vLLM 0.33.0's own results, for the Rust core and the twin alike."""

from __future__ import annotations

import itertools
from types import ModuleType
from typing import Any

from kv_invariants import check_kv_invariants

COMMON = list(range(1000, 1048))  # 48 distinct tokens: 3 full blocks of 16
_ids = itertools.count()


def admit(kv: Any, tokens: list[int], salt: str | None = None, rid: str | None = None):
    """Register a request and allocate all its tokens the way the scheduler
    admits one: prefix lookup, then allocate_slots with the hits."""
    rid = rid or f"req{next(_ids)}"
    kv.add_request(rid, tokens, cache_salt=salt)
    hits, hit_tokens = kv.get_computed_blocks(rid)
    new = kv.allocate_slots(rid, len(tokens) - hit_tokens, hit_tokens, hits)
    return rid, hits, hit_tokens, new


def test_k1_prefix_hits_and_free_order(backend: ModuleType) -> None:
    kv = backend.KVCacheManager(num_blocks=11, block_size=16, max_model_len=4096)
    r0, hits, hit, new = admit(kv, COMMON + [3] * 7)
    assert (hits, hit, new) == ([], 0, [1, 2, 3, 4])
    assert kv.num_cached_blocks(r0) == 3  # block 4 is partial

    r1, hits, hit, new = admit(kv, COMMON + [3] * 5)
    assert (hits, hit, new) == ([1, 2, 3], 48, [5])
    assert kv.block_ref_cnts()[1:4] == [2, 2, 2]
    assert kv.get_block_ids(r1) == [1, 2, 3, 5]
    assert kv.num_free_blocks == 5

    kv.free(r0)
    assert kv.free_block_ids() == [4, 6, 7, 8, 9, 10]
    kv.free(r1)
    assert kv.free_block_ids() == [5, 4, 6, 7, 8, 9, 10, 3, 2, 1]

    r2, hits, hit, new = admit(kv, COMMON + [3] * 6)
    assert (hits, hit, new) == ([1, 2, 3], 48, [5])
    assert kv.num_free_blocks == 6
    assert kv.free_block_ids() == [4, 6, 7, 8, 9, 10]
    check_kv_invariants(kv, [r0, r1, r2])
    kv.free(r2)
    assert kv.free_block_ids() == [5, 4, 6, 7, 8, 9, 10, 3, 2, 1]

    r3, hits, hit, new = admit(kv, [99] * 160)
    assert (hits, hit, new) == ([], 0, [5, 4, 6, 7, 8, 9, 10, 3, 2, 1])
    # The common prefix was evicted when 3, 2, 1 were reused.
    kv.add_request("probe", COMMON + [7])
    assert kv.get_computed_blocks("probe") == ([], 0)
    check_kv_invariants(kv, [r0, r1, r2, r3, "probe"])


def test_k2_eviction_order(backend: ModuleType) -> None:
    kv = backend.KVCacheManager(num_blocks=11, block_size=16, max_model_len=4096)
    r0, _, _, new = admit(kv, list(range(0, 87)))
    assert new == [1, 2, 3, 4, 5, 6]
    r1, _, _, new = admit(kv, list(range(87, 135)))
    assert new == [7, 8, 9]
    assert kv.num_free_blocks == 1
    kv.free(r0)
    assert kv.free_block_ids() == [6, 10, 5, 4, 3, 2, 1]
    kv.free(r1)
    assert kv.free_block_ids() == [6, 10, 5, 4, 3, 2, 1, 9, 8, 7]
    r2, hits, hit, new = admit(kv, list(range(0, 35)))
    assert (hits, hit, new) == ([1, 2], 32, [6])
    assert kv.num_free_blocks == 7
    assert kv.free_block_ids() == [10, 5, 4, 3, 9, 8, 7]
    check_kv_invariants(kv, [r0, r1, r2])


def test_k3_caching_off_is_lifo(backend: ModuleType) -> None:
    kv = backend.KVCacheManager(
        num_blocks=11, block_size=16, max_model_len=4096, enable_prefix_caching=False
    )
    a, _, _, new = admit(kv, [5] * 40)
    assert new == [1, 2, 3]
    b, _, _, new = admit(kv, [5] * 20)
    assert new == [4, 5]
    kv.free(a)
    assert kv.free_block_ids() == [3, 2, 1, 6, 7, 8, 9, 10]
    kv.free(b)
    assert kv.free_block_ids() == [5, 4, 3, 2, 1, 6, 7, 8, 9, 10]
    c, hits, hit, new = admit(kv, [5] * 50)
    assert (hits, hit, new) == ([], 0, [5, 4, 3, 2])
    assert kv.cached_blocks() == {}
    check_kv_invariants(kv, [a, b, c])


def test_k4_the_last_block_is_recomputed(backend: ModuleType) -> None:
    kv = backend.KVCacheManager(num_blocks=11, block_size=16, max_model_len=4096)
    x, _, _, new = admit(kv, COMMON)
    assert new == [1, 2, 3] and kv.num_cached_blocks(x) == 3
    kv.free(x)
    assert kv.free_block_ids() == [4, 5, 6, 7, 8, 9, 10, 3, 2, 1]
    y, hits, hit, new = admit(kv, COMMON)
    assert (hits, hit, new) == ([1, 2], 32, [4])
    assert kv.get_block_ids(y) == [1, 2, 4]
    # Block 4 recomputed block 2 of the prompt: both copies stay in the map,
    # and lookups answer with the earliest inserted (Q14).
    last = kv.block_hashes(y)[2]
    assert kv.cached_blocks()[last] == [3, 4]
    kv.add_request("z", COMMON + [1])
    assert kv.get_computed_blocks("z") == ([1, 2, 3], 48)
    check_kv_invariants(kv, [x, y, "z"])


def test_k5_cache_salt_isolates(backend: ModuleType) -> None:
    kv = backend.KVCacheManager(num_blocks=11, block_size=16, max_model_len=4096)
    tokens = list(range(40))
    expected = [
        ("A", 0, [1, 2, 3]),
        ("B", 0, [3, 4, 5]),
        ("A", 32, [1, 2, 5]),
        (None, 0, [5, 6, 7]),
    ]
    for salt, want_hit, want_table in expected:
        rid, _, hit, _ = admit(kv, tokens, salt=salt)
        assert (hit, kv.get_block_ids(rid)) == (want_hit, want_table), salt
        kv.free(rid)
        kv.remove_request(rid)
    check_kv_invariants(kv, [])


def test_k6_refusal_changes_nothing(backend: ModuleType) -> None:
    kv = backend.KVCacheManager(num_blocks=6, block_size=16, max_model_len=4096)
    a, _, _, new = admit(kv, COMMON + [1])
    assert new == [1, 2, 3, 4]
    kv.free(a)
    assert kv.free_block_ids() == [4, 5, 3, 2, 1]
    big, _, _, new = admit(kv, list(range(2000, 2016)))
    assert new == [4] and kv.num_free_blocks == 4

    kv.add_request("b", COMMON + list(range(3000, 3040)))
    hits, hit = kv.get_computed_blocks("b")
    assert (hits, hit) == ([1, 2, 3], 48)
    assert kv.block_ref_cnts()[1:4] == [0, 0, 0]
    before = (kv.free_block_ids(), kv.block_ref_cnts(), kv.cached_blocks())
    # 3 new + 3 evictable hits = 6 > 4 free.
    assert kv.allocate_slots("b", 40, 48, hits, full_sequence_must_fit=True) is None
    assert kv.allocate_slots("b", 40, 48, hits) is None
    assert (kv.free_block_ids(), kv.block_ref_cnts(), kv.cached_blocks()) == before
    assert kv.free_block_ids() == [5, 3, 2, 1]
    assert kv.get_block_ids("b") == [] and kv.num_computed_tokens("b") == 0
    check_kv_invariants(kv, [a, big, "b"])


def test_admission_gate_counts_the_whole_sequence(backend: ModuleType) -> None:
    # Q13: a chunk that fits is refused when the whole known sequence does not.
    kv = backend.KVCacheManager(num_blocks=5, block_size=4, max_model_len=64)
    kv.add_request("r", list(range(20)))  # needs 5 blocks, 4 usable
    assert kv.allocate_slots("r", 4, full_sequence_must_fit=True) is None
    assert kv.num_free_blocks == 4
    assert kv.allocate_slots("r", 4) == [1]


def test_reset_is_refused_while_blocks_are_held(backend: ModuleType) -> None:
    kv = backend.KVCacheManager(num_blocks=11, block_size=16, max_model_len=4096)
    r, *_ = admit(kv, COMMON + [1])
    cached = kv.cached_blocks()
    assert len(cached) == 3
    assert kv.reset_prefix_cache() is False
    assert kv.cached_blocks() == cached
    assert kv.make_prefix_cache_stats().reset is False
    kv.free(r)
    assert kv.reset_prefix_cache() is True
    assert kv.cached_blocks() == {} and all(kv.block_hash(b) is None for b in range(11))
    assert kv.make_prefix_cache_stats().reset is True
    kv.add_request("again", COMMON + [1])
    assert kv.get_computed_blocks("again") == ([], 0)
    check_kv_invariants(kv, [r, "again"])


def test_prefix_cache_stats_are_taken_and_reset(backend: ModuleType) -> None:
    kv = backend.KVCacheManager(num_blocks=11, block_size=16, max_model_len=4096)
    kv.add_request("a", COMMON + [1])
    kv.add_request("b", COMMON + [2, 3])
    kv.record_prefix_cache_stats("a", 0)
    kv.record_prefix_cache_stats("b", 48)
    kv.record_prefix_cache_stats("b", 32, preempted=True)
    s = kv.make_prefix_cache_stats()
    assert (s.requests, s.queries, s.hits) == (2, 49 + 50, 48)
    assert (s.preempted_requests, s.preempted_queries, s.preempted_hits) == (1, 50, 32)
    s = kv.make_prefix_cache_stats()
    assert (s.requests, s.queries, s.hits, s.preempted_requests) == (0, 0, 0, 0)


def test_stats_stay_zero_with_caching_off(backend: ModuleType) -> None:
    kv = backend.KVCacheManager(11, 16, 4096, enable_prefix_caching=False)
    kv.add_request("a", COMMON)
    kv.record_prefix_cache_stats("a", 0)
    assert kv.make_prefix_cache_stats().requests == 0


def test_output_tokens_extend_the_hash_chain(backend: ModuleType) -> None:
    # A decode that completes a block caches it, so a later request whose
    # prompt is that prompt + output hits it.
    kv = backend.KVCacheManager(num_blocks=11, block_size=4, max_model_len=64)
    r, _, _, new = admit(kv, [1, 2, 3, 4, 5, 6, 7])
    assert new == [1, 2] and kv.num_cached_blocks(r) == 1
    kv.set_num_computed_tokens(r, 7)
    kv.append_token_ids(r, [8])
    assert len(kv.block_hashes(r)) == 2
    assert kv.allocate_slots(r, 1) == []
    assert kv.num_cached_blocks(r) == 2
    kv.add_request("follow", [1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert kv.get_computed_blocks("follow") == ([1, 2], 8)
    check_kv_invariants(kv, [r, "follow"])
