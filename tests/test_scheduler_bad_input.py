"""Bad input to the scheduler API: a clear ValueError/TypeError naming the
field, and the scheduler's state provably unchanged afterwards."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ironbatch import (
    CacheConfig,
    LoRARequest,
    MultimodalInput,
    Request,
    SamplingParams,
    Scheduler,
    SchedulerConfig,
)

from scheduler_helpers import BACKENDS, make, req


@pytest.fixture(params=BACKENDS)
def busy(request: pytest.FixtureRequest) -> Any:
    """A scheduler mid-run: one request decoding, one prefilling, one waiting."""
    s = make(
        request.param, num_blocks=12, max_model_len=64, max_num_batched_tokens=40, max_num_seqs=2
    )
    s.add_request(req("a", range(20)))
    s.add_request(req("b", range(100, 160)))
    s.add_request(req("c", range(200, 210)))
    out = s.schedule()
    s.update_from_output(out, {"a": [7]})
    return s


def unchanged(s: Scheduler, call: Any, exc: type, match: str) -> None:
    before = s.debug_state()
    with pytest.raises(exc, match=match):
        call()
    assert s.debug_state() == before


@pytest.mark.parametrize(
    ("make_request", "exc", "match"),
    [
        (lambda: req("a", [1, 2]), ValueError, "already"),
        (lambda: req("x", range(64)), ValueError, "max_model_len"),
        (lambda: req("x", range(1000)), ValueError, "max_model_len"),
        (
            lambda: req("x", range(8), images=[MultimodalInput(0, 4, "img")]),
            ValueError,
            r'mm_features of request "x": this scheduler has no encoder',
        ),
    ],
)
def test_add_request_rejections(busy: Scheduler, make_request: Any, exc: type, match: str) -> None:
    unchanged(busy, lambda: busy.add_request(make_request()), exc, match)


@pytest.mark.parametrize(
    ("build", "exc", "match"),
    [
        (lambda: Request("x", []), ValueError, "prompt_token_ids"),
        (lambda: Request(7, [1]), TypeError, "request_id"),
        (lambda: Request("x", "hello"), TypeError, "prompt_token_ids"),
        (lambda: Request("x", [1, -1]), ValueError, r"prompt_token_ids\[1\] = -1"),
        (lambda: Request("x", [1, 2**32]), ValueError, r"prompt_token_ids\[1\]"),
        (lambda: Request("x", [1, 2.0]), TypeError, r"prompt_token_ids\[1\]"),
        (lambda: Request("x", np.array([[1]])), TypeError, "prompt_token_ids"),
        (lambda: Request("x", [1], priority=1.5), TypeError, "priority"),
        (lambda: Request("x", [1], arrival_time=float("nan")), ValueError, "arrival_time"),
        (lambda: Request("x", [1], sampling_params={"max_tokens": 3}), TypeError, "sampling"),
        (lambda: Request("x", [1], eos_token_id=-2), ValueError, "eos_token_id"),
        (lambda: SamplingParams(max_tokens=0), ValueError, "max_tokens"),
        (lambda: SamplingParams(max_tokens=4, min_tokens=5), ValueError, "min_tokens"),
        (lambda: SamplingParams(min_tokens=-1), ValueError, "min_tokens"),
        (lambda: SamplingParams(max_tokens="8"), TypeError, "max_tokens"),
        (lambda: SamplingParams(stop_token_ids=[3, -3]), ValueError, "stop_token_ids"),
        (lambda: Request("x", [1], lora_request="adapter"), TypeError, "lora_int_id"),
        (lambda: LoRARequest("a", 0, "/a"), ValueError, r"lora_int_id must be in \[1, "),
        (lambda: LoRARequest("a", -1, "/a"), ValueError, "lora_int_id"),
        (lambda: LoRARequest("a", 2**32, "/a"), ValueError, "lora_int_id"),
        (lambda: LoRARequest("a", True, "/a"), TypeError, "lora_int_id must be an int"),
        (lambda: LoRARequest("a", "1", "/a"), TypeError, "lora_int_id must be an int"),
        (lambda: LoRARequest(7, 1, "/a"), TypeError, "lora_name must be a str"),
        (lambda: LoRARequest("a", 1, None), TypeError, "lora_path must be a str"),
        (lambda: MultimodalInput(0, 0, "a"), ValueError, r"MultimodalInput.length must be >= 1"),
        (lambda: MultimodalInput(-1, 2, "a"), ValueError, r"MultimodalInput.offset must be >= 0"),
        (lambda: MultimodalInput(0, 2.0, "a"), TypeError, r"MultimodalInput.length must be an int"),
        (lambda: MultimodalInput(0, 2, 7), TypeError, "identifier"),
        (lambda: MultimodalInput(0, 2, "a", [True]), ValueError, r"is_embed has 1 entries"),
        (lambda: Request("x", [1], mm_features="img"), TypeError, "mm_features must be a list"),
        (lambda: Request("x", [1], mm_features=[3]), TypeError, r"mm_features\[0\].offset"),
        (
            lambda: Request("x", [0, 0], prompt_embeds=np.full((2, 4), np.nan)),
            ValueError,
            "prompt_embeds must be finite",
        ),
        (
            lambda: Request("x", [0, 0], prompt_embeds=np.zeros((3, 4))),
            ValueError,
            "prompt_embeds has 3 rows; the prompt has 2 positions",
        ),
        (lambda: Request("x", [0, 0], prompt_embeds=[0.5, 1.0]), TypeError, "2-D"),
    ],
)
def test_bad_requests_are_refused_before_the_scheduler(build: Any, exc: type, match: str) -> None:
    with pytest.raises(exc, match=match):
        build()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("images", "match"),
    [
        ([MultimodalInput(6, 4, "a")], r'mm_features\[0\] of request "x": .* past the prompt'),
        (
            [MultimodalInput(0, 4, "a"), MultimodalInput(2, 2, "b")],
            r"mm_features\[1\] .* must not be before the end of mm_features\[0\]",
        ),
        (
            [MultimodalInput(0, 4, "a"), MultimodalInput(5, 2, "a")],
            r'identifier "a" takes 2 embeddings here but 4',
        ),
    ],
)
def test_images_that_do_not_fit_the_prompt_are_refused_and_change_nothing(
    backend: str, images: list[MultimodalInput], match: str
) -> None:
    """Items past the prompt, overlapping or reusing an id with another size:
    refused by both backends with the field named, the scheduler as it was."""
    s = make(
        backend,
        max_num_seqs=4,
        max_num_batched_tokens=64,
        max_model_len=64,
        encoder_compute_budget=16,
        encoder_cache_size=32,
    )
    s.add_request(req("ok", range(8), images=[MultimodalInput(0, 4, "a")]))
    unchanged(s, lambda: s.add_request(req("x", range(8), images=images)), ValueError, match)


def test_prompt_tokens_become_python_ints() -> None:
    """What the checks accept (NumPy ints, bools, any sequence) is kept as
    plain ints, as the loop that names a bad item would keep it."""
    for given in ([np.int64(5), np.uint32(7), 2**32 - 1, True], (5, 7, 2**32 - 1, 1)):
        tokens = Request("x", given).prompt_token_ids
        assert tokens == [5, 7, 2**32 - 1, 1]
        assert [type(t) for t in tokens] == [int] * 4


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"max_model_len": 1}, ValueError, "max_model_len"),
        ({"max_num_seqs": 0}, ValueError, "max_num_seqs"),
        ({"max_num_seqs": 64, "max_num_batched_tokens": 32}, ValueError, "max_num_batched_tokens"),
        (
            {"enable_chunked_prefill": False, "max_num_batched_tokens": 32},
            ValueError,
            "chunked prefill",
        ),
        ({"long_prefill_token_threshold": 65}, ValueError, "long_prefill_token_threshold"),
        ({"long_prefill_token_threshold": -1}, ValueError, "long_prefill_token_threshold"),
        ({"policy": "lifo"}, ValueError, "policy"),
        ({"max_num_seqs": 2.5}, TypeError, "max_num_seqs"),
        ({"max_loras": 0}, ValueError, "max_loras"),
        ({"max_loras": 1.5}, TypeError, "max_loras"),
        ({"encoder_compute_budget": 16}, ValueError, "go together"),
        ({"encoder_compute_budget": 0, "encoder_cache_size": 16}, ValueError, "encoder_compute"),
        ({"encoder_compute_budget": 16, "encoder_cache_size": -1}, ValueError, "encoder_cache"),
        ({"drafter_read_ahead": 2}, ValueError, "drafter_read_ahead"),
        ({"disable_chunked_mm_input": 1}, TypeError, "disable_chunked_mm_input"),
    ],
)
def test_bad_scheduler_config(kwargs: dict, exc: type, match: str) -> None:
    args = {"max_model_len": 64, "max_num_seqs": 4, "max_num_batched_tokens": 64, **kwargs}
    with pytest.raises(exc, match=match):
        SchedulerConfig(**args)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_cache_that_cannot_hold_one_sequence_is_refused(backend: str) -> None:
    # 4 blocks of 16 hold 64 tokens, not max_model_len = 65: a request could
    # be admitted and never finish (livelock), so vLLM refuses to start.
    with pytest.raises(ValueError, match="num_blocks"):
        Scheduler(
            SchedulerConfig(max_model_len=65, max_num_batched_tokens=128),
            CacheConfig(num_blocks=5, block_size=16),
            backend=backend,
        )
    with pytest.raises(ValueError, match="num_blocks"):
        Scheduler(SchedulerConfig(max_model_len=64), CacheConfig(), backend=backend)
    with pytest.raises(ValueError, match="backend"):
        Scheduler(SchedulerConfig(max_model_len=64), CacheConfig(num_blocks=8), backend="cuda")


def test_bad_update_from_output(busy: Scheduler) -> None:
    out = busy.schedule()
    assert out.req_ids == ["a", "b"]  # a decodes; b is mid-prefill (no token due)
    unchanged(busy, lambda: busy.update_from_output(out, {"zz": [1]}), ValueError, "zz")
    unchanged(busy, lambda: busy.update_from_output(out, {"b": [1]}), ValueError, "last known")
    unchanged(busy, lambda: busy.update_from_output(out, {"a": [-5]}), ValueError, "sampled")
    unchanged(busy, lambda: busy.update_from_output(out, {"a": ["x"]}), TypeError, "sampled")
    unchanged(busy, lambda: busy.update_from_output(out, [5]), ValueError, "2 requests")
    # A runner's own int64 array goes to the backend unchecked; both word
    # a wrong length alike.
    short = "sampled has 1 entries; the step scheduled 2 requests"
    unchanged(busy, lambda: busy.update_from_output(out, np.array([5])), ValueError, short)
    unchanged(busy, lambda: busy.update_from_output(out, [5, 5]), ValueError, "last known")
    unchanged(busy, lambda: busy.update_from_output(out, [5, -2]), ValueError, "sampled")
    unchanged(
        busy, lambda: busy.update_from_output(out, np.array([5.0, -1.0])), TypeError, "sampled"
    )
    unchanged(busy, lambda: busy.update_from_output(None, {}), TypeError, "scheduler_output")
    # Speculation off: a decode samples one token, never more.
    unchanged(
        busy,
        lambda: busy.update_from_output(out, {"a": [5, 6, 8]}),
        ValueError,
        r"sampled\['a'\]: 3 tokens, but the step scheduled 0 drafts for it, "
        "so it samples at most 1",
    )
    updates = busy.update_from_output(out, np.array([5, -1]))
    assert [u.request_id for u in updates] == ["a"]
    unchanged(busy, lambda: busy.update_from_output(out, {}), ValueError, "already applied")


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_output_belongs_to_its_scheduler(backend: str) -> None:
    s1, s2 = make(backend, max_model_len=64), make(backend, max_model_len=64)
    s1.add_request(req("a", [1, 2, 3]))
    s2.add_request(req("a", [1, 2, 3]))
    out1 = s1.schedule()
    s2.schedule()
    unchanged(s2, lambda: s2.update_from_output(out1, {"a": [5]}), ValueError, "another")


def test_finish_requests_input(busy: Scheduler) -> None:
    unchanged(busy, lambda: busy.finish_requests([1]), TypeError, "request_ids")
    for nothing in (None, 5):
        unchanged(
            busy,
            lambda nothing=nothing: busy.finish_requests(nothing),  # type: ignore[misc]
            TypeError,
            "request_ids must be a request id or an iterable of them, got "
            + type(nothing).__name__,
        )
    before = busy.debug_state()
    busy.finish_requests(["nope"])  # unknown ids are ignored, as vLLM does
    assert busy.debug_state() == before
    busy.finish_requests("c")
    assert "c" not in busy.debug_state()["requests"]
    busy.add_request(req("c", [9, 9]))  # a finished id may be used again


@pytest.mark.parametrize("flag", ["no", 1, None, np.bool_(True)])
def test_throttle_prefills_is_a_bool_on_both_backends(busy: Scheduler, flag: Any) -> None:
    """The twin would take any truthy value as True; both refuse alike."""
    unchanged(
        busy,
        lambda: busy.schedule(throttle_prefills=flag),
        TypeError,
        f"throttle_prefills must be a bool, got {type(flag).__name__}",
    )


@pytest.mark.parametrize(
    ("lora", "exc", "match"),
    [
        (object(), TypeError, "has no lora_int_id"),
        (
            type("L", (), {"lora_int_id": 0, "lora_name": "a", "lora_path": ""})(),
            ValueError,
            ">= 1",
        ),
        (
            type("L", (), {"lora_int_id": 2**32, "lora_name": "a", "lora_path": ""})(),
            ValueError,
            "lora_int_id",
        ),
        (
            type("L", (), {"lora_int_id": 1, "lora_name": b"a", "lora_path": ""})(),
            TypeError,
            "lora_name",
        ),
    ],
)
def test_the_core_binding_names_a_bad_adapter(lora: Any, exc: type, match: str) -> None:
    """Past the API's checks (the drop-in hands the core vLLM's own
    LoRARequest), the binding names the field and changes nothing."""
    s = make(
        "rust",
        num_blocks=12,
        max_model_len=64,
        max_num_batched_tokens=40,
        max_num_seqs=2,
        max_loras=2,
    )
    s.add_request(req("a", range(20), lora=1))
    s.update_from_output(s.schedule(), {"a": [7]})

    def call() -> None:
        s._core.core.add_request(
            request_id="x",
            prompt_token_ids=[1, 2],
            max_tokens=4,
            min_tokens=0,
            eos_token_id=None,
            stop_token_ids=[],
            repetition_detection=None,
            priority=0,
            arrival_time=0.0,
            cache_salt=None,
            lora_request=lora,
        )

    unchanged(s, call, exc, match)
