"""The scheduler acceptance scenarios of docs/scheduling.md §9.2 (S1–S7), whose expected
values are vLLM 0.33.0's own results, on both backends."""

from __future__ import annotations

import pytest

from ironbatch import RepetitionDetectionParams

from scheduler_helpers import BACKENDS, make, req, rows, step


def r(a: int, b: int) -> list[int]:
    return list(range(a, b + 1))


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.mark.parametrize("caching", [True, False])
def test_s1_threshold_chunking(backend: str, caching: bool) -> None:
    s = make(
        backend,
        caching=caching,
        max_num_batched_tokens=1024,
        long_prefill_token_threshold=400,
        max_model_len=2048,
        max_num_seqs=16,
    )
    for i in range(3):
        s.add_request(req(f"r{i}", [10 + i] * 800))
    out, _ = step(s)
    assert rows(out) == [
        ["r0", 400, "new", 0, r(1, 25)],
        ["r1", 400, "new", 0, r(26, 50)],
        ["r2", 224, "new", 0, r(51, 64)],
    ]
    out, updates = step(s)
    assert [(e[0], e[1], e[2], e[3]) for e in rows(out)] == [
        ("r0", 400, "running", 400),
        ("r1", 400, "running", 400),
        ("r2", 224, "running", 224),
    ]
    assert [u[0] for u in updates] == ["r0", "r1"]  # r2 is still prefilling
    out, _ = step(s)
    assert rows(out) == [
        ["r0", 1, "running", 800, [129]],
        ["r1", 1, "running", 800, [130]],
        ["r2", 352, "running", 448, r(131, 152)],
    ]
    out, _ = step(s)
    assert [(e[0], e[1]) for e in rows(out)] == [("r0", 1), ("r1", 1), ("r2", 1)]
    assert rows(out)[2][4] == [153]


@pytest.mark.parametrize("chunked", [False, True])
def test_s2_chunked_prefill_off_blocks_the_queue(backend: str, chunked: bool) -> None:
    s = make(
        backend, max_num_batched_tokens=1024, max_model_len=1024, enable_chunked_prefill=chunked
    )
    for i, n in enumerate([800, 800, 10, 10]):
        s.add_request(req(f"r{i}", [10 + i] * n))
    out1, _ = step(s)
    out2, _ = step(s)
    if not chunked:  # r1 does not fit the 224 tokens left, and r2, r3 wait behind it
        assert rows(out1) == [["r0", 800, "new", 0, r(1, 50)]]
        assert rows(out2) == [
            ["r0", 1, "running", 800, [51]],
            ["r1", 800, "new", 0, r(52, 101)],
            ["r2", 10, "new", 0, [102]],
            ["r3", 10, "new", 0, [103]],
        ]
    else:
        assert rows(out1) == [["r0", 800, "new", 0, r(1, 50)], ["r1", 224, "new", 0, r(51, 64)]]
        assert rows(out2) == [
            ["r0", 1, "running", 800, [65]],
            ["r1", 576, "running", 224, r(66, 101)],
            ["r2", 10, "new", 0, [102]],
            ["r3", 10, "new", 0, [103]],
        ]


def test_s3_same_step_prefix_sharing(backend: str) -> None:
    s = make(backend)
    prompt = r(3, 102)
    s.add_request(req("a", prompt))
    s.add_request(req("b", prompt))
    out, _ = step(s)
    # Blocks are hash-cached at allocation, so b hits a's blocks at once (Q8).
    assert rows(out) == [["a", 100, "new", 0, r(1, 7)], ["b", 4, "new", 96, [1, 2, 3, 4, 5, 6, 8]]]
    out, _ = step(s)
    assert rows(out) == [["a", 1, "running", 100, []], ["b", 1, "running", 100, []]]
    s.add_request(req("c", prompt))
    out, _ = step(s)
    assert rows(out) == [
        ["a", 1, "running", 101, []],
        ["b", 1, "running", 101, []],
        ["c", 4, "new", 96, [1, 2, 3, 4, 5, 6, 9]],
    ]


def test_skip_reading_prefix_cache_computes_all_and_still_caches(backend: str) -> None:
    """A request that skips reading the cache (vLLM: it wants prompt
    logprobs) gets no hits and is left out of the prefix-cache stats, yet its
    full blocks are cached: duplicates of cached hashes, which a later reader
    does not pick over the blocks cached first."""
    s = make(backend)
    prompt = r(3, 102)
    s.add_request(req("a", prompt))
    step(s)
    s.make_stats()  # drop a's admission from the stats
    s.add_request(req("b", prompt, skip_reading_prefix_cache=True))
    out, _ = step(s)
    assert rows(out)[1] == ["b", 100, "new", 0, r(8, 14)]
    stats = s.make_stats().prefix_cache_stats
    assert (stats.requests, stats.queries, stats.hits) == (0, 0, 0)
    s.finish_requests(["a"])  # a's unhashed last block 7 is reused first
    s.add_request(req("c", prompt))
    out, _ = step(s)
    assert rows(out)[1] == ["c", 4, "new", 96, [1, 2, 3, 4, 5, 6, 7]]
    stats = s.make_stats().prefix_cache_stats
    assert (stats.requests, stats.queries, stats.hits) == (1, 100, 96)


def test_a_grammar_holds_its_request_until_a_pass_finds_it_compiled(backend: str) -> None:
    """A structured-output request waits for its grammar without blocking the
    queue (vLLM skips it and keeps its place), is counted as skipped from the
    start, and is admitted as new once a pass finds the grammar compiled."""
    s = make(backend)
    s.add_request(req("a", r(3, 22)))
    s.add_request(req("b", r(30, 49), structured_output=True))
    s.add_request(req("c", r(60, 80)))
    assert s.make_stats().num_skipped_waiting_reqs == 1
    out, _ = step(s)
    assert rows(out) == [["a", 20, "new", 0, [1, 2]], ["c", 21, "new", 0, [3, 4]]]
    assert out.grammar_released_req_ids == [] and not out.has_structured_output_requests
    s.report_grammar("b")
    out, _ = step(s)
    assert out.grammar_released_req_ids == ["b"]
    assert rows(out)[2] == ["b", 20, "new", 0, [5, 6]]
    assert out.has_structured_output_requests  # b samples in this step
    assert not out.pending_structured_output_tokens  # sync: nothing in flight
    assert s.make_stats().num_skipped_waiting_reqs == 0
    with pytest.raises(ValueError, match="already in use"):
        s.report_grammar("b", compiled=False)
    with pytest.raises(ValueError, match="no grammar"):
        s.report_grammar("a")


def test_a_failed_grammar_is_reported_each_step_until_ended(backend: str) -> None:
    s = make(backend)
    s.add_request(req("b", r(30, 49), structured_output=True))
    s.report_grammar("b", compiled=False)
    for _ in range(2):
        out, _ = step(s)
        assert len(out) == 0 and out.grammar_failed_req_ids == ["b"]
    s.finish_requests(["b"], "FINISHED_ERROR")
    assert not s.has_unfinished_requests()
    assert s.make_stats().num_skipped_waiting_reqs == 0


def test_rejected_tokens_end_the_request_with_an_error(
    backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The caller's grammar judges the tokens a structured-output request
    kept; a rejection (or a check that raises) beats any stop, as in vLLM."""
    s = make(backend)
    for rid in "abc":
        s.add_request(req(rid, r(3, 22), structured_output=rid != "c"))
        if rid != "c":
            s.report_grammar(rid)
    asked: list[tuple[str, list[int]]] = []

    def accept(rid: str, kept: list[int]) -> bool:
        asked.append((rid, kept))
        if rid == "b":
            raise RuntimeError("grammar crashed")
        return kept != [2]

    out = s.schedule()
    # a samples EOS (a stop) and its grammar rejects it; c has no grammar.
    updates = s.update_from_output(out, {"a": [2], "b": [7], "c": [2]}, accept=accept)
    assert asked == [("a", [2]), ("b", [7])]
    assert [(u.request_id, u.finish_reason) for u in updates] == [
        ("a", "error"),
        ("b", "error"),
        ("c", "stop"),
    ]
    assert "accept() raised for request 'b'" in caplog.text
    assert not s.has_unfinished_requests()


def test_prefill_cadence_holds_admissions_between_prefill_steps(backend: str) -> None:
    """prefill_schedule_interval=3: after a step that carried prefill work,
    the next two executed steps hold prefills while something decodes; a
    release that cannot drain the queue ends the holding (vLLM 0.33)."""
    s = make(backend, prefill_schedule_interval=3, max_num_seqs=2)
    s.add_request(req("a", r(3, 12), max_tokens=50))
    out, _ = step(s)  # step 1 carries a's prompt
    s.add_request(req("b", r(20, 29), max_tokens=50))
    s.add_request(req("c", r(40, 49), max_tokens=50))
    for _ in range(2):  # steps 2 and 3: a decodes, b waits
        out, _ = step(s)
        assert [e[0] for e in rows(out)] == ["a"]
    out, _ = step(s)  # step 4: released; c does not fit max_num_seqs
    assert [e[0] for e in rows(out)] == ["a", "b"]
    s.finish_requests(["a"])
    # Step 5 is 1 after b's prefill, but the release left c waiting: no hold.
    out, _ = step(s)
    assert [e[0] for e in rows(out)] == ["b", "c"]


def test_throttled_steps_hold_prefills_while_something_decodes(backend: str) -> None:
    s = make(backend)
    s.add_request(req("a", r(3, 12), max_tokens=50))
    step(s)
    s.add_request(req("b", r(20, 29), max_tokens=50))
    out = s.schedule(throttle_prefills=True)  # a data-parallel engine's off-cadence step
    assert [e[0] for e in rows(out)] == ["a"]
    s.update_from_output(out, {"a": [100]})
    out, _ = step(s)
    assert [e[0] for e in rows(out)] == ["a", "b"]


def test_a_streaming_session_keeps_its_kv_between_turns(backend: str) -> None:
    """vLLM 0.33's streaming input: a resumable request's stop ends its turn,
    not the request; it waits, holding its blocks, for its next chunk, which
    continues it from all but its last sampled token, admitted as new ahead
    of every waiting request; a chunk that is not resumable ends the input."""
    s = make(backend)
    s.add_request(req("a", r(3, 22), max_tokens=3, resumable=True))  # 20 tokens
    step(s)
    step(s)
    _, updates = step(s)  # its 3rd output: the turn ends on its length
    assert updates == [["a", [100], "length", None]]
    state = s.debug_state()
    row = state["requests"]["a"]
    assert (row["status"], row["num_tokens"], row["num_computed_tokens"]) == (
        "WAITING_FOR_STREAMING_REQ",
        23,
        22,
    )
    assert (state["kv_holding"], state["num_waiting_for_input"]) == (["a"], 1)
    assert s.has_unfinished_requests()
    s.add_request(req("b", r(40, 49), max_tokens=5))
    out, _ = step(s)
    assert [e[0] for e in rows(out)] == ["b"]  # a waits for input
    s.add_request(req("a", [300, 301, 302], max_tokens=2, resumable=True))
    out, _ = step(s)
    # Its last sampled token is dropped: 22 kept + 3 new, computed from 22.
    assert rows(out)[1] == ["a", 3, "new", 22, [1, 2]]
    s.add_request(req("a", [0]))  # not resumable: the input ends after this turn
    _, updates = step(s)  # its 2nd output of the turn
    assert ["a", [100], "length", None] in updates
    assert "a" not in s.debug_state()["requests"]
    assert s.make_stats().num_skipped_waiting_reqs == 0


def test_a_chunk_reorders_a_priority_heap_only_as_vllm_does(backend: str) -> None:
    """A chunk for a waiting session rewrites its arrival time in place, in
    vLLM's heap too, which stays as it was until the next heapify: sessions
    queued as a, b, c are admitted a, b, c although b's chunk came first."""
    s = make(backend, policy="priority")
    for i, rid in enumerate("abc"):
        s.add_request(req(rid, r(10 * i + 3, 10 * i + 7), max_tokens=1, arrival=i, resumable=True))
    step(s)  # each turn ends at once: all three wait for input, holding blocks
    assert s.debug_state()["kv_holding"] == ["a", "b", "c"]
    for rid, arrival in (("b", 5.0), ("a", 6.0), ("c", 7.0)):
        s.add_request(req(rid, [99], max_tokens=1, arrival=arrival, resumable=True))
    out, _ = step(s)
    assert [e[0] for e in rows(out)] == ["a", "b", "c"]


def test_the_end_of_input_ends_a_waiting_session(backend: str) -> None:
    s = make(backend)
    s.add_request(req("a", r(3, 22), max_tokens=1, resumable=True))
    step(s)
    assert s.debug_state()["requests"]["a"]["status"] == "WAITING_FOR_STREAMING_REQ"
    s.add_request(req("a", [0]))
    assert not s.has_unfinished_requests()
    assert s.num_free_blocks == 9999
    with pytest.raises(ValueError, match="already"):
        s.add_request(req("b", r(3, 5)))
        s.add_request(req("b", r(3, 5)))  # not a session: a duplicate


def test_s4_fcfs_preemption(backend: str) -> None:
    s = make(backend, num_blocks=11, max_model_len=160, max_num_batched_tokens=512)
    s.add_request(req("a", r(3, 82), max_tokens=40))
    s.add_request(req("b", r(103, 182), max_tokens=40))
    out, _ = step(s)
    assert rows(out) == [["a", 80, "new", 0, r(1, 5)], ["b", 80, "new", 0, r(6, 10)]]
    assert s.num_free_blocks == 0
    out, _ = step(s)
    # b's cached blocks went to the tail last block first: 10 is evicted at once.
    assert rows(out) == [["a", 1, "running", 80, [10]]]
    assert out.preempted_req_ids == {"b"}
    assert s.num_free_blocks == 4
    for _ in range(2):  # b would need 2 new + 4 evictable hit blocks > 4 free
        out, _ = step(s)
        assert [e[0] for e in rows(out)] == ["a"]
    assert s.debug_state()["waiting"] == ["b"]


def test_s4b_tokens_for_a_request_preempted_in_flight(backend: str) -> None:
    s = make(backend, num_blocks=11, max_model_len=160, max_num_batched_tokens=80, max_num_seqs=16)
    s.add_request(req("r0", r(3, 82), max_tokens=40))
    s.add_request(req("r1", r(103, 182), max_tokens=40))
    out1 = s.schedule()
    assert rows(out1) == [["r0", 80, "new", 0, r(1, 5)]]
    out2 = s.schedule()  # before out1's tokens arrive: r0 has nothing to compute
    assert rows(out2) == [["r1", 80, "new", 0, r(6, 10)]]
    u1 = s.update_from_output(out1, {"r0": [42]})
    assert [tuple(u)[:4] for u in u1] == [("r0", [42], None, None)]
    out3 = s.schedule()
    assert rows(out3) == [["r0", 1, "running", 80, [10]]]
    assert out3.preempted_req_ids == {"r1"}
    u2 = s.update_from_output(out2, {"r1": [43]})  # stale, still applied
    assert [tuple(u)[:4] for u in u2] == [("r1", [43], None, None)]
    state = s.debug_state()["requests"]["r1"]
    assert (state["status"], state["num_tokens"], state["num_computed_tokens"]) == (
        "PREEMPTED",
        81,
        0,
    )
    assert s.num_free_blocks == 4
    u3 = s.update_from_output(out3, {"r0": [44]})
    assert [tuple(u)[:4] for u in u3] == [("r0", [44], None, None)]


PRIO = dict(num_blocks=5, max_model_len=64, max_num_batched_tokens=256, max_num_seqs=4)


def test_s5_priority_undoes_a_scheduled_victim(backend: str) -> None:
    s = make(backend, policy="priority", **PRIO)
    s.add_request(req("A", r(3, 32), priority=1, arrival=1.0))
    out, _ = step(s)
    assert rows(out) == [["A", 30, "new", 0, [1, 2]]]
    s.add_request(req("B", r(103, 134), priority=0, arrival=2.0))
    out, _ = step(s)
    assert rows(out) == [["A", 1, "running", 30, []], ["B", 32, "new", 0, [3, 4]]]
    assert s.num_free_blocks == 0
    out, _ = step(s)
    assert rows(out) == [["B", 1, "running", 32, [2]]]
    assert out.preempted_req_ids == {"A"} and s.num_free_blocks == 1
    out, _ = step(s)
    assert rows(out) == [["B", 1, "running", 33, []]]
    assert s.debug_state()["waiting"] == ["A"]


@pytest.mark.parametrize("policy", ["priority", "fcfs"])
def test_s6_self_preemption(backend: str, policy: str) -> None:
    s = make(backend, policy=policy, **PRIO)
    s.add_request(req("C", r(3, 32), priority=3, arrival=1.0))
    out, _ = step(s)
    assert rows(out) == [["C", 30, "new", 0, [1, 2]]]
    s.add_request(req("D", r(103, 133), priority=0, arrival=2.0))
    out, _ = step(s)
    assert rows(out) == [["C", 1, "running", 30, []], ["D", 31, "new", 0, [3, 4]]]
    out, _ = step(s)
    assert rows(out) == [["C", 1, "running", 31, []], ["D", 1, "running", 31, []]]
    out, _ = step(s)
    if policy == "priority":  # C is its own victim, and the pass goes on (Q10)
        assert rows(out) == [["D", 1, "running", 32, [2]]]
        assert out.preempted_req_ids == {"C"}
    else:  # FCFS: the last running request, D, is the victim
        assert rows(out) == [["C", 1, "running", 32, [4]]]
        assert out.preempted_req_ids == {"D"}


def test_s7_stop_order(backend: str) -> None:
    s = make(backend, max_model_len=64)
    s.add_request(req("e", [5] * 10, max_tokens=3, min_tokens=3))
    s.add_request(req("f", [6] * 10, max_tokens=5, min_tokens=4, stop=[7]))
    s.add_request(req("g", [7] * 10, max_tokens=5, ignore_eos=True))
    s.add_request(req("h", [8] * 60, max_tokens=50))
    plan = [
        dict(e=50, f=51, g=2, h=52),
        dict(e=50, f=7, g=2, h=52),
        dict(e=2, g=2, h=52),
        dict(g=2, h=52),
        dict(g=2),
    ]
    finished = []
    for sampled in plan:
        _, updates = step(s, sampled)
        finished.append([u for u in updates if u[2] is not None])
    assert finished[0] == []
    assert finished[1] == [["f", [7], "stop", 7]]  # min_tokens 4 does not delay it (Q3)
    assert finished[2] == [["e", [2], "stop", None]]  # EOS as the last allowed token (Q4)
    assert finished[3] == [["h", [52], "length", None]]  # 64 tokens = max_model_len
    assert finished[4] == [["g", [2], "length", None]]  # EOS ignored; 5th output
    assert not s.has_unfinished_requests()
    assert s.num_free_blocks == 9999


def test_repetition_stops_once_min_tokens_are_out(backend: str) -> None:
    """vLLM 0.33's fifth stop check: an output ending in a pattern repeated
    min_count times ends the request ("repetition", "repetition_detected"),
    but only once min_tokens are out; EOS, stop tokens and length come first."""
    rules = RepetitionDetectionParams(max_pattern_size=2, min_pattern_size=1, min_count=3)
    s = make(backend, max_model_len=64)
    s.add_request(req("p", [5] * 10, max_tokens=20, repetition=rules))
    s.add_request(req("g", [6] * 10, max_tokens=20, min_tokens=5, repetition=rules))
    s.add_request(req("e", [4] * 10, max_tokens=20, repetition=rules))
    plan = [dict(p=7, g=9, e=9), dict(p=8, g=9, e=9), dict(p=7, g=9, e=2)]
    plan += [dict(p=8, g=9), dict(p=7, g=9), dict(p=8)]
    finished = []
    for sampled in plan:
        _, updates = step(s, sampled)
        finished.append([u for u in updates if u[2] is not None])
    assert finished[2] == [["e", [2], "stop", None]]  # EOS before a third 9
    assert finished[4] == [["g", [9], "repetition", "repetition_detected"]]  # 5th output
    assert finished[5] == [["p", [8], "repetition", "repetition_detected"]]  # 7,8 x3
    assert not s.has_unfinished_requests()
