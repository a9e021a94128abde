"""Structured outputs with real grammars: vLLM's own xgrammar backend
compiles JSON-schema, regex and choice grammars over a small character-level
tokenizer built here with ``tokenizers``, one compile per engine as
EngineCore does. The model samples tokens the grammar masks allow, so the
grammars advance to their end; vLLM's scheduler and the drop-in, each with
its own structured-output manager, must agree on every step, every grammar
mask and every output (``vllm_pair``), sync and async. The workloads' seeds
follow from the run's seed (docs/testing.md)."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("vllm")
pytest.importorskip("xgrammar")

from tokenizers import Tokenizer, models, pre_tokenizers  # noqa: E402
from vllm.sampling_params import StructuredOutputsParams  # noqa: E402

import vllm_setup  # noqa: E402
from seeded import Workloads  # noqa: E402
from vllm_pair import VllmPair  # noqa: E402

EOS = vllm_setup.EOS  # "</s>" below
CHARS = list('{}[]":,. ') + [chr(c) for c in range(ord("a"), ord("z") + 1)] + list("0123456789")
GRAMMARS = [
    StructuredOutputsParams(
        json={
            "type": "object",
            "properties": {"id": {"type": "integer"}, "ok": {"type": "boolean"}},
            "required": ["id", "ok"],
        }
    ),
    StructuredOutputsParams(regex="[a-z]{2,6}( [0-9]{1,3})?"),
    StructuredOutputsParams(choice=["yes", "no", "maybe"]),
]
WORKLOADS = 48  # per run; FULL_WORKLOADS with IRONBATCH_FULL=1
FULL_WORKLOADS = 240


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A character-level tokenizer: <unk> 0, <s> 1, </s> 2 (EOS), then one
    token per character of CHARS."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": EOS}
    for ch in CHARS:
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    path: Path = tmp_path_factory.mktemp("char-tokenizer")
    tok.save(str(path / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "model_max_length": 4096,
    }
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    # vLLM reads the model type next to a tokenizer too.
    (path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    return str(path)


def run_workload(seed: int, tokenizer: str, steps: int = 80) -> Counter:
    rng = random.Random(seed)
    pair = VllmPair(
        rng,
        tokenizer=tokenizer,
        async_scheduling=rng.random() < 0.5,
        policy=rng.choice(["fcfs", "priority"]),
        max_num_seqs=rng.choice([2, 4, 8]),
        max_num_batched_tokens=rng.choice([32, 64, 256]),
        block_size=rng.choice([4, 16]),
        num_blocks=rng.choice([24, 200]),
        max_model_len=128,
    )
    pair.choose = lambda: EOS if rng.random() < 0.05 else rng.randrange(3, 3 + len(CHARS))
    for i in range(rng.randint(3, 8)):
        structured = rng.random() < 0.6
        pair.add(
            f"r{i}",
            [rng.randrange(3, 3 + len(CHARS)) for _ in range(rng.randint(1, 40))],
            max_tokens=rng.randint(4, 40),
            arrival_time=float(i),
            priority=rng.randint(0, 2),
            structured_outputs=rng.choice(GRAMMARS) if structured else None,
        )
    for _ in range(steps):
        if not pair.vllm.has_requests() and not pair.in_flight:
            break
        pair.schedule()
        if len(pair.in_flight) >= 2 or not pair.vllm.scheduler_config.async_scheduling:
            pair.update_oldest()
    while pair.in_flight:
        pair.update_oldest()
    return pair.events


def test_real_grammars_agree_with_vllm(tokenizer_dir: str, workloads: Workloads) -> None:
    seeds = workloads.seeds(WORKLOADS, FULL_WORKLOADS)
    events: Counter = Counter()
    for seed in seeds:
        events += run_workload(seed, tokenizer_dir)
    # The grammars were really used: masks taken, tokens sampled from them,
    # and requests finished (a grammar lets EOS through once complete), each
    # at least 50 times per 48 workloads.
    for what in ("masked_rows", "grammar_sampled", "finished"):
        assert events[what] >= -(-50 * len(seeds) // 48), (what, events)
