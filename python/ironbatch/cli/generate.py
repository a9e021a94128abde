"""``ironbatch generate``: complete prompts with a local model."""

from __future__ import annotations

import json
from typing import Any

from ironbatch.sampling_params import SamplingParams


def generate_main(
    model: str,
    prompts: list[str],
    max_tokens: int,
    temperature: float,
    seed: int | None,
    backend: str | None,
    *,
    speculative_config: str | None = None,
    enforce_eager: bool = False,
) -> int:
    from ironbatch.engine import LLM

    llm = LLM(
        model,
        attention_backend=backend,
        speculative_config=_speculative(speculative_config),
        enforce_eager=enforce_eager,
    )
    params = SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed)
    inputs = [_parse(p) for p in prompts]
    for prompt, out in zip(prompts, llm.generate(inputs, params), strict=True):
        c = out.outputs[0]
        print(f"--- {prompt!r}\n{c.text if c.text else c.token_ids}  [{c.finish_reason}]")
    return 0


def _parse(prompt: str) -> str | dict[str, list[int]]:
    """Text, or ``ids:1,2,3`` for token ids."""
    if not prompt.startswith("ids:"):
        return prompt
    try:
        return {"prompt_token_ids": [int(t) for t in prompt[4:].split(",")]}
    except ValueError:
        raise ValueError(f"--prompt {prompt!r}: ids: takes comma-separated ints") from None


def _speculative(text: str | None) -> dict[str, Any] | None:
    """``--speculative-config``: a JSON object, as vLLM takes it."""
    if text is None:
        return None
    try:
        config = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"--speculative-config is not valid JSON: {e}") from None
    if not isinstance(config, dict):
        raise ValueError(f"--speculative-config must be a JSON object, got {text!r}")
    return config
