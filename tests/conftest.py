"""Shared fixtures: every KV-cache test runs against the Rust core and the
plain-Python twin alike; the random-workload suites draw their workloads
from this run's seed (docs/testing.md)."""

from __future__ import annotations

import os

# Triton reads this when a kernel is decorated, so before anything imports
# ironbatch.kernels: the kernel tests run on the CPU interpreter.
os.environ.setdefault("TRITON_INTERPRET", "1")

import importlib.util  # noqa: E402
import secrets  # noqa: E402
import types  # noqa: E402

import pytest  # noqa: E402

import ironbatch  # noqa: E402
import ironbatch.reference  # noqa: E402

from seeded import SEED_LIMIT, Workloads  # noqa: E402

BACKENDS = {"rust": ironbatch, "python": ironbatch.reference}

# The vLLM drop-in's tests need vLLM, which lives in a venv of its own and
# runs them there (scripts/test_vllm.sh, part of the README's test command).
if importlib.util.find_spec("vllm") is None:
    collect_ignore = ["vllm_dropin"]


@pytest.fixture(params=list(BACKENDS), ids=list(BACKENDS))
def backend(request: pytest.FixtureRequest) -> types.ModuleType:
    """The module holding ``KVCacheManager`` and ``BlockPool`` for one backend."""
    return BACKENDS[request.param]


# -- this run's seed and size (docs/testing.md) -------------------------------

_SEED = pytest.StashKey[int]()
_FULL = pytest.StashKey[bool]()


def _env_seed() -> int | None:
    text = os.environ.get("IRONBATCH_SEED", "").strip()
    if not text:
        return None
    if not text.isdigit() or int(text) >= SEED_LIMIT:
        raise pytest.UsageError(
            f"IRONBATCH_SEED={text!r}: expected a whole number from 0 to {SEED_LIMIT - 1}"
        )
    return int(text)


def _env_full() -> bool:
    text = os.environ.get("IRONBATCH_FULL", "").strip()
    if text not in ("", "0", "1"):
        raise pytest.UsageError(f"IRONBATCH_FULL={text!r}: expected 1 (full size) or 0")
    return text == "1"


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """Reads IRONBATCH_SEED (else draws a seed) and IRONBATCH_FULL once per
    run. First, so that Hypothesis takes the same seed unless
    --hypothesis-seed says otherwise."""
    seed = _env_seed()
    config.stash[_SEED] = secrets.randbelow(SEED_LIMIT) if seed is None else seed
    config.stash[_FULL] = _env_full()
    if getattr(config.option, "hypothesis_seed", "absent") is None:
        config.option.hypothesis_seed = str(config.stash[_SEED])


def _seed_line(config: pytest.Config) -> str:
    size = "full size" if config.stash[_FULL] else "per-run size (IRONBATCH_FULL=1: full)"
    seed = config.stash[_SEED]
    return f"ironbatch seed {seed}, {size}; replay with IRONBATCH_SEED={seed}"


def pytest_report_header(config: pytest.Config) -> str:
    return _seed_line(config)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    # Again at the end, where a failure's log is read.
    terminalreporter.write_line(_seed_line(terminalreporter.config))


@pytest.fixture
def full_size(request: pytest.FixtureRequest) -> bool:
    """Whether this run is the full-size one (IRONBATCH_FULL=1)."""
    return request.config.stash[_FULL]


@pytest.fixture(scope="module")
def workloads(request: pytest.FixtureRequest) -> Workloads:
    """This run's workload seeds and sizes for the requesting test file
    (module-scoped: a module's fixtures may draw a whole run's seeds once)."""
    config = request.config
    return Workloads(config.stash[_SEED], config.stash[_FULL], request.path.name)
