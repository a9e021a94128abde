"""No request can wedge the engine. Each case runs against a live engine with
a good request beside the bad one, then a normal ``generate()`` under a time
limit: the good request's tokens are the ones it gets alone, the bad one is
refused before anything is queued or ends with finish reason "error", and
the engine is left with no unfinished request and every block free."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")

import torch  # noqa: E402
from engine_models import VOCAB, build  # noqa: E402

from ironbatch import LLM, RequestOutput, SamplingParams  # noqa: E402
from ironbatch.model import sampler  # noqa: E402

GOOD = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
GOOD_PROMPT = {"prompt_token_ids": [5, 6, 7, 8]}
BAD_PROMPT = {"prompt_token_ids": [9, 10, 11]}
TIME_LIMIT = 120.0  # seconds; a wedged engine spins forever


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("llama")
    build("llama", path)
    return path


def make_llm(path: Path, **kw: Any) -> LLM:
    return LLM(str(path), dtype="float32", num_blocks=64, max_num_seqs=8, **kw)


@pytest.fixture(scope="module")
def expected_good(model_dir: Path) -> list[int]:
    return serve(make_llm(model_dir), [GOOD_PROMPT], [GOOD])[0].outputs[0].token_ids


def serve(llm: LLM, prompts: list[Any], params: list[SamplingParams]) -> list[RequestOutput]:
    """``generate`` in a thread, failing the test if it does not return."""
    result: list[Any] = []

    def run() -> None:
        try:
            result.append(llm.generate(prompts, params, use_tqdm=False))
        except BaseException as e:  # noqa: BLE001 - handed to the test below
            result.append(e)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(TIME_LIMIT)
    assert not worker.is_alive(), "generate() did not return: the engine is wedged"
    if isinstance(result[0], BaseException):
        raise result[0]
    return result[0]


def assert_idle(llm: LLM) -> None:
    engine = llm.llm_engine
    assert engine.get_num_unfinished_requests() == 0
    assert not engine.states
    assert engine.scheduler.num_free_blocks == engine.num_blocks - 1  # every block back


def assert_serves(llm: LLM, expected_good: list[int]) -> None:
    """The engine is idle and a normal generate() still gives the good tokens."""
    assert_idle(llm)
    out = serve(llm, [GOOD_PROMPT], [GOOD])
    assert [o.outputs[0].token_ids for o in out] == [expected_good]
    assert_idle(llm)


REFUSED = [
    (lambda: SamplingParams(seed=2**64), "seed"),
    (lambda: SamplingParams(seed=-(2**63) - 1), "seed"),
    (lambda: SamplingParams(stop_token_ids=[10**6], min_tokens=2), "stop_token_ids"),
    (lambda: SamplingParams(stop_token_ids=[VOCAB]), "stop_token_ids"),
    (lambda: SamplingParams(logprobs=21), "logprobs"),
    (lambda: SamplingParams(logprobs=10 * VOCAB), "logprobs"),
    (lambda: SamplingParams(temperature=float("inf")), "temperature"),
    (lambda: SamplingParams(temperature=float("nan")), "temperature"),
    (lambda: SamplingParams(temperature=2.5), "temperature"),
    (lambda: SamplingParams(repetition_penalty=float("inf")), "repetition_penalty"),
    (lambda: SamplingParams(max_tokens=2**63), "max_tokens"),
]


@pytest.mark.parametrize(("bad", "field"), REFUSED, ids=[f for _, f in REFUSED])
def test_refused_parameters_queue_nothing(
    model_dir: Path, expected_good: list[int], bad: Callable[[], SamplingParams], field: str
) -> None:
    llm = make_llm(model_dir)
    with pytest.raises(ValueError, match=field):
        serve(llm, [GOOD_PROMPT, BAD_PROMPT, GOOD_PROMPT], [GOOD, bad(), GOOD])
    assert_serves(llm, expected_good)  # the good prompts were not left queued


SERVED = [
    # vLLM raises a positive temperature below 0.01 to 0.01 and samples.
    (SamplingParams(max_tokens=5, temperature=1e-45, ignore_eos=True), "length"),
    # Logits divided by ~0 become +inf: the sampler shares the draw among them.
    (SamplingParams(max_tokens=5, repetition_penalty=1e-45, ignore_eos=True), "length"),
    (SamplingParams(max_tokens=5, seed=2**63 - 1, ignore_eos=True), "length"),
    (SamplingParams(max_tokens=5, seed=-(2**63), ignore_eos=True), "length"),
    (SamplingParams(max_tokens=5, logprobs=20, ignore_eos=True), "length"),
    (SamplingParams(max_tokens=5, min_tokens=5, stop_token_ids=[VOCAB - 1]), "length"),
]


@pytest.mark.parametrize("params", [p for p, _ in SERVED])
def test_edge_parameters_are_served(
    model_dir: Path, expected_good: list[int], params: SamplingParams
) -> None:
    llm = make_llm(model_dir)
    good, odd = serve(llm, [GOOD_PROMPT, BAD_PROMPT], [GOOD, params])
    assert good.outputs[0].token_ids == expected_good
    assert odd.outputs[0].finish_reason == "length"
    assert len(odd.outputs[0].token_ids) == 5
    if params.logprobs:
        assert [len(entry) for entry in odd.outputs[0].logprobs] >= [20] * 5
    assert_serves(llm, expected_good)


def test_tiny_temperature_is_raised_as_vllm_raises_it() -> None:
    assert SamplingParams(temperature=1e-45).temperature == 0.01
    assert not SamplingParams(temperature=1e-45).greedy
    assert SamplingParams(seed=-1).seed is None


def fail_sampling_for_seed(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    """Make the sampler raise for rows of requests with this seed."""
    real = sampler.sample_row

    def failing(logits: torch.Tensor, row: sampler.RowParams, gen: torch.Generator) -> int:
        if row.params.seed == seed:
            raise RuntimeError("injected sampler failure")
        return real(logits, row, gen)

    monkeypatch.setattr(sampler, "sample_row", failing)


def test_a_failing_sampler_row_ends_only_its_request(
    model_dir: Path, expected_good: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    fail_sampling_for_seed(monkeypatch, 666)
    llm = make_llm(model_dir)
    bad = SamplingParams(max_tokens=5, seed=666, ignore_eos=True)
    good, failed = serve(llm, [GOOD_PROMPT, BAD_PROMPT], [GOOD, bad])
    assert good.outputs[0].token_ids == expected_good
    assert failed.finished and failed.outputs[0].finish_reason == "error"
    assert "injected sampler failure" in (failed.error or "")
    assert_serves(llm, expected_good)


def test_a_request_that_cannot_start_ends_alone(
    model_dir: Path, expected_good: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    llm = make_llm(model_dir)
    runner = llm.llm_engine.runner
    real = runner.begin_request

    def begin(slot: int, prompt: list[int], params: SamplingParams) -> None:
        real(slot, prompt, params)
        if prompt == BAD_PROMPT["prompt_token_ids"]:
            raise MemoryError("injected")

    monkeypatch.setattr(runner, "begin_request", begin)
    good, failed = serve(llm, [GOOD_PROMPT, BAD_PROMPT], [GOOD, GOOD])
    assert good.outputs[0].token_ids == expected_good
    assert failed.outputs[0].finish_reason == "error"
    assert "could not start" in (failed.error or "")
    monkeypatch.undo()
    assert_serves(llm, expected_good)


def test_a_failing_output_ends_only_its_request(
    model_dir: Path, expected_good: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    llm = make_llm(model_dir)
    engine = llm.llm_engine
    real = engine._advance

    def advance(st: Any, *args: Any, **kwargs: Any) -> Any:
        if st.request.prompt_token_ids == BAD_PROMPT["prompt_token_ids"]:
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "injected")
        return real(st, *args, **kwargs)

    monkeypatch.setattr(engine, "_advance", advance)
    good, failed = serve(llm, [GOOD_PROMPT, BAD_PROMPT], [GOOD, GOOD])
    assert good.outputs[0].token_ids == expected_good
    assert failed.outputs[0].finish_reason == "error"
    assert "its output failed" in (failed.error or "")
    monkeypatch.undo()
    assert_serves(llm, expected_good)


class FlakyModel(torch.nn.Module):
    """The real model, except that its next forward leaves garbage in the
    KV blocks it wrote (as a kernel fault might) and then raises ``error``."""

    def __init__(self, model: torch.nn.Module, error: BaseException) -> None:
        super().__init__()
        self.model, self.error, self.armed = model, error, True

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: Any) -> torch.Tensor:
        if not self.armed:
            return self.model(input_ids, positions, attn)
        self.armed = False
        self.model(input_ids, positions, attn)
        slots = attn.meta.slot_mapping
        gen = torch.Generator().manual_seed(0)
        for cache in (*attn.k_caches, *attn.v_caches):
            flat = cache.view(-1, *cache.shape[2:])
            flat[slots] = 100 * torch.randn(flat[slots].shape, generator=gen, dtype=flat.dtype)
        raise self.error

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.logits(hidden)


SHARED = {"prompt_token_ids": list(range(20, 60))}  # 40 tokens: 2 full blocks of 16


@pytest.mark.parametrize("error", [RuntimeError("CUDA error: injected"), KeyboardInterrupt()])
def test_a_failing_step_ends_its_requests_and_the_engine_goes_on(
    model_dir: Path, expected_good: list[int], error: BaseException
) -> None:
    want = serve(make_llm(model_dir), [SHARED], [GOOD])[0].outputs[0].token_ids
    llm = make_llm(model_dir)
    runner = llm.llm_engine.runner
    runner.model = FlakyModel(runner.model, error)
    if isinstance(error, Exception):
        outs = serve(llm, [SHARED, GOOD_PROMPT], [GOOD, GOOD])
        assert [o.outputs[0].finish_reason for o in outs] == ["error", "error"]
        assert all("CUDA error: injected" in (o.error or "") for o in outs)
    else:  # the interrupt reaches the caller, and the engine is still sound
        with pytest.raises(KeyboardInterrupt):
            serve(llm, [SHARED, GOOD_PROMPT], [GOOD, GOOD])
    assert_idle(llm)
    # The failed step's blocks were hash-cached with wrong KV: a request with
    # the same prompt must not hit them.
    again = serve(llm, [SHARED], [GOOD])[0]
    assert again.outputs[0].token_ids == want
    assert_serves(llm, expected_good)


def test_streaming_engine_reports_the_error(
    model_dir: Path, expected_good: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    llm = make_llm(model_dir)
    engine = llm.llm_engine
    engine.add_request("good", GOOD_PROMPT, GOOD)
    engine.add_request("bad", BAD_PROMPT, SamplingParams(max_tokens=5, seed=666))
    fail_sampling_for_seed(monkeypatch, 666)
    finished: dict[str, RequestOutput] = {}
    for _ in range(50):
        if not engine.has_unfinished_requests():
            break
        finished.update({o.request_id: o for o in engine.step() if o.finished})
    assert finished["bad"].outputs[0].finish_reason == "error"
    assert finished["good"].outputs[0].token_ids == expected_good
    assert_serves(llm, expected_good)


def test_generate_is_all_or_nothing(model_dir: Path, expected_good: list[int]) -> None:
    llm = make_llm(model_dir)
    with pytest.raises(ValueError, match="prompt 2: .*outside the vocabulary"):
        llm.generate(
            [GOOD_PROMPT, GOOD_PROMPT, {"prompt_token_ids": [VOCAB + 5]}], GOOD, use_tqdm=False
        )
    assert_idle(llm)
    with pytest.raises(TypeError, match="prompt 1"):
        llm.generate([GOOD_PROMPT, 3.5], GOOD, use_tqdm=False)  # type: ignore[list-item]
    assert_serves(llm, expected_good)


def test_a_failing_update_ends_the_step_and_the_engine_goes_on(
    model_dir: Path, expected_good: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    llm = make_llm(model_dir)
    scheduler = llm.llm_engine.scheduler
    real = scheduler.update_from_output
    calls = [0]

    def update(*args: Any) -> Any:
        calls[0] += 1
        if calls[0] == 2:
            raise RuntimeError("injected update failure")
        return real(*args)

    monkeypatch.setattr(scheduler, "update_from_output", update)
    outs = serve(llm, [GOOD_PROMPT, BAD_PROMPT], [GOOD, GOOD])
    assert [o.outputs[0].finish_reason for o in outs] == ["error", "error"]
    assert "applying the step failed" in (outs[0].error or "")
    monkeypatch.undo()
    assert_serves(llm, expected_good)
