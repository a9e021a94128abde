"""Build vLLM schedulers the way vLLM's EngineCore does (``ironbatch.vllm.
harness``), plus the model runner's part for the tests. Importing this needs
vLLM: the tests in this folder run in the vLLM venv of
``scripts/test_vllm.sh``."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from vllm.v1.outputs import ModelRunnerOutput

from ironbatch.vllm.harness import (
    DEFAULTS,
    EOS,
    construct,
    draw_layout,
    make_request,
    make_scheduler,
    tiny_model_dir,
    vllm_config,
)

__all__ = [
    "DEFAULTS",
    "EOS",
    "construct",
    "draw_layout",
    "env_var",
    "make_request",
    "make_scheduler",
    "runner_output",
    "tiny_model_dir",
    "vllm_config",
]


def runner_output(
    scheduler_output: Any, sampled: dict[str, list[int]] | None = None
) -> ModelRunnerOutput:
    """What the model runner returns for a step: ``sampled[req_id]`` tokens
    for each scheduled request (none for those not listed)."""
    ids = list(scheduler_output.num_scheduled_tokens)
    sampled = sampled or {}
    return ModelRunnerOutput(
        req_ids=ids,
        req_id_to_index={r: i for i, r in enumerate(ids)},
        sampled_token_ids=[list(sampled.get(r, [])) for r in ids],
    )


@contextlib.contextmanager
def env_var(name: str, value: str | None) -> Iterator[None]:
    """``name`` set to ``value`` (left alone when None) inside the block, as
    it was after; vLLM reads some choices (its model runner) from the
    environment when its config is made."""
    old = os.environ.get(name)
    if value is not None:
        os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old
