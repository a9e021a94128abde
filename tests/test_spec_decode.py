"""Speculative decoding through the API (docs/scheduling.md §4.13, §5.7),
on both backends: drafts in, scheduled as the last tokens of a decode,
rejected ones rolled back, vLLM's stats out; bad drafts refused alike."""

from __future__ import annotations

import pytest

from scheduler_helpers import make, req

BACKENDS = ["rust", "python"]


def decoding(backend: str, k: int = 3):
    s = make(backend, max_num_batched_tokens=64, max_num_seqs=4, num_speculative_tokens=k)
    s.add_request(req("a", list(range(3, 8)), max_tokens=20))
    out = s.schedule()
    s.update_from_output(out, {"a": [50]})
    return s


@pytest.mark.parametrize("backend", BACKENDS)
def test_drafts_are_verified_and_rejections_rolled_back(backend: str) -> None:
    s = decoding(backend)
    s.update_draft_token_ids({"a": [60, 61, 62], "gone": [1]})  # "gone": finished, skipped
    out = s.schedule()
    assert out.num_scheduled.tolist() == [4]
    assert out.num_spec_tokens.tolist() == [3]
    assert out.spec_token_ids.tolist() == [60, 61, 62]
    upd = s.update_from_output(out, {"a": [60, 61, 70]})  # two accepted
    stats = upd.spec_decoding_stats
    assert (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens) == (1, 3, 2)
    assert list(stats.num_accepted_tokens_per_pos) == [1, 1, 0]
    row = s.debug_state()["requests"]["a"]
    assert (row["num_tokens"], row["num_computed_tokens"]) == (9, 8)
    # Without drafts the next decode is one token, and there are no stats.
    out = s.schedule()
    assert out.num_scheduled.tolist() == [1]
    assert s.update_from_output(out, {"a": [71]}).spec_decoding_stats is None


@pytest.mark.parametrize(
    ("drafts", "error", "match"),
    [
        ({"a": [1, 2, 3, 4]}, ValueError, "more than num_speculative_tokens=3"),
        ({"a": [-1]}, ValueError, "token_ids"),
        ([("a", [1])], TypeError, "must be a mapping"),
    ],
)
def test_bad_drafts_are_refused_alike_and_change_nothing(
    drafts: object, error: type[Exception], match: str
) -> None:
    messages = []
    for backend in BACKENDS:
        s = decoding(backend)
        before = s.debug_state()
        with pytest.raises(error, match=match) as e:
            s.update_draft_token_ids(drafts)  # type: ignore[arg-type]
        assert s.debug_state() == before
        messages.append(str(e.value))
    assert messages[0] == messages[1]


def test_too_many_sampled_tokens_for_the_drafts_are_refused() -> None:
    for backend in BACKENDS:
        s = decoding(backend, k=1)
        s.update_draft_token_ids({"a": [60]})
        out = s.schedule()
        with pytest.raises(ValueError, match="at most one more"):
            s.update_from_output(out, {"a": [60, 61, 62]})
