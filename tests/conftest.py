"""Shared fixtures: every KV-cache test runs against the Rust core and the
plain-Python twin alike."""

from __future__ import annotations

import os

# Triton reads this when a kernel is decorated, so before anything imports
# ironbatch.kernels: the kernel tests run on the CPU interpreter.
os.environ.setdefault("TRITON_INTERPRET", "1")

import types  # noqa: E402

import pytest  # noqa: E402

import ironbatch  # noqa: E402
import ironbatch.reference  # noqa: E402

BACKENDS = {"rust": ironbatch, "python": ironbatch.reference}


@pytest.fixture(params=list(BACKENDS), ids=list(BACKENDS))
def backend(request: pytest.FixtureRequest) -> types.ModuleType:
    """The module holding ``KVCacheManager`` and ``BlockPool`` for one backend."""
    return BACKENDS[request.param]
