"""Encoder-decoder models (docs/scheduling.md §4.17; Whisper) through the
Python API, on both backends: the audio runs once with the decoder's first
tokens, its cross-attention blocks come with the admission and never
again, a second clip over the encoder budget waits a step, and every bad
setup is refused with the same message by both."""

from __future__ import annotations

import pytest

from ironbatch import CacheConfig, KVCacheGroup, MultimodalInput, SchedulerConfig
from ironbatch.config import check_fits

from scheduler_helpers import BACKENDS, make, req

WHISPER = (KVCacheGroup("full"), KVCacheGroup("cross_attention"))
PROMPT = [50258, 50259, 50360, 50364]  # start of transcript, language, task, no timestamps


def whisper(backend: str, **kw: object):  # type: ignore[no-untyped-def]
    settings: dict = dict(
        block_size=16,
        caching=False,
        kv_cache_groups=WHISPER,
        max_model_len=448,
        max_num_batched_tokens=448,
        enable_chunked_prefill=False,
        encoder_compute_budget=64,
        encoder_cache_size=64,
    )
    return make(backend, **(settings | kw))


def audio(rid: str, embeds: int) -> MultimodalInput:
    return MultimodalInput(0, embeds, f"audio-{rid}")


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_audio_runs_once_and_its_cross_blocks_come_with_the_admission(backend: str) -> None:
    s = whisper(backend)
    s.add_request(req("a", PROMPT, images=[audio("a", 40)]))
    first = s.schedule()
    assert first.scheduled_encoder_inputs == {"a": [0]}
    decoder, cross = first.block_ids_per_group(0)
    assert len(decoder) == 1 and len(cross) == 3  # cdiv(40, 16)
    assert first.slot_mapping.size == len(PROMPT)  # the decoder's slots only
    s.update_from_output(first, {"a": [7]})
    second = s.schedule()
    assert second.scheduled_encoder_inputs == {}
    assert second.block_ids_per_group(0) == [[], []]
    assert second.free_encoder_mm_hashes == ["audio-a"]  # dropped a step late


@pytest.mark.parametrize("backend", BACKENDS)
def test_cross_attention_blocks_of_their_own_size(backend: str) -> None:
    """Whisper with an fp8 KV cache that its cross-attention layers skip
    (docs/scheduling.md §7.16): cross-attention blocks of 8 beside the
    decoder's 16 hold the 40-frame clip in 5 blocks, and the start-up check
    counts a step's 64 encoder tokens in 8 too (1 + 28 + 8 blocks)."""
    groups = (KVCacheGroup("full"), KVCacheGroup("cross_attention", block_size=8))
    s = whisper(backend, kv_cache_groups=groups)
    s.add_request(req("a", PROMPT, images=[audio("a", 40)]))
    decoder, cross = s.schedule().block_ids_per_group(0)
    assert (len(decoder), len(cross)) == (1, 5)
    sched = SchedulerConfig(max_model_len=448, encoder_compute_budget=64, encoder_cache_size=64)
    check_fits(sched, CacheConfig(num_blocks=37, block_size=16, kv_cache_groups=groups))
    with pytest.raises(ValueError, match="fewer than the 36"):
        check_fits(sched, CacheConfig(num_blocks=36, block_size=16, kv_cache_groups=groups))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_second_clip_over_the_encoder_budget_waits_a_step(backend: str) -> None:
    s = whisper(backend)
    for rid, embeds in (("a", 40), ("b", 40), ("c", 20)):
        s.add_request(req(rid, PROMPT, images=[audio(rid, embeds)]))
    first = s.schedule()
    assert first.scheduled_encoder_inputs == {"a": [0], "c": [0]}
    s.update_from_output(first, {"a": [7], "c": [7]})
    second = s.schedule()
    assert second.scheduled_encoder_inputs == {"b": [0]}
    assert [e.request_id for e in second.entries()] == ["a", "c", "b"]


def refusal(backend: str, **kw: object) -> str:
    with pytest.raises(ValueError) as e:
        whisper(backend, **kw)
    return str(e.value)


def test_bad_setups_are_refused_alike() -> None:
    cases = {
        "enable_prefix_caching must be false": dict(caching=True),
        "needs an encoder": dict(encoder_compute_budget=None, encoder_cache_size=None),
        "kv_cache_groups[0] must be a decoder group": dict(kv_cache_groups=WHISPER[::-1]),
    }
    for needle, kw in cases.items():
        messages = {refusal(b, **kw) for b in BACKENDS}
        assert len(messages) == 1, messages
        assert needle in messages.pop()
    with pytest.raises(ValueError, match="size must be 0 for a cross-attention group"):
        KVCacheGroup("cross_attention", 4)


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_encoder_input_not_at_position_0_is_refused(backend: str) -> None:
    s = whisper(backend)
    with pytest.raises(ValueError, match="mm_position.offset must be 0") as e:
        s.add_request(req("r", PROMPT, images=[MultimodalInput(2, 40, "x")]))
    assert "got 2" in str(e.value)
    assert not s.has_unfinished_requests()
    # Past the decoder's prompt is where an encoder's input ends.
    s.add_request(req("ok", PROMPT, images=[audio("ok", 1500 // 30)]))
    assert s.has_unfinished_requests()
