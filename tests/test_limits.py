"""One set of size limits (``rust/src/limits.rs``, mirrored by the twin's
``reference/limits.py``): both backends accept and reject the same boundary
values, nothing past a limit can wrap the core's arithmetic, and prefix-hit
validation holds at every accepted size."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import ironbatch
import ironbatch.reference as twin
from ironbatch import CacheConfig, Request, SamplingParams, Scheduler, SchedulerConfig
from ironbatch.reference.limits import (
    MAX_BLOCK_SIZE,
    MAX_MODEL_LEN,
    MAX_NUM_BATCHED_TOKENS,
    MAX_NUM_BLOCKS,
    MAX_TOKENS,
)


def outcome(call: Callable[[], Any]) -> str:
    """ "ok", or the kind of error (a UnicodeEncodeError is a ValueError)."""
    try:
        call()
    except ValueError:
        return "ValueError"
    except TypeError:
        return "TypeError"
    except OverflowError:
        return "OverflowError"
    return "ok"


def both_kv(**kw: Any) -> list[str]:
    return [outcome(lambda m=m: m.KVCacheManager(**kw)) for m in (ironbatch, twin)]


KV_SIZES = [
    dict(block_size=0),
    dict(block_size=1),
    dict(block_size=MAX_BLOCK_SIZE),
    dict(block_size=MAX_BLOCK_SIZE + 1),
    dict(block_size=2**62),
    dict(block_size=2**64),
    dict(block_size=-1),
    dict(max_model_len=0),
    dict(max_model_len=1),
    dict(max_model_len=MAX_MODEL_LEN),
    dict(max_model_len=MAX_MODEL_LEN + 1),
    dict(num_blocks=1),
    dict(num_blocks=2),
    dict(num_blocks=MAX_NUM_BLOCKS + 1),
    dict(num_blocks=2**63),
]


@pytest.mark.parametrize("change", KV_SIZES, ids=[str(c) for c in KV_SIZES])
def test_kv_cache_managers_agree_on_sizes(change: dict[str, int]) -> None:
    kw = dict(num_blocks=8, block_size=16, max_model_len=64, enable_prefix_caching=True) | change
    rust, python = both_kv(**kw)
    assert rust == python
    past_a_limit = (
        change.get("block_size", 1) > MAX_BLOCK_SIZE
        or change.get("max_model_len", 1) > MAX_MODEL_LEN
        or change.get("num_blocks", 2) > MAX_NUM_BLOCKS
    )
    if past_a_limit:
        assert rust == "ValueError"


@pytest.mark.parametrize(
    ("call", "args"),
    [
        ("add_request", ("\ud800", [1, 2, 3])),
        ("add_request", ("a", [1, 2, 3], "salt\udfff")),
        ("add_request", ("a", [2**32])),
        ("allocate_slots", ("r", 2**63)),
        ("allocate_slots", ("r", 2**64)),
        ("allocate_slots", ("r", 5, 2**63, [1])),
    ],
)
def test_kv_cache_managers_agree_on_arguments(call: str, args: tuple[Any, ...]) -> None:
    results = []
    for m in (ironbatch, twin):
        kv = m.KVCacheManager(num_blocks=8, block_size=16, max_model_len=64)
        kv.add_request("r", list(range(20)))
        results.append(outcome(lambda kv=kv: getattr(kv, call)(*args)))
        assert kv.num_free_blocks == 7  # a refused call changes nothing
    assert results[0] == results[1] != "ok"


def test_a_huge_token_count_is_capped_at_max_model_len_by_both() -> None:
    for m in (ironbatch, twin):
        kv = m.KVCacheManager(num_blocks=8, block_size=16, max_model_len=64)
        kv.add_request("r", list(range(20)))
        assert kv.allocate_slots("r", 2**63 - 1) == [1, 2, 3, 4]  # 64 tokens, no more


@pytest.mark.parametrize("module", [ironbatch, twin], ids=["rust", "python"])
@pytest.mark.parametrize("block_size", [1, 16, MAX_BLOCK_SIZE])
def test_prefix_hits_must_be_the_requests_own_cached_blocks(module: Any, block_size: int) -> None:
    """At any accepted block size, hits past the request's full blocks, or
    blocks it does not own the hashes of, are refused."""
    kv = module.KVCacheManager(num_blocks=8, block_size=block_size, max_model_len=MAX_MODEL_LEN)
    kv.add_request("r", [1, 2, 3, 4, 5])
    for hits in ([1], [1, 1, 1, 1], [7] * 4):
        with pytest.raises(ValueError, match="new_computed_blocks|hit tokens"):
            kv.allocate_slots("r", 5, len(hits) * block_size, hits)
    assert kv.num_free_blocks == 7


SCHEDULER_SIZES = [
    dict(block_size=MAX_BLOCK_SIZE, num_blocks=8, max_model_len=64),
    dict(block_size=MAX_BLOCK_SIZE + 1, num_blocks=8, max_model_len=64),
    dict(block_size=2**62, num_blocks=8, max_model_len=64),
    dict(block_size=MAX_BLOCK_SIZE, num_blocks=2049, max_model_len=MAX_MODEL_LEN),
    dict(block_size=16, num_blocks=8, max_model_len=MAX_MODEL_LEN + 1),
    dict(block_size=16, num_blocks=8, max_model_len=64, batched=MAX_NUM_BATCHED_TOKENS + 1),
]


def make(backend: str, block_size: int, num_blocks: int, max_model_len: int, batched: int = 64):
    return Scheduler(
        SchedulerConfig(
            max_model_len=max_model_len, max_num_seqs=4, max_num_batched_tokens=batched
        ),
        CacheConfig(num_blocks=num_blocks, block_size=block_size),
        backend=backend,
    )


@pytest.mark.parametrize("sizes", SCHEDULER_SIZES, ids=[str(s) for s in SCHEDULER_SIZES])
def test_schedulers_agree_at_the_limits(sizes: dict[str, int]) -> None:
    results, slots = [], []
    for backend in ("rust", "python"):
        made: list[Scheduler] = []
        results.append(outcome(lambda b=backend, m=made: m.append(make(b, **sizes))))
        if made:
            sched = made[0]
            sched.add_request(Request("a", [1, 2, 3], SamplingParams(max_tokens=MAX_TOKENS)))
            out = sched.schedule()
            assert (out.slot_mapping >= 0).all()  # no wrapped slot
            slots.append(out.slot_mapping.tolist())
    assert results[0] == results[1]
    assert slots[:1] == slots[1:]


@pytest.mark.parametrize("backend", ["rust", "python"])
@pytest.mark.parametrize(
    ("make_request", "error"),
    [
        (lambda: Request("\ud800", [1, 2]), ValueError),
        (lambda: Request("a", [1, 2], cache_salt="\ud800"), ValueError),
        (lambda: Request("a", [1, 2], SamplingParams(max_tokens=MAX_TOKENS + 1)), ValueError),
        (lambda: Request("a", [1, 2], SamplingParams(max_tokens=2**64)), ValueError),
        (lambda: Request("a", [1, 2], priority=2**63), ValueError),
        (lambda: Request(7, [1, 2]), TypeError),  # type: ignore[arg-type]
    ],
)
def test_bad_requests_are_refused_before_either_backend(
    backend: str, make_request: Callable[[], Request], error: type
) -> None:
    sched = make(backend, 16, 8, 64)
    with pytest.raises(error):
        sched.add_request(make_request())
    assert not sched.has_unfinished_requests()
