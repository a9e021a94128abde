"""'ironbatch generate': complete prompts with a local Hugging Face model,
or with --model random (the demo's small random-weight Llama, for a try
without a download: it has no tokenizer, so its prompts are token ids,
--prompt ids:1,2,3)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, NoReturn

from ironbatch.cli.demo import check_model_dir, model_directory
from ironbatch.cli.options import integer, number
from ironbatch.reference.limits import MAX_MODEL_LEN
from ironbatch.sampling_params import MAX_TEMPERATURE, SamplingParams

IDS = "ids:"


def add_parser(sub: argparse._SubParsersAction) -> None:
    g = sub.add_parser(
        "generate",
        help="complete prompts with a local model (or --model random)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    g.add_argument(
        "--model",
        required=True,
        help="a local Hugging Face model directory (config.json, *.safetensors, and "
        "tokenizer.json for text prompts), or 'random': the demo's random-weight Llama",
    )
    g.add_argument(
        "--prompt",
        action="append",
        required=True,
        help="text, or ids:1,2,3 for token ids (repeatable)",
    )
    g.add_argument(
        "--max-tokens",
        type=integer(1, MAX_MODEL_LEN),
        default=64,
        help="the most tokens to generate per prompt (default 64)",
    )
    g.add_argument(
        "--temperature",
        type=number(0, MAX_TEMPERATURE),
        default=0.0,
        help="sampling temperature; 0 is greedy (default 0)",
    )
    g.add_argument(
        "--seed",
        type=integer(0, 2**63 - 1),
        help="the sampling seed, for repeatable samples at a temperature above 0",
    )
    g.add_argument(
        "--attention-backend",
        choices=["torch", "triton"],
        help="the attention kernels (default: triton on CUDA, torch on a CPU)",
    )
    g.add_argument(
        "--enforce-eager",
        action="store_true",
        help="run every step eagerly: no padded decode steps, no CUDA graphs (as vLLM's flag)",
    )
    g.add_argument(
        "--speculative-config",
        help="n-gram speculation as a JSON object of vLLM's keys, e.g. "
        '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}',
    )


def generate_main(args: argparse.Namespace) -> int:
    from ironbatch.engine import LLM

    # Every option checked before the model loads.
    model = check_model_dir(args.model)
    speculative = _speculative(args.speculative_config)
    inputs = [_parse(p) for p in args.prompt]
    texts = [p for p in args.prompt if not p.startswith(IDS)]
    if texts and (model is None or not (Path(model) / "tokenizer.json").is_file()):
        which = "--model random" if model is None else f"--model {model!r}"
        raise ValueError(
            f"--prompt {texts[0]!r}: {which} has no tokenizer.json, so give token ids instead, "
            "e.g. --prompt ids:1,2,3"
        )
    params = SamplingParams(
        max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed
    )
    with model_directory(model, seed=0) as path:
        llm = LLM(
            path,
            attention_backend=args.attention_backend,
            speculative_config=speculative,
            enforce_eager=args.enforce_eager,
        )
    engine = llm.llm_engine
    for text, prompt in zip(args.prompt, inputs, strict=True):
        try:  # what needs the model (ids inside its vocabulary, a prompt that fits)
            engine.prepare_request(None, prompt, params)
        except (ValueError, TypeError) as e:
            raise type(e)(f"--prompt {text!r}: {e}") from None
    outputs = llm.generate(inputs, params, use_tqdm=sys.stderr.isatty())
    for prompt, out in zip(args.prompt, outputs, strict=True):
        c = out.outputs[0]
        print(f"--- {prompt!r}\n{c.text if c.text else c.token_ids}  [{c.finish_reason}]")
    return 0


def _parse(prompt: str) -> str | dict[str, list[int]]:
    """Text, or ``ids:1,2,3`` for token ids."""
    if not prompt.startswith(IDS):
        return prompt
    try:
        ids = [int(t) for t in prompt[len(IDS) :].split(",")]
    except ValueError:
        ids = [-1]
    if any(t < 0 for t in ids):
        raise ValueError(
            f"--prompt {prompt!r}: ids: takes token ids (integers >= 0) separated by commas, "
            "e.g. ids:1,2,3"
        )
    return {"prompt_token_ids": ids}


def _speculative(text: str | None) -> dict[str, Any] | None:
    """``--speculative-config``: a JSON object of vLLM's keys, checked as the
    engine will take it."""
    from ironbatch.engine.speculative_config import SpeculativeConfig

    if text is None:
        return None

    def refuse(what: str) -> NoReturn:
        raise ValueError(f"--speculative-config {text!r}: {what}")

    def no_constant(name: str) -> NoReturn:
        refuse(f"{name} is not a JSON number")

    try:
        config = json.loads(text, parse_constant=no_constant)
    except json.JSONDecodeError as e:
        refuse(f"not valid JSON ({e.msg} at column {e.colno})")
    if not isinstance(config, dict):
        refuse(f"must be a JSON object, got {type(config).__name__}")
    try:
        SpeculativeConfig.of(config)
    except (ValueError, TypeError) as e:
        refuse(str(e).removeprefix("speculative_config "))
    return config
