"""A pooling runner through the public API, on both backends
(docs/scheduling.md §4.16): prompts that fill max_model_len, results that
finish requests, and bad results refused with nothing changed."""

from __future__ import annotations

import pytest

from ironbatch import SchedulerConfig

from scheduler_helpers import make, req


@pytest.fixture(params=["rust", "python"])
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


def pooling(backend: str, budget: int = 24):  # type: ignore[no-untyped-def]
    return make(
        backend,
        max_model_len=64,
        max_num_seqs=4,
        max_num_batched_tokens=budget,
        runner="pooling",
        num_blocks=100,
    )


def test_a_full_length_prompt_is_chunked_and_finished_by_its_result(backend: str) -> None:
    s = pooling(backend)
    s.add_request(req("full", list(range(3, 67)), max_tokens=1))
    chunks = []
    for _ in range(3):
        out = s.schedule()
        chunks.append(out.num_scheduled_tokens["full"])
        done = [rid for rid, last in zip(out.req_ids, out.samples, strict=True) if last]
        updates = s.update_from_pooler_output(out, done)
    assert chunks == [24, 24, 16]
    assert updates.finished_req_ids == ["full"]
    assert [u.finish_reason for u in updates] == ["stop"]
    assert not s.has_unfinished_requests()
    assert s.num_free_blocks == 99


def test_bad_results_are_refused_and_change_nothing(backend: str) -> None:
    s = pooling(backend, budget=16)
    s.add_request(req("r", list(range(3, 43)), max_tokens=1))
    out = s.schedule()
    before = s.debug_state()
    with pytest.raises(ValueError, match="ended before the end of the request's prompt"):
        s.update_from_pooler_output(out, ["r"])
    with pytest.raises(ValueError, match=r"\['ghost'\] were not scheduled"):
        s.update_from_pooler_output(out, ["ghost"])
    with pytest.raises(ValueError, match="samples no tokens"):
        s.update_from_output(out, {"r": [5]})
    with pytest.raises(TypeError, match="pooled must be an iterable of request ids"):
        s.update_from_pooler_output(out, "r")
    assert s.debug_state() == before
    s.update_from_pooler_output(out, [])  # the chunk's own (empty) result applies
    assert s.has_unfinished_requests()


def test_a_generating_scheduler_refuses_results_and_full_length_prompts(backend: str) -> None:
    s = make(backend, max_model_len=64, max_num_seqs=4, max_num_batched_tokens=64)
    with pytest.raises(ValueError, match="must be shorter than max_model_len"):
        s.add_request(req("full", list(range(3, 67))))
    s.add_request(req("r", [5] * 8))
    out = s.schedule()
    with pytest.raises(ValueError, match="runner='generate'"):
        s.update_from_pooler_output(out, ["r"])


def test_the_config_names_the_runner_and_refuses_drafts() -> None:
    with pytest.raises(ValueError, match="runner must be one of"):
        SchedulerConfig(max_model_len=64, runner="embed")
    with pytest.raises(ValueError, match=r"num_speculative_tokens \(2\) must be 0"):
        SchedulerConfig(max_model_len=64, runner="pooling", num_speculative_tokens=2)
