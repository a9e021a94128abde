"""The KV-cache invariants of docs/scheduling.md §10, checked from the outside through the
public inspection methods, so they hold any implementation to the same rules."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from ironbatch.reference.block import cdiv


def check_kv_invariants(kv: Any, request_ids: Iterable[str]) -> None:
    request_ids = list(request_ids)
    n = kv.num_blocks
    ref = kv.block_ref_cnts()
    queue = kv.free_block_ids()
    assert len(ref) == n

    # 1. Conservation: the queue holds exactly the non-null blocks with
    #    ref_cnt 0, each once; the null block is never queued or held.
    assert ref[0] == 0 and 0 not in queue
    assert len(queue) == len(set(queue)) == kv.num_free_blocks
    assert sorted(queue) == [b for b in range(1, n) if ref[b] == 0]
    assert kv.num_free_blocks + sum(1 for b in range(1, n) if ref[b] > 0) == n - 1
    assert abs(kv.usage - (1 - kv.num_free_blocks / (n - 1))) < 1e-12

    # 2. Reference counts equal the number of tables holding each block.
    held = Counter(b for r in request_ids for b in kv.get_block_ids(r))
    assert [held.get(b, 0) for b in range(n)] == ref

    # 3. Hash consistency: a block has a hash iff the map holds it under it.
    in_map = {}
    for h, ids in kv.cached_blocks().items():
        assert ids, "an empty entry in the prefix-cache map"
        for b in ids:
            assert b not in in_map, f"block {b} is in the map twice"
            in_map[b] = h
    assert 0 not in in_map
    for b in range(n):
        assert kv.block_hash(b) == in_map.get(b)

    # 4. Cached prefix and 7. table size.
    bs = kv.block_size
    for r in request_ids:
        table = kv.get_block_ids(r)
        hashes = kv.block_hashes(r)
        cached = kv.num_cached_blocks(r)
        assert cached <= len(hashes) and cached <= len(table)
        for k, b in enumerate(table):
            assert kv.block_hash(b) == (hashes[k] if k < cached else None), (r, k, b)
        assert kv.num_computed_tokens(r) <= kv.num_tokens(r)
        assert len(table) >= cdiv(kv.num_computed_tokens(r), bs)
        assert len(hashes) == kv.num_tokens(r) // bs

    # 9. Return of blocks.
    if not any(kv.get_block_ids(r) for r in request_ids):
        assert kv.num_free_blocks == n - 1
