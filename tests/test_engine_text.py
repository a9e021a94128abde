"""Text in, text out: prompts tokenized with the model's tokenizer.json,
outputs detokenized incrementally, stop strings ending a request through the
scheduler, and logprobs."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from engine_models import build, hf_greedy, write_tokenizer  # noqa: E402

from ironbatch import SamplingParams  # noqa: E402
from ironbatch.engine import LLM  # noqa: E402

GREEDY = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory):
    path = tmp_path_factory.mktemp("text-llama")
    hf = build("llama", path, vocab=320)
    tok = write_tokenizer(path)
    return path, hf, tok, LLM(str(path), dtype="float32", num_blocks=64)


def test_text_prompts_and_detokenized_output(setup) -> None:
    path, hf, tok, llm = setup
    out = llm.generate("hello world", GREEDY, use_tqdm=False)[0]
    ids = tok.encode("hello world").ids
    assert out.prompt == "hello world" and out.prompt_token_ids == ids
    assert out.outputs[0].token_ids == hf_greedy(hf, ids, 16)
    assert out.outputs[0].text == tok.decode(out.outputs[0].token_ids)


def test_stop_string_ends_the_request(setup) -> None:
    _, _, _, llm = setup
    full = llm.generate("the lazy dog", GREEDY, use_tqdm=False)[0].outputs[0]
    stop = full.text[4:7]
    assert len(stop) == 3 and stop in full.text
    cut = full.text.index(stop)
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True, stop=[stop])
    got = llm.generate("the lazy dog", params, use_tqdm=False)[0].outputs[0]
    assert (got.text, got.finish_reason, got.stop_reason) == (full.text[:cut], "stop", stop)
    assert len(got.token_ids) < len(full.token_ids)  # it really stopped early
    assert got.token_ids == full.token_ids[: len(got.token_ids)]
    assert not llm.llm_engine.has_unfinished_requests()
    keep = SamplingParams(
        max_tokens=16,
        temperature=0.0,
        ignore_eos=True,
        stop=[stop],
        include_stop_str_in_output=True,
    )
    kept = llm.generate("the lazy dog", keep, use_tqdm=False)[0].outputs[0]
    assert kept.text == full.text[: cut + len(stop)]


def test_logprobs(setup) -> None:
    _, _, _, llm = setup
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, logprobs=2)
    c = llm.generate("quick brown", params, use_tqdm=False)[0].outputs[0]
    assert len(c.logprobs) == len(c.token_ids) == 6
    chosen = [lp[t] for lp, t in zip(c.logprobs, c.token_ids, strict=True)]
    assert all(v <= 0 for v in chosen)
    assert all(
        len(lp) <= 3 and max(lp.values()) == lp[t]  # greedy: chosen is the top
        for lp, t in zip(c.logprobs, c.token_ids, strict=True)
    )
    assert c.cumulative_logprob == pytest.approx(sum(chosen))


def test_streaming_with_the_engine(setup) -> None:
    _, _, tok, llm = setup
    engine = llm.llm_engine
    engine.add_request("s", "hello", GREEDY)
    deltas, ids = [], []
    while engine.has_unfinished_requests():
        for out in engine.step():
            deltas.append(out.text_delta)
            ids += out.new_token_ids
    assert "".join(deltas) == tok.decode(ids) and len(ids) == 16
    assert out.finished and out.metrics.first_token_time <= out.metrics.finished_time


def test_detokenizer_holds_back_partial_characters_until_the_end() -> None:
    from ironbatch.engine.detokenizer import IncrementalDetokenizer

    class Bytes:  # decodes token ids as raw UTF-8 bytes
        def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
            return bytes(ids).decode("utf-8", errors="replace")

    d = IncrementalDetokenizer(Bytes(), True)
    euro = list("€".encode())  # three bytes
    assert d.add([104]) == "h"
    assert d.add([104, euro[0]]) == ""  # an incomplete character is held back
    assert d.add([104, *euro]) == "€"
    assert d.add([104, *euro, euro[0]], final=True) == "\ufffd"  # at the end, shown as is
