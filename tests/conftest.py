"""Shared fixtures: every KV-cache test runs against the Rust core and the
plain-Python twin alike."""

from __future__ import annotations

import os

# Triton reads this when a kernel is decorated, so before anything imports
# ironbatch.kernels: the kernel tests run on the CPU interpreter.
os.environ.setdefault("TRITON_INTERPRET", "1")

import importlib.util  # noqa: E402
import types  # noqa: E402

import pytest  # noqa: E402

import ironbatch  # noqa: E402
import ironbatch.reference  # noqa: E402

BACKENDS = {"rust": ironbatch, "python": ironbatch.reference}

# The vLLM drop-in's tests need vLLM, which lives in a venv of its own and
# runs them there (scripts/test_vllm.sh, part of the README's test command).
if importlib.util.find_spec("vllm") is None:
    collect_ignore = ["vllm_dropin"]


@pytest.fixture(params=list(BACKENDS), ids=list(BACKENDS))
def backend(request: pytest.FixtureRequest) -> types.ModuleType:
    """The module holding ``KVCacheManager`` and ``BlockPool`` for one backend."""
    return BACKENDS[request.param]
