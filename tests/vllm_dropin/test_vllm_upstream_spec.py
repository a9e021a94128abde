"""vLLM's own speculative-decoding scheduler tests (``tests/v1/core/
test_scheduler.py``, snapshot 003df296, as in ``test_vllm_upstream.py``),
re-expressed for the drop-in: each runs against vLLM 0.33.0's scheduler
("vllm") and ``ironbatch.vllm.Scheduler`` ("ironbatch"), built with vLLM's
``ngram`` method (its scheduler side is every method's, less the lookahead
slots a drafter model needs), and reads only the public surface: what
``schedule()`` and ``update_from_output()`` return and the stats.

Left out: the encoder-cache and EAGLE-block tests (multimodal inputs and
drafter models fall back to vLLM's scheduler), and
``test_check_stop_min_tokens`` (0.33.0 checks EOS before ``min_tokens``)."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("vllm")

from vllm.config import SpeculativeConfig  # noqa: E402
from vllm.v1.engine import FinishReason  # noqa: E402
from vllm.v1.outputs import DraftTokenIds  # noqa: E402

import vllm_setup  # noqa: E402
from scenario_helpers import by_req, new_ids, req, stats_of, update  # noqa: E402

EOS = vllm_setup.EOS
K = 3


def _make(kind: str, k: int = K, **settings: Any) -> Any:
    spec = SpeculativeConfig(
        method="ngram", num_speculative_tokens=k, prompt_lookup_max=3, prompt_lookup_min=1
    )
    return vllm_setup.make_scheduler(kind, speculative_config=spec, **settings)


def _drafts(sched: Any, drafts: dict[str, list[int]]) -> None:
    """The proposer's drafts, handed over after an output (sync)."""
    sched.update_draft_token_ids(
        DraftTokenIds(req_ids=list(drafts), draft_token_ids=[list(d) for d in drafts.values()])
    )


def _decoding(kind: str, prompts: dict[str, list[int]], **kw: Any) -> Any:
    """A scheduler whose requests have prefilled and sampled one token."""
    sched = _make(kind)
    for rid, prompt in prompts.items():
        sched.add_request(req(rid, prompt, **kw.get(rid, {})))
    so = sched.schedule()
    update(sched, so, {rid: [100] for rid in prompts})
    return sched


def test_stop_via_update_from_output(kind: str) -> None:
    """Several accepted tokens in one step are appended and stop-checked one
    by one: EOS mid-way ends the request and trims what follows; a stop
    token too (with its reason); ``max_tokens`` cuts the accepted run;
    ``ignore_eos`` goes past EOS."""
    sched = _decoding(
        kind,
        {"eos": [3, 4], "stop": [5, 6], "length": [7, 8], "ignore": [9, 10]},
        stop={"stop_token_ids": [42]},
        length={"max_tokens": 2},
        ignore={"ignore_eos": True},
    )
    drafts = {"eos": [10, EOS, 12], "stop": [13, 42, 14], "length": [10, 11, 12]}
    drafts["ignore"] = [EOS, 15, 16]
    _drafts(sched, drafts)
    so = sched.schedule()
    assert so.num_scheduled_tokens == dict.fromkeys(drafts, 4)
    assert so.scheduled_spec_decode_tokens == drafts
    outs = by_req(
        update(
            sched,
            so,
            {
                "eos": [10, EOS, 12, 13],
                "stop": [13, 42, 14, 15],
                "length": [10, 11, 12, 13],
                "ignore": [EOS, 15, 16, 17],
            },
        )
    )
    assert (outs["eos"].new_token_ids, outs["eos"].finish_reason) == ([10, EOS], FinishReason.STOP)
    assert outs["stop"].new_token_ids == [13, 42] and outs["stop"].stop_reason == 42
    # One token was out already: max_tokens=2 keeps one more.
    assert (
        outs["length"].new_token_ids == [10] and outs["length"].finish_reason == FinishReason.LENGTH
    )
    assert (
        outs["ignore"].new_token_ids == [EOS, 15, 16, 17] and outs["ignore"].finish_reason is None
    )


@pytest.mark.parametrize(
    ("drafts", "sampled", "expected"),
    [
        ([[1, 2, 3]], [[1, 2, 3, 4]], (1, 3, 3, [1, 1, 1])),  # all accepted
        ([[1, 2, 3]], [[1, 5]], (1, 3, 1, [1, 0, 0])),  # one accepted
        ([[1, 2], [3]], [[1, 2, 5], [3, 4]], (2, 3, 3, [2, 1, 0])),  # two requests
        ([[1]], [[2]], (1, 1, 0, [0, 0, 0])),  # none accepted
        ([[]], [[5]], None),  # no drafts, no stats
    ],
    ids=["all", "one", "two-requests", "none", "no-drafts"],
)
def test_schedule_spec_decoding_stats(
    kind: str, drafts: list[list[int]], sampled: list[list[int]], expected: Any
) -> None:
    """Each draft verification counts once; accepted drafts per position."""
    ids = [f"r{i}" for i in range(len(drafts))]
    sched = _decoding(kind, {rid: [3, 4, 5] for rid in ids})
    _drafts(sched, dict(zip(ids, drafts, strict=True)))
    so = sched.schedule()
    assert [so.num_scheduled_tokens[rid] for rid in ids] == [1 + len(d) for d in drafts]
    stats = stats_of(update(sched, so, dict(zip(ids, sampled, strict=True)))).spec_decoding_stats
    if expected is None:
        assert stats is None
        return
    s = stats
    got = (s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens, s.num_accepted_tokens_per_pos)
    assert got == expected


def test_spec_decoding_stats_empty_output(kind: str) -> None:
    """A step with drafts that returns no tokens counts nothing and rolls
    nothing back: the next step has only the known token left to compute."""
    sched = _decoding(kind, {"a": [3, 4, 5]})
    _drafts(sched, {"a": [1, 2, 3]})
    so = sched.schedule()
    assert stats_of(update(sched, so, {})).spec_decoding_stats is None
    # Nothing rolled back: the drafts' positions count as computed.
    assert sched.schedule().num_scheduled_tokens == {}


def test_no_spec_tokens_scheduled_for_prefill_chunks(kind: str) -> None:
    """Drafts handed over while a prompt is still being chunked are dropped;
    once the prompt is done, drafts make a step 1 + k tokens."""
    sched = _make(kind, max_num_batched_tokens=32, max_num_seqs=2)
    sched.add_request(req("a", list(range(3, 63))))  # 60 tokens: two chunks
    so = sched.schedule()
    assert so.num_scheduled_tokens == {"a": 32}
    update(sched, so)
    _drafts(sched, {"a": [1, 2, 3]})  # mid-prefill: ignored
    so = sched.schedule()
    assert so.num_scheduled_tokens == {"a": 28} and not so.scheduled_spec_decode_tokens
    update(sched, so, {"a": [100]})
    _drafts(sched, {"a": [1, 2, 3]})
    so = sched.schedule()
    assert so.num_scheduled_tokens == {"a": 4}
    assert so.scheduled_spec_decode_tokens == {"a": [1, 2, 3]}


def test_spec_decode_padding_first_decode_step(kind: str) -> None:
    """A request whose prompt is all cached but its last token is padded to
    a whole draft step with placeholder drafts (-1), which the runner
    rejects: the rollback leaves one token to compute."""
    sched = _make(kind)
    prompt = list(range(3, 3 + 33))  # two full blocks of 16, one token more
    sched.add_request(req("first", prompt))
    update(sched, sched.schedule(), {"first": [100]})
    sched.add_request(req("second", prompt))
    so = sched.schedule()
    assert new_ids(so) == ["second"]
    assert so.num_scheduled_tokens == {"first": 1, "second": 1 + K}
    assert so.scheduled_spec_decode_tokens == {"second": [-1] * K}
    stats = stats_of(update(sched, so, {"first": [101], "second": [102]})).spec_decoding_stats
    assert (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens) == (1, K, 0)
    assert sched.schedule().num_scheduled_tokens == {"first": 1, "second": 1}


def test_spec_decode_padding_skipped_with_prefill_in_batch(kind: str) -> None:
    """Beside a running prefill chunk, a full prefix hit is not padded."""
    sched = _make(kind, max_num_batched_tokens=64, long_prefill_token_threshold=16)
    prompt = list(range(3, 3 + 33))
    sched.add_request(req("cached", prompt))
    for _ in range(3):
        update(sched, sched.schedule(), {"cached": [100]})
    sched.add_request(req("long", list(range(200, 260))))  # chunked by the threshold
    update(sched, sched.schedule())
    sched.add_request(req("hit", prompt))
    so = sched.schedule()
    assert so.num_scheduled_tokens["long"] == 16  # still prefilling
    assert so.num_scheduled_tokens["hit"] == 1
    assert "hit" not in so.scheduled_spec_decode_tokens
