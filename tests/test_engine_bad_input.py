"""Bad input to the engine: a clear error, and the engine keeps serving its
other requests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from engine_models import build  # noqa: E402

from ironbatch import SamplingParams  # noqa: E402
from ironbatch.engine import LLM  # noqa: E402


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("llama")
    build("llama", path)
    return path


def test_missing_and_corrupt_model_directories(tmp_path: Path, model_dir: Path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        LLM(str(tmp_path / "nope"))
    with pytest.raises(ValueError, match="no config.json"):
        LLM(str(tmp_path))
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        LLM(str(tmp_path))
    config = json.loads((model_dir / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="no \\*.safetensors"):
        LLM(str(tmp_path))
    (tmp_path / "model.safetensors").write_bytes(b"\x00" * 64)
    with pytest.raises(ValueError, match="cannot read weights"):
        LLM(str(tmp_path))


def test_unsupported_architecture(tmp_path: Path, model_dir: Path) -> None:
    config = json.loads((model_dir / "config.json").read_text())
    config["architectures"] = ["GPT2LMHeadModel"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="not supported"):
        LLM(str(tmp_path))


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"temperature": -0.5}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"n": 0}, "n"),
        ({"min_p": 2.0}, "min_p"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"stop": [""]}, "stop"),
    ],
)
def test_invalid_sampling_parameters(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


def test_bad_prompts_are_refused_and_the_engine_goes_on(model_dir: Path) -> None:
    llm = LLM(str(model_dir), dtype="float32", num_blocks=64)
    engine = llm.llm_engine
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    good = engine.add_request("good", {"prompt_token_ids": [5, 6, 7]}, params)
    engine.step()
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.add_request("bad", {"prompt_token_ids": [5, 100000]}, params)
    with pytest.raises(ValueError, match="tokenizer"):
        engine.add_request("text", "hello", params)  # this model ships no tokenizer
    with pytest.raises(ValueError, match="max_model_len"):
        engine.add_request("long", {"prompt_token_ids": [5] * 600}, params)
    with pytest.raises(ValueError, match="already"):
        engine.add_request(good, {"prompt_token_ids": [5]}, params)
    finished = []
    while engine.has_unfinished_requests():
        finished += [o for o in engine.step() if o.finished]
    assert [o.request_id for o in finished] == ["good"]
    assert len(finished[0].outputs[0].token_ids) == 4
