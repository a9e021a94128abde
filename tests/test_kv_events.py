"""KV-cache events (docs/scheduling.md §7.12) on the core and the twin:
stores when blocks are cached, evictions in pop order, hits reported at every
lookup for requests that ask, resets; nothing when not enabled. The drop-in's
conversion to vLLM's events is checked against vLLM in tests/vllm_dropin."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ironbatch import CacheConfig, KVCacheGroup, SchedulerConfig, reference
from ironbatch.core_scheduler import CoreScheduler
from ironbatch.reference.request import NewRequest, RequestStatus, StopRules

from scheduler_helpers import kv_events


def build(backend: str) -> Any:
    sc = SchedulerConfig(max_model_len=2048)
    cc = CacheConfig(num_blocks=6, block_size=16)
    return CoreScheduler(sc, cc) if backend == "rust" else reference.Scheduler(sc, cc)


def add(s: Any, rid: str, tokens: list[int], report_hits: bool = False) -> int:
    if isinstance(s, CoreScheduler):
        return s.add_request(
            request_id=rid,
            prompt_token_ids=tokens,
            max_tokens=40,
            min_tokens=0,
            eos_token_id=2,
            stop_token_ids=[],
            repetition_detection=None,
            priority=0,
            arrival_time=0.0,
            cache_salt=None,
            report_hits=report_hits,
        )
    stop = StopRules(max_tokens=40, min_tokens=0, eos_token_id=2, stop_token_ids=[])
    return s.add_request(NewRequest(rid, tokens, stop, report_hits=report_hits))


def step(s: Any) -> None:
    """schedule(), then every sampling request samples token 100."""
    out = s.schedule()
    if isinstance(s, CoreScheduler):
        samples = out.columns()["samples"]
        s.update_from_output(out, np.where(samples, 100, -1).astype(np.int64), None)
    else:
        tokens = [100 for e in out.entries if e.samples]
        offsets = [0]
        for e in out.entries:
            offsets.append(offsets[-1] + e.samples)
        s.update_from_output(out, tokens, offsets)


def finish(s: Any, rids: list[str]) -> None:
    if isinstance(s, CoreScheduler):
        s.finish_requests(rids, "FINISHED_ABORTED")
    else:
        s.finish_requests(rids, RequestStatus.FINISHED_ABORTED)


@pytest.mark.parametrize("backend", ["rust", "python"])
def test_events_follow_caching_eviction_lookups_and_resets(backend: str) -> None:
    quiet = build(backend)
    add(quiet, "x", list(range(3, 35)))
    step(quiet)
    assert kv_events(quiet) == []  # not enabled: nothing logged
    s = build(backend)
    s.enable_kv_events()
    a = add(s, "a", list(range(3, 35)))
    step(s)  # 32 prompt tokens: two full blocks, cached when allocated
    assert kv_events(s) == [("stored", a, 0, [1, 2], 0)]
    step(s)  # its first output starts block 3: nothing full yet
    assert kv_events(s) == []
    # Freed last block first: unhashed 3 to the head, cached 2 and 1 to the tail.
    finish(s, ["a"])
    b = add(s, "b", list(range(60, 124)))
    step(s)  # four blocks from [3, 4, 5, 2, 1]: reusing 2 evicts it
    assert kv_events(s) == [("removed", None, 0, 2), ("stored", b, 0, [3, 4, 5, 2], 0)]
    c = add(s, "c", list(range(60, 124)), report_hits=True)
    s.schedule()  # b's next block evicts 1; c finds 3 blocks but no room
    assert kv_events(s) == [("removed", None, 0, 1), ("hit", c, 0, 3)]
    finish(s, ["b", "c"])
    assert s.reset_prefix_cache(False)
    assert kv_events(s) == [("cleared", None, 0, None)]


@pytest.mark.parametrize("backend", ["rust", "python"])
def test_a_prompt_tail_inside_a_larger_block_is_a_second_key(backend: str) -> None:
    """Beside groups of different block sizes (docs/scheduling.md §7.16): a
    3-token window in blocks of 2 and full attention in blocks of 4 hash
    every 2 tokens and cache up to multiples of 4. A 7-token prompt's tail
    (its first 6 tokens, 3 hash blocks) ends inside full attention's block
    1; that block is cached only once its tokens fill it, so the tail's key
    comes after the block's own as a second key (vLLM's secondary partial
    key, its own BlockStored of one hash block). Evicting the block ends
    both keys (one Removed here; vLLM's two BlockRemoved)."""
    groups = (KVCacheGroup("sliding_window", 3, block_size=2), KVCacheGroup("full", block_size=4))
    sc = SchedulerConfig(max_model_len=64)
    cc = CacheConfig(num_blocks=11, block_size=2, kv_cache_groups=groups)
    s = CoreScheduler(sc, cc) if backend == "rust" else reference.Scheduler(sc, cc)
    s.enable_kv_events()
    a = add(s, "a", list(range(3, 10)))
    step(s)  # 7 tokens computed: cached up to 4, the window keeps block 1 alone
    assert kv_events(s) == [("stored", a, 0, [0, 2], 0), ("stored", a, 0, [5], 1)]
    step(s)  # 8: full attention's block 1 fills, then takes the tail's key
    expected = [
        ("stored", a, 2, [0, 0], 0),
        ("stored", a, 1, [6], 1),
        ("stored_key", a, 3, [6], 1),
    ]
    assert kv_events(s) == expected
    step(s)  # nothing new fills; the tail's key is not stored twice
    assert kv_events(s) == []
    finish(s, ["a"])
    # A 12-token prompt takes the freed blocks, evicting cached 2 and 6 (6
    # with its second key), and keys its own tail (10 tokens) in block 6.
    c = add(s, "c", list(range(50, 62)))
    step(s)
    assert kv_events(s) == [
        ("removed", None, 0, 2),
        ("removed", None, 0, 6),
        ("stored", c, 0, [0, 0, 0, 7, 0, 0], 0),
        ("stored", c, 0, [10, 2, 6], 1),
        ("stored_key", c, 5, [6], 1),
    ]


@pytest.mark.parametrize("backend", ["rust", "python"])
def test_request_events_mark_lookups_and_releases_among_the_others(backend: str) -> None:
    """Request events (what vLLM's auxiliary-output connector hears of): a
    lookup before the hit is found, and a release, finished or preempted,
    with the tokens computed, before the blocks go; in order among the
    cache's events, and logged without them when only they are enabled."""
    s = build(backend)
    s.enable_request_events()
    a = add(s, "a", list(range(3, 35)))
    step(s)
    assert kv_events(s) == [("lookup", a, 0, None)]  # its store not asked for
    s.enable_kv_events()
    step(s)  # a decode: no lookup
    assert kv_events(s) == []
    finish(s, ["a"])  # 32 prompt tokens and its first output computed
    assert kv_events(s) == [("released", a, 0, 33)]
    b = add(s, "b", list(range(60, 124)))
    step(s)  # looked up before its allocation evicts a's cached block 2
    assert kv_events(s) == [
        ("lookup", b, 0, None),
        ("removed", None, 0, 2),
        ("stored", b, 0, [3, 4, 5, 2], 0),
    ]
    assert s.reset_prefix_cache(True)  # b preempted (64 computed), then the reset
    assert kv_events(s) == [("released", b, 0, 64), ("cleared", None, 0, None)]
