"""KV-cache microbenchmarks: the Rust core against the plain-Python twin in
the same run, each through its Python API (call overhead included).

    pytest benches/test_bench_kv.py            # pytest-benchmark's tables
    python benches/kv_report.py                # one table of twin/core ratios

Rows:
- alloc_free[k]: allocate_slots for a request needing k new blocks, then
  free it (prefix caching off: this row is the pool and free queue; the
  hashing and lookups have rows of their own);
- lookup_4k[hit|miss]: get_computed_blocks over a 4,096-token prompt whose
  255 lookable blocks are all cached, or whose first block misses;
- hash_4k: registering a 4,096-token prompt (its 256 block hashes) and
  looking it up, the work a new request's admission starts with;
- append_token: append_token_ids with one token, as decoding does, hashing
  a block every block_size tokens.
"""

from __future__ import annotations

import itertools
import random
from types import ModuleType
from typing import Any

import pytest

import ironbatch
import ironbatch.reference

BACKENDS = {"rust": ironbatch, "python": ironbatch.reference}
BS = 16
PROMPT_4K = [random.Random(0).randrange(32000) for _ in range(4096)]


@pytest.fixture(params=list(BACKENDS))
def backend(request: pytest.FixtureRequest) -> ModuleType:
    return BACKENDS[request.param]


def manager(backend: ModuleType, caching: bool = True) -> Any:
    return backend.KVCacheManager(4096, BS, 1 << 20, caching)


@pytest.mark.parametrize("k", [1, 4, 16, 64])
def test_alloc_free(benchmark: Any, backend: ModuleType, k: int) -> None:
    benchmark.group = f"alloc_free[{k}]"
    kv = manager(backend, caching=False)
    kv.add_request("r", list(range(k * BS)))

    def alloc_free() -> None:
        kv.allocate_slots("r", k * BS)
        kv.free("r")

    benchmark(alloc_free)
    assert kv.num_free_blocks == kv.num_blocks - 1


@pytest.mark.parametrize("case", ["hit", "miss"])
def test_lookup_4k(benchmark: Any, backend: ModuleType, case: str) -> None:
    benchmark.group = f"lookup_4k[{case}]"
    kv = manager(backend)
    kv.add_request("warm", PROMPT_4K)
    kv.allocate_slots("warm", len(PROMPT_4K))
    kv.free("warm")
    probe = PROMPT_4K if case == "hit" else [7] + PROMPT_4K[1:]
    kv.add_request("probe", probe)
    hits, n = benchmark(kv.get_computed_blocks, "probe")
    assert n == (4096 - BS if case == "hit" else 0)


def test_hash_4k(benchmark: Any, backend: ModuleType) -> None:
    benchmark.group = "hash_4k"
    kv = manager(backend)
    kv.add_request("warm", PROMPT_4K)
    kv.allocate_slots("warm", len(PROMPT_4K))
    kv.free("warm")
    ids = (f"q{i}" for i in itertools.count())

    def admit_lookup() -> int:
        rid = next(ids)
        kv.add_request(rid, PROMPT_4K)
        _, n = kv.get_computed_blocks(rid)
        kv.remove_request(rid)
        return n

    assert benchmark(admit_lookup) == 4096 - BS


def test_append_token(benchmark: Any, backend: ModuleType) -> None:
    benchmark.group = "append_token"
    kv = manager(backend)
    kv.add_request("r", [1])
    token = [5]
    benchmark.pedantic(kv.append_token_ids, args=("r", token), rounds=200, iterations=1000)
    assert kv.num_tokens("r") > 1000
