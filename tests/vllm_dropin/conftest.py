"""Fixtures of the drop-in tests."""

from __future__ import annotations

import pytest


@pytest.fixture(params=["vllm", "ironbatch"])
def kind(request: pytest.FixtureRequest) -> str:
    """Which scheduler to build: vLLM 0.33.0's own, or the drop-in."""
    return request.param
