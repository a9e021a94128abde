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


@pytest.mark.parametrize("backend", BACKENDS)
def test_padded_drafts_are_kept_scheduled_and_counted_as_vllm_does(backend: str) -> None:
    # vLLM 0.33's ngram_gpu proposer pads the slots it found no match for
    # with -1; vLLM's scheduler schedules them as drafts, counts them in the
    # stats, and the verification rejects them.
    s = decoding(backend, k=4)
    s.update_draft_token_ids({"a": [60, 61, -1, -1]})
    out = s.schedule()
    assert out.num_scheduled.tolist() == [5]
    assert out.spec_token_ids.tolist() == [60, 61, -1, -1]
    stats = s.update_from_output(out, {"a": [60, 61, 70]}).spec_decoding_stats
    assert (stats.num_draft_tokens, stats.num_accepted_tokens) == (4, 2)
    assert list(stats.num_draft_tokens_per_pos) == [1, 1, 1, 1]
    row = s.debug_state()["requests"]["a"]
    assert (row["num_tokens"], row["num_computed_tokens"]) == (9, 8)
    # A request with nothing but padding still verifies k slots.
    s.update_draft_token_ids({"a": [-1, -1, -1, -1]})
    out = s.schedule()
    assert out.num_scheduled.tolist() == [5]


@pytest.mark.parametrize(
    ("drafts", "error", "match"),
    [
        ({"a": [1, 2, 3, 4]}, ValueError, "more than num_speculative_tokens=3"),
        ({"a": [5, -2]}, ValueError, r"draft_token_ids\['a'\]\[1\] = -2 is outside \[-1, "),
        ({"a": [2**32]}, ValueError, r"draft_token_ids\['a'\]\[0\] = 4294967296 is outside"),
        ({"a": 7}, TypeError, r"draft_token_ids\['a'\] must be a sequence of ints, got int"),
        ({"a": [1.5]}, TypeError, r"draft_token_ids\['a'\]\[0\] must be an int"),
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


@pytest.mark.parametrize("drafts", [[60], []], ids=["one draft", "none"])
def test_too_many_sampled_tokens_for_the_drafts_are_refused(drafts: list[int]) -> None:
    """A step samples at most one token after the drafts it scheduled: more
    is refused naming the request, and changes nothing, on both backends
    (the core's own check, by row, is its unit test's)."""
    for backend in BACKENDS:
        s = decoding(backend, k=1)
        s.update_draft_token_ids({"a": drafts})
        out = s.schedule()
        before = s.debug_state()
        most = len(drafts) + 1
        with pytest.raises(ValueError, match=rf"sampled\['a'\]: 3 tokens.*samples at most {most}"):
            s.update_from_output(out, {"a": [60, 61, 62]})
        assert s.debug_state() == before
        s.update_from_output(out, {"a": [60] * most})  # the most it may take


# What a drafter with its own forward pass adds (docs/scheduling.md §4.13):
# each setting at its bound and one past it, on both backends.
DRAFTER_SETTINGS = [
    ({"num_lookahead_tokens": 64}, None),
    ({"num_lookahead_tokens": 65}, "num_lookahead_tokens"),
    ({"num_hash_lookahead_tokens": 16}, None),
    ({"num_hash_lookahead_tokens": 17}, "num_hash_lookahead_tokens"),
    ({"num_draft_slots": 3}, None),
    ({"num_draft_slots": 4}, "num_draft_slots"),
    ({"drop_eagle_block": True}, None),
    ({"drop_eagle_block": True, "num_hash_lookahead_tokens": 1}, "drop_eagle_block"),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("setting", "refused"), DRAFTER_SETTINGS)
def test_drafter_settings_are_checked_alike(
    backend: str, setting: dict, refused: str | None
) -> None:
    def build():
        return make(
            backend,
            block_size=16,
            max_model_len=64,
            max_num_batched_tokens=64,
            max_num_seqs=4,
            num_speculative_tokens=3,
            **setting,
        )

    if refused is None:
        build()
    else:
        with pytest.raises(ValueError, match=refused):
            build()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_drafter_gets_lookahead_slots_and_pays_drafting_slots(backend: str) -> None:
    s = make(
        backend,
        block_size=16,
        max_num_batched_tokens=16,
        max_num_seqs=4,
        num_speculative_tokens=2,
        num_lookahead_tokens=2,
        num_draft_slots=2,
    )
    s.add_request(req("a", list(range(3, 18)), max_tokens=4))  # 15 tokens
    s.add_request(req("b", list(range(3, 18)), max_tokens=4))
    out = s.schedule()
    # `a` gets 16 − 2 drafting slots = 14 of its 15 tokens, which leaves no
    # input budget for `b`; its 14 tokens and 2 lookahead slots fill one block.
    assert out.num_scheduled.tolist() == [14]
    assert len(s.debug_state()["requests"]["a"]["block_ids"]) == 1
    s.update_from_output(out, {})
    out = s.schedule()
    # Then its last token and 2 lookahead slots reach into a second block.
    assert out.num_scheduled.tolist()[0] == 1
    assert len(s.debug_state()["requests"]["a"]["block_ids"]) == 2


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("pad", [True, False])
def test_a_full_hit_admission_is_padded_to_a_draft_step_unless_speculation_is_dynamic(
    backend: str, pad: bool
) -> None:
    """§4.13: a request admitted with only its last token left (its prompt a
    full prefix hit) beside a running decode is padded with k placeholder
    drafts, keeping the step's decode shape uniform; vLLM does not pad under
    dynamic speculation lengths (``drafts_by_batch_size``)."""
    s = make(
        backend,
        block_size=4,
        max_num_batched_tokens=64,
        max_num_seqs=4,
        num_speculative_tokens=2,
        drafts_by_batch_size=None if pad else (0, 2, 2, 1, 1),
    )
    s.add_request(req("a", list(range(3, 11)), max_tokens=20))  # two full blocks
    s.update_from_output(s.schedule(), {"a": [50]})
    s.add_request(req("b", [*range(3, 11), 12], max_tokens=5))  # hits a's 8 tokens
    out = s.schedule()
    assert out.req_ids == ["a", "b"]
    assert out.num_scheduled.tolist() == [1, 3 if pad else 1]
    assert out.spec_token_ids.tolist() == ([-1, -1] if pad else [])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("table", "step_two"), [(None, [4, 4]), ((0, 3, 1), [2, 2])])
def test_async_placeholders_follow_the_batch_size_under_dynamic_speculation(
    backend: str, table: tuple[int, ...] | None, step_two: list[int]
) -> None:
    """Async scheduling: each request a step schedules waits for the drafts
    the runner proposes meanwhile, k placeholders; under dynamic speculation
    lengths, as many as the table gives for the step's batch size (here 2
    requests: 1 draft)."""
    s = make(
        backend,
        max_num_batched_tokens=64,
        max_num_seqs=2,
        num_speculative_tokens=3,
        async_scheduling=True,
        drafts_by_batch_size=table,
    )
    s.add_request(req("a", list(range(3, 8)), max_tokens=20))
    s.add_request(req("b", list(range(13, 18)), max_tokens=20))
    first = s.schedule()
    assert first.num_scheduled.tolist() == [5, 5]
    assert s.schedule().num_scheduled.tolist() == step_two


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("table", "match"),
    [
        ((0, 3), "max_num_seqs \\+ 1 = 3 entries, got 2"),
        ((0, 3, 4), "drafts_by_batch_size\\[2\\] must be in \\[0, 3\\], got 4"),
        ((0, 3, True), "drafts_by_batch_size\\[2\\] must be an int"),
    ],
)
def test_a_bad_draft_table_is_refused(backend: str, table: tuple, match: str) -> None:
    with pytest.raises((TypeError, ValueError), match=match):
        make(backend, max_num_seqs=2, num_speculative_tokens=3, drafts_by_batch_size=table)
