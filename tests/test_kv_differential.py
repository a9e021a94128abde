"""Differential test: random request sequences (shared prefixes, admissions
with prefix hits, chunked allocation, decode tokens, frees, removals, resets,
statistics, rejected calls) drive the Rust core and the Python twin side by
side. Every answer must be identical, as must the whole visible state (block
ids, free-queue order, reference counts, cached blocks), and both must keep
the KV-cache invariants of docs/scheduling.md §10 after every call.
Hypothesis draws from the run's seed (docs/testing.md)."""

from __future__ import annotations

from typing import Any

from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

import ironbatch
import ironbatch.reference

from kv_invariants import check_kv_invariants
from seeded import run_machine

# A few prompts that share prefixes of different lengths, so lookups hit.
_BASE = [(7 * i) % 50 for i in range(200)]
PREFIXES = [_BASE, _BASE[:40] + [99] * 160, [3] * 200]


def outcome(call: Any) -> tuple[str, Any]:
    """A call's result, or the type of the exception it raised."""
    try:
        return ("ok", call())
    except (ValueError, TypeError) as e:
        return ("error", type(e).__name__)


class KvDifferential(RuleBasedStateMachine):
    @initialize(
        num_blocks=st.integers(2, 8) | st.integers(9, 48),
        block_size=st.sampled_from([1, 2, 4, 16]),
        max_model_len=st.integers(8, 160),
        caching=st.booleans(),
    )
    def build(self, num_blocks: int, block_size: int, max_model_len: int, caching: bool) -> None:
        args = (num_blocks, block_size, max_model_len, caching)
        self.rust = ironbatch.KVCacheManager(*args)
        self.twin = ironbatch.reference.KVCacheManager(*args)
        self.live: list[str] = []
        self.tokens: dict[str, list[int]] = {}
        self.next_id = 0

    def both(self, name: str, *args: Any, **kwargs: Any) -> Any:
        r = outcome(lambda: getattr(self.rust, name)(*args, **kwargs))
        p = outcome(lambda: getattr(self.twin, name)(*args, **kwargs))
        assert r == p, (name, args, kwargs, r, p)
        return r

    def pick(self, data: st.DataObject, where: Any) -> str | None:
        candidates = [r for r in self.live if where(r)]
        return data.draw(st.sampled_from(candidates)) if candidates else None

    def any_live(self, data: st.DataObject) -> str:
        return data.draw(st.sampled_from(self.live))

    def remaining(self, rid: str) -> int:
        return self.twin.num_tokens(rid) - self.twin.num_computed_tokens(rid)

    # -- rules ---------------------------------------------------------------

    @rule(
        prefix=st.sampled_from(range(len(PREFIXES))),
        shared=st.sampled_from([0, 8, 16, 32, 48, 64]) | st.integers(0, 64),
        suffix=st.lists(st.integers(0, 60), min_size=1, max_size=24),
        salt=st.sampled_from([None, None, None, "A", "B"]),
    )
    def add(self, prefix: int, shared: int, suffix: list[int], salt: str | None) -> None:
        rid = f"r{self.next_id}"
        self.next_id += 1
        tokens = PREFIXES[prefix][:shared] + suffix
        kind, _ = self.both("add_request", rid, tokens, cache_salt=salt)
        if kind == "ok":
            self.live.append(rid)
            self.tokens[rid] = tokens

    @precondition(lambda self: self.live)
    @rule(data=st.data(), extra=st.lists(st.integers(0, 60), min_size=1, max_size=8))
    def add_sibling(self, data: st.DataObject, extra: list[int]) -> None:
        """A request that shares a live request's prefix, so lookups hit."""
        source = self.any_live(data)
        tokens = self.tokens[source]
        keep = data.draw(st.integers(0, len(tokens)))
        rid = f"r{self.next_id}"
        self.next_id += 1
        kind, _ = self.both("add_request", rid, tokens[:keep] + extra)
        if kind == "ok":
            self.live.append(rid)
            self.tokens[rid] = tokens[:keep] + extra

    @precondition(lambda self: self.live)
    @rule(data=st.data(), gate=st.booleans())
    def admit(self, data: st.DataObject, gate: bool) -> None:
        """A waiting request's admission: prefix lookup, then a chunk."""
        rid = self.pick(data, lambda r: not self.twin.get_block_ids(r))
        if rid is None:
            return
        _, (hits, hit_tokens) = self.both("get_computed_blocks", rid)
        n_new = data.draw(st.integers(1, self.twin.num_tokens(rid) - hit_tokens))
        kind, new = self.both("allocate_slots", rid, n_new, hit_tokens, hits, gate)
        assert kind == "ok"
        event("admit: " + ("refused" if new is None else "hit" if hits else "miss"))
        if new is not None:
            self.both("set_num_computed_tokens", rid, hit_tokens + n_new)
            self.both("record_prefix_cache_stats", rid, hit_tokens, data.draw(st.booleans()))

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def compute_more(self, data: st.DataObject) -> None:
        """A running request's next chunk (or the token a decode appended)."""
        rid = self.pick(data, lambda r: self.twin.get_block_ids(r) and self.remaining(r) > 0)
        if rid is None:
            return
        n_new = data.draw(st.integers(1, self.remaining(rid)))
        kind, new = self.both("allocate_slots", rid, n_new)
        assert kind == "ok"
        event("compute_more: " + ("refused" if new is None else "allocated"))
        if new is not None:
            self.both("set_num_computed_tokens", rid, self.twin.num_computed_tokens(rid) + n_new)

    @precondition(lambda self: self.live)
    @rule(data=st.data(), tokens=st.lists(st.integers(0, 60), min_size=1, max_size=3))
    def decode(self, data: st.DataObject, tokens: list[int]) -> None:
        """Output tokens arrive for a request whose known tokens are computed."""
        rid = self.pick(data, lambda r: self.twin.get_block_ids(r) and self.remaining(r) == 0)
        if rid is not None:
            kind, _ = self.both("append_token_ids", rid, tokens)
            if kind == "ok":
                self.tokens[rid] = self.tokens[rid] + tokens

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        """Preemption: blocks back to the pool, the request stays."""
        rid = self.any_live(data)
        self.both("free", rid)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def remove(self, data: st.DataObject) -> None:
        rid = self.any_live(data)
        self.both("remove_request", rid)
        self.live.remove(rid)

    @rule()
    def reset(self) -> None:
        self.both("reset_prefix_cache")

    @rule()
    def stats(self) -> None:
        r = self.rust.make_prefix_cache_stats()
        p = self.twin.make_prefix_cache_stats()
        fields = [
            "reset",
            "requests",
            "queries",
            "hits",
            "preempted_requests",
            "preempted_queries",
            "preempted_hits",
        ]
        assert [getattr(r, f) for f in fields] == [getattr(p, f) for f in fields]

    @precondition(lambda self: self.live)
    @rule(data=st.data(), bogus=st.lists(st.integers(-2, 45), min_size=1, max_size=4))
    def rejected_hits(self, data: st.DataObject, bogus: list[int]) -> None:
        """Hits that are not the request's cached blocks are refused, alike,
        with nothing changed (the invariants and state checks follow)."""
        rid = self.any_live(data)
        hits, _ = self.twin.get_computed_blocks(rid)
        if bogus == hits[: len(bogus)]:
            return
        n_hit = len(bogus) * self.twin.block_size
        kind, _ = self.both("allocate_slots", rid, 1, n_hit, bogus)
        assert kind == "error"

    # -- after every step ----------------------------------------------------

    @invariant()
    def same_state_and_invariants(self) -> None:
        if not hasattr(self, "rust"):
            return
        r, p = self.rust, self.twin
        assert r.free_block_ids() == p.free_block_ids()
        assert r.block_ref_cnts() == p.block_ref_cnts()
        assert sorted(r.cached_blocks().values()) == sorted(p.cached_blocks().values())
        for rid in self.live:
            assert r.get_block_ids(rid) == p.get_block_ids(rid)
            assert r.num_cached_blocks(rid) == p.num_cached_blocks(rid)
            assert r.num_computed_tokens(rid) == p.num_computed_tokens(rid)
            assert r.num_tokens(rid) == p.num_tokens(rid)
        check_kv_invariants(r, self.live)
        check_kv_invariants(p, self.live)

    def teardown(self) -> None:
        # Return of blocks: removing every request frees every block.
        if hasattr(self, "rust"):
            for rid in self.live:
                self.both("remove_request", rid)
            for kv in (self.rust, self.twin):
                assert kv.num_free_blocks == kv.num_blocks - 1
                assert set(kv.block_ref_cnts()) == {0}


def test_kv_differential(full_size: bool) -> None:
    run_machine(KvDifferential, 300, 1500, steps=60, full=full_size)
