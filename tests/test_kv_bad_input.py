"""Bad input gets a clear ValueError/TypeError naming the field, never a
panic, and leaves the pool exactly as it was."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np
import pytest

from kv_invariants import check_kv_invariants


def snapshot(kv: Any, request_ids: list[str]) -> tuple:
    return (
        kv.free_block_ids(),
        kv.block_ref_cnts(),
        kv.cached_blocks(),
        kv.num_free_blocks,
        len(kv),
        [
            (
                kv.get_block_ids(r),
                kv.num_cached_blocks(r),
                kv.num_tokens(r),
                kv.num_computed_tokens(r),
                kv.block_hashes(r),
            )
            for r in request_ids
        ],
    )


@pytest.fixture
def kv(backend: ModuleType) -> Any:
    """A manager holding one admitted request "a" and one freed, cached "b"."""
    kv = backend.KVCacheManager(num_blocks=9, block_size=4, max_model_len=32)
    kv.add_request("a", list(range(10)))
    assert kv.allocate_slots("a", 10) == [1, 2, 3]
    kv.set_num_computed_tokens("a", 10)
    kv.add_request("b", list(range(100, 109)))
    assert kv.allocate_slots("b", 9) == [4, 5, 6]
    kv.free("b")
    return kv


@pytest.mark.parametrize(
    ("kwargs", "exc", "field"),
    [
        ({"num_blocks": 1}, ValueError, "num_blocks"),
        ({"num_blocks": 0}, ValueError, "num_blocks"),
        ({"num_blocks": -5}, ValueError, "num_blocks"),
        ({"num_blocks": 2**24 + 1}, ValueError, "num_blocks"),
        ({"num_blocks": 2**40}, ValueError, "num_blocks"),
        ({"num_blocks": 2**80}, ValueError, "num_blocks"),
        ({"num_blocks": 4.0}, TypeError, "num_blocks"),
        ({"block_size": 0}, ValueError, "block_size"),
        ({"block_size": -16}, ValueError, "block_size"),
        ({"block_size": "16"}, TypeError, "block_size"),
        ({"max_model_len": 0}, ValueError, "max_model_len"),
        ({"max_model_len": None}, TypeError, "max_model_len"),
    ],
)
def test_bad_config(backend: ModuleType, kwargs: dict, exc: type, field: str) -> None:
    args = {"num_blocks": 8, "block_size": 16, "max_model_len": 64, **kwargs}
    with pytest.raises(exc, match=field):
        backend.KVCacheManager(**args)


@pytest.mark.parametrize(
    ("tokens", "exc", "needle"),
    [
        ([1, -1, 2], ValueError, "prompt_token_ids\\[1\\] = -1"),
        ([1, 2**32], ValueError, "prompt_token_ids\\[1\\] = 4294967296"),
        ([2**64 + 3], ValueError, "prompt_token_ids\\[0\\]"),
        ([1, 2.5], TypeError, "prompt_token_ids\\[1\\]"),
        ([1, "7"], TypeError, "prompt_token_ids\\[1\\]"),
        ([None], TypeError, "prompt_token_ids\\[0\\]"),
        ("abc", TypeError, "prompt_token_ids"),
        (b"abc", TypeError, "prompt_token_ids"),
        (7, TypeError, "prompt_token_ids"),
        ({1, 2}, TypeError, "prompt_token_ids"),
        ([], ValueError, "prompt_token_ids"),
        (list(range(33)), ValueError, "max_model_len"),
    ],
)
def test_bad_prompt(kv: Any, tokens: object, exc: type, needle: str) -> None:
    before = snapshot(kv, ["a", "b"])
    with pytest.raises(exc, match=needle):
        kv.add_request("c", tokens)
    assert "c" not in kv
    assert snapshot(kv, ["a", "b"]) == before


def test_duplicate_and_unknown_ids(kv: Any) -> None:
    before = snapshot(kv, ["a", "b"])
    with pytest.raises(ValueError, match="'a'|\"a\""):
        kv.add_request("a", [1, 2])
    for call in (
        lambda: kv.free("nope"),
        lambda: kv.remove_request("nope"),
        lambda: kv.allocate_slots("nope", 1),
        lambda: kv.get_computed_blocks("nope"),
        lambda: kv.append_token_ids("nope", [1]),
        lambda: kv.set_num_computed_tokens("nope", 0),
        lambda: kv.record_prefix_cache_stats("nope", 0),
    ):
        with pytest.raises(ValueError, match="nope"):
            call()
    with pytest.raises(TypeError):
        kv.free(17)
    assert snapshot(kv, ["a", "b"]) == before


@pytest.mark.parametrize(
    ("args", "kwargs", "exc", "needle"),
    [
        (("a", -1), {}, ValueError, "num_new_tokens"),
        (("a", 2**70), {}, ValueError, "num_new_tokens"),
        (("a", 1.5), {}, TypeError, "num_new_tokens"),
        (("a", 0), {}, ValueError, "both 0"),
        (("a", 1, -4), {}, ValueError, "num_new_computed_tokens"),
        (("a", 1, 4, [1]), {}, ValueError, "new_computed_blocks"),  # table not empty
        (("b", 1, 4), {}, ValueError, "num_new_computed_tokens"),  # no blocks for the hits
        (("b", 1, 0, [4]), {}, ValueError, "num_new_computed_tokens"),
        (("b", 1, 4, [0]), {}, ValueError, "new_computed_blocks\\[0\\] = 0"),  # the null block
        (("b", 1, 4, [9]), {}, ValueError, "new_computed_blocks\\[0\\] = 9"),  # out of the pool
        (("b", 1, 4, [-1]), {}, ValueError, "new_computed_blocks\\[0\\]"),
        (("b", 1, 4, [5]), {}, ValueError, "new_computed_blocks\\[0\\] = 5"),  # b's block 1
        (("b", 1, 8, [4, 4]), {}, ValueError, "new_computed_blocks\\[1\\] = 4"),
        (("b", 1, 4, [1]), {}, ValueError, "new_computed_blocks\\[0\\] = 1"),  # a's block
        (("b", 1, 4, ["x"]), {}, TypeError, "new_computed_blocks\\[0\\]"),
        (("b", 1, 12, [4, 5, 6]), {}, ValueError, "hit tokens"),  # block 6 is not full anyway
    ],
)
def test_bad_allocate_slots(kv: Any, args: tuple, kwargs: dict, exc: type, needle: str) -> None:
    before = snapshot(kv, ["a", "b"])
    with pytest.raises(exc, match=needle):
        kv.allocate_slots(*args, **kwargs)
    assert snapshot(kv, ["a", "b"]) == before
    check_kv_invariants(kv, ["a", "b"])


def test_hits_may_not_cover_the_whole_sequence(backend: ModuleType) -> None:
    kv = backend.KVCacheManager(num_blocks=9, block_size=4, max_model_len=32)
    kv.add_request("x", list(range(8)))
    assert kv.allocate_slots("x", 8) == [1, 2]
    kv.free("x")
    kv.add_request("y", list(range(8)))
    assert kv.get_computed_blocks("y") == ([1], 4)  # capped at num_tokens - 1
    before = snapshot(kv, ["x", "y"])
    with pytest.raises(ValueError, match="hit tokens"):
        kv.allocate_slots("y", 0, 8, [1, 2])
    assert snapshot(kv, ["x", "y"]) == before


def test_bad_appends_and_computed_counts(kv: Any) -> None:
    before = snapshot(kv, ["a", "b"])
    with pytest.raises(ValueError, match="token_ids\\[0\\] = -3"):
        kv.append_token_ids("a", [-3])
    with pytest.raises(ValueError, match="max_model_len"):
        kv.append_token_ids("a", list(range(23)))
    with pytest.raises(ValueError, match="num_computed_tokens"):
        kv.set_num_computed_tokens("a", 11)  # beyond the known tokens
    with pytest.raises(ValueError, match="num_computed_tokens"):
        kv.set_num_computed_tokens("b", 1)  # b holds no blocks
    with pytest.raises(ValueError, match="num_computed_tokens"):
        kv.set_num_computed_tokens("a", -1)
    with pytest.raises(ValueError, match="num_hit_tokens"):
        kv.record_prefix_cache_stats("a", 11)
    with pytest.raises(ValueError, match="block_id"):
        kv.block_hash(9)
    assert snapshot(kv, ["a", "b"]) == before
    assert kv.make_prefix_cache_stats().requests == 0


@pytest.mark.parametrize(
    ("method", "ids", "exc", "needle"),
    [
        ("free_blocks", [0], ValueError, "block_ids\\[0\\] = 0"),
        ("free_blocks", [2], ValueError, "block_ids\\[0\\] = 2"),  # free already
        ("free_blocks", [1, 1], ValueError, "not held"),  # held once, freed twice
        ("free_blocks", [1, 7], ValueError, "block_ids\\[1\\] = 7"),
        ("free_blocks", [-1], ValueError, "block_ids\\[0\\]"),
        ("touch", [0], ValueError, "block_ids\\[0\\] = 0"),
        ("touch", [7], ValueError, "block_ids\\[0\\] = 7"),
        ("touch", [1, None], TypeError, "block_ids\\[1\\]"),
        ("touch", "12", TypeError, "block_ids"),
    ],
)
def test_block_pool_bad_input(
    backend: ModuleType, method: str, ids: object, exc: type, needle: str
) -> None:
    pool = backend.BlockPool(7)
    assert pool.get_new_blocks(1) == [1]
    before = (pool.free_block_ids(), pool.block_ref_cnts())
    with pytest.raises(exc, match=needle):
        getattr(pool, method)(ids)
    with pytest.raises(ValueError, match="6"):
        pool.get_new_blocks(6)
    with pytest.raises(ValueError, match="num_blocks"):
        pool.get_new_blocks(-1)
    assert (pool.free_block_ids(), pool.block_ref_cnts()) == before


def test_block_pool_roundtrip(backend: ModuleType) -> None:
    pool = backend.BlockPool(7)
    assert pool.free_block_ids() == [1, 2, 3, 4, 5, 6]
    a = pool.get_new_blocks(3)
    assert a == [1, 2, 3] and pool.num_free_blocks == 3
    pool.touch([2, 5])  # 5 was free: it leaves the queue
    assert pool.free_block_ids() == [4, 6]
    assert pool.block_ref_cnts() == [0, 1, 2, 1, 0, 1, 0]
    pool.free_blocks([3, 2, 1])  # unhashed: to the head, in the order given
    assert pool.free_block_ids() == [3, 1, 4, 6]
    pool.free_blocks([5, 2])
    assert pool.free_block_ids() == [5, 2, 3, 1, 4, 6]
    assert pool.usage == 0.0 and pool.reset_prefix_cache() is True


def test_numpy_ints_are_accepted(backend: ModuleType) -> None:
    kv = backend.KVCacheManager(np.int64(9), np.int32(4), 32)
    kv.add_request("n", np.arange(10, dtype=np.int64))
    assert kv.allocate_slots("n", np.int64(10)) == [1, 2, 3]
