"""Blocks pinned from outside the scheduler (docs/scheduling.md §4.19): a KV
connector that copies blocks out of the pool holds them (vLLM's
``BlockPool.touch``) and lets them go (``free_blocks``), on both backends."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler_helpers import BACKENDS, make, req


def _finished_with_its_block_pinned(backend: str) -> tuple[Any, int, int]:
    """A 20-token prompt in blocks of 16 that ends after one token, its
    full (cached) first block pinned while it ran: the scheduler, that
    block, and its unhashed tail block."""
    s = make(backend, num_blocks=8, max_model_len=64)
    s.add_request(req("r", range(1, 21), max_tokens=1))
    out = s.schedule()
    cached, tail = s.debug_state()["requests"]["r"]["tables"][0]
    s.pin_blocks([cached, 0])  # the null block is passed over
    s.update_from_output(out, {"r": [7]})
    return s, cached, tail


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_pinned_block_stays_held_until_unpinned(backend: str) -> None:
    s, cached, tail = _finished_with_its_block_pinned(backend)
    state = s.debug_state()
    assert state["free_block_ids"][0] == tail, "the unhashed block, to the head"
    assert cached not in state["free_block_ids"]
    assert state["pinned_blocks"] == [(cached, 1)]
    assert not s.reset_prefix_cache(), "a pinned block is held"
    s.unpin_blocks([cached])
    state = s.debug_state()
    assert state["free_block_ids"][-1] == cached, "cached: to the tail"
    assert state["pinned_blocks"] == []
    assert s.reset_prefix_cache()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_pinned_free_block_leaves_the_queue_and_is_not_allocated(backend: str) -> None:
    """Pinning a free block takes it out of the free queue at once (vLLM's
    lazy CPU offload pins cached blocks straight from it)."""
    s, cached, _ = _finished_with_its_block_pinned(backend)
    s.unpin_blocks([cached])
    free = s.num_free_blocks
    s.pin_blocks([cached, cached])
    assert s.num_free_blocks == free - 1
    assert s.debug_state()["pinned_blocks"] == [(cached, 2)]
    s.unpin_blocks([cached])
    assert s.num_free_blocks == free - 1, "one pin left"
    s.unpin_blocks([cached])
    assert s.num_free_blocks == free


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("call", "ids", "error", "message"),
    [
        ("pin_blocks", [1, 8], ValueError, "block_ids\\[1\\] = 8 is not a usable block id"),
        ("pin_blocks", "12", TypeError, "block_ids must be an iterable of block ids, got str"),
        ("unpin_blocks", [3], ValueError, "block_ids\\[0\\] = 3 is pinned 0 time"),
        ("unpin_blocks", [-1], ValueError, "block_ids"),
    ],
    ids=["outside the pool", "a str", "not pinned", "negative"],
)
def test_bad_pins_are_refused_and_nothing_changes(
    backend: str, call: str, ids: Any, error: type[Exception], message: str
) -> None:
    s, cached, _ = _finished_with_its_block_pinned(backend)
    before = s.debug_state()
    with pytest.raises(error, match=message):
        getattr(s, call)(ids)
    after = s.debug_state()
    assert (after["pinned_blocks"], after["free_block_ids"]) == (
        before["pinned_blocks"],
        before["free_block_ids"],
    )
    with pytest.raises(ValueError, match="pinned 1 time\\(s\\), listed 2"):
        s.unpin_blocks([cached, cached])
    assert s.debug_state()["pinned_blocks"] == [(cached, 1)]
