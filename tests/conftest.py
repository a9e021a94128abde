"""Shared fixtures: every KV-cache test runs against the Rust core and the
plain-Python twin alike."""

from __future__ import annotations

import types

import pytest

import ironbatch
import ironbatch.reference

BACKENDS = {"rust": ironbatch, "python": ironbatch.reference}


@pytest.fixture(params=list(BACKENDS), ids=list(BACKENDS))
def backend(request: pytest.FixtureRequest) -> types.ModuleType:
    """The module holding ``KVCacheManager`` and ``BlockPool`` for one backend."""
    return BACKENDS[request.param]
