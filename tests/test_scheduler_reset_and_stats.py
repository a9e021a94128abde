"""reset_prefix_cache with and without running requests, and make_stats."""

from __future__ import annotations

import pytest

from scheduler_helpers import BACKENDS, make, req, rows, step


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


def test_reset_is_refused_while_requests_hold_blocks(backend: str) -> None:
    s = make(backend, max_model_len=256)
    s.add_request(req("a", range(3, 40)))
    step(s)
    before = s.debug_state()
    assert s.reset_prefix_cache() is False
    assert s.debug_state() == before
    s.finish_requests(["a"])
    assert s.reset_prefix_cache() is True
    assert s.debug_state()["cached_blocks"] == []
    assert s.make_stats().prefix_cache_stats.reset is True


def test_reset_with_running_requests_preempts_and_drops_in_flight_output(backend: str) -> None:
    s = make(backend, max_model_len=256)
    for i in range(3):
        s.add_request(req(f"r{i}", [10 + i] * 20))
    step(s)
    out = s.schedule()  # a step in flight when the reset comes
    assert s.reset_prefix_cache(reset_running_requests=True) is True
    state = s.debug_state()
    # Popped from the back of running, each pushed at the front of waiting:
    # waiting keeps their running order.
    assert state["running"] == [] and state["waiting"] == ["r0", "r1", "r2"]
    assert all(
        r["status"] == "PREEMPTED" and r["num_computed_tokens"] == 0
        for r in state["requests"].values()
    )
    assert state["cached_blocks"] == [] and s.num_free_blocks == 9999
    # The in-flight output is dropped: no records, no tokens appended.
    assert list(s.update_from_output(out, {rid: [7] for rid in out.req_ids})) == []
    assert all(r["num_tokens"] == 21 for r in s.debug_state()["requests"].values())
    out = s.schedule()  # all three come back, recomputing their 21 tokens
    assert [(e[0], e[1], e[2]) for e in rows(out)] == [
        ("r0", 21, "resumed"),
        ("r1", 21, "resumed"),
        ("r2", 21, "resumed"),
    ]


def test_make_stats_counts_and_takes(backend: str) -> None:
    # S4's setting: b is preempted at step 2.
    s = make(backend, num_blocks=11, max_model_len=160, max_num_batched_tokens=512)
    s.add_request(req("a", range(3, 83), max_tokens=40))
    s.add_request(req("b", range(103, 183), max_tokens=40))
    step(s)
    step(s)
    stats = s.make_stats()
    assert (stats.num_running_reqs, stats.num_waiting_reqs, stats.num_preempted_reqs) == (1, 1, 1)
    assert stats.kv_cache_usage == pytest.approx(6 / 10)  # a holds 6 of the 10 usable blocks
    p = stats.prefix_cache_stats
    assert (p.requests, p.queries, p.hits) == (2, 160, 0)
    again = s.make_stats()
    assert again.num_preempted_reqs == 0 and again.prefix_cache_stats.requests == 0
