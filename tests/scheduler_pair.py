"""Drive the Rust and the Python scheduler side by side with identical
input; every decision, every output and the whole visible state must match,
and the invariants of docs/scheduling.md §10 must hold after every call."""

from __future__ import annotations

from collections import Counter
from collections.abc import Set
from typing import Any

from ironbatch import Scheduler, _core
from ironbatch.reference.attention_group import ChunkedLocal, GroupSpec, Mamba, SlidingWindow
from ironbatch.reference.block import cdiv
from ironbatch.reference.scheduler_config import group_specs
from ironbatch.scheduler_output import STEP_COLUMNS

from scheduler_helpers import kv_events, make, req


class SchedulerPair:
    def __init__(self, **config: Any) -> None:
        self.config = config
        self.rust = make("rust", **config)
        self.twin = make("python", **config)
        self.bs = config.get("block_size", 16)
        self.groups = group_specs(config.get("kv_cache_groups"))
        self.hybrid = any(not g.kind.is_full() for g in self.groups)
        self.last_state: dict[str, Any] = self.rust.debug_state()
        self.in_flight: list[tuple[Any, Any]] = []  # outputs not yet applied, oldest first
        self.events: Counter = Counter()
        self._failed_grammars: list[str] = []
        self._encoder_mismatches: list[str] = []
        self.sessions: set[str] = set()  # ids added as streaming sessions
        # Requests in a step whose output came with a failed KV load.
        self.kv_cut: set[str] = set()
        self.with_connector = False  # set with the backends' KV connectors
        # Per backend, each block hash its auxiliary-output retention held,
        # named by first appearance.
        self._aux_names: tuple[dict[int, int], dict[int, int]] = ({}, {})
        # KV-cache events, compared after every call (the backends' cores).
        self.cores = (self.rust._core.core, self.twin._core.twin)
        for core in self.cores:
            core.enable_kv_events()
            core.enable_block_lifecycle_events()
            core.enable_request_events()

    def follow_aux_outputs(self) -> None:
        """Both cores follow auxiliary outputs (routed experts, §7.12); the
        twin's retention counts, in ``events``, the hits it capped and the
        blocks it released."""
        for core in self.cores:
            core.enable_aux_outputs()
        twin = self.cores[1]
        retention, kv, events = twin.aux_retention, twin.kv, self.events
        find_hit, cap, release = kv.find_hit, retention.cap_external_hit, retention._release_unheld

        def capped_find_hit(seq: Any, max_tokens: int | None = None) -> Any:
            hit = find_hit(seq, max_tokens)
            events["aux_local_capped"] += hit.tokens < find_hit(seq).tokens
            return hit

        def capped_external(*args: Any) -> int:
            kept = cap(*args)
            events["aux_external_capped"] += kept < args[3]
            return kept

        def counted_release(*args: Any) -> None:
            before = len(retention)
            release(*args)
            events["aux_released"] += before - len(retention)

        kv.find_hit = capped_find_hit
        retention.cap_external_hit = capped_external
        retention._release_unheld = counted_release

    def add(self, rid: str, tokens: list[int], **kw: Any) -> bool:
        if kw.get("resumable"):
            self.sessions.add(rid)
        results = []
        for s in (self.rust, self.twin):
            try:
                s.add_request(req(rid, tokens, **kw))
                results.append("ok")
            except ValueError as e:
                results.append(type(e).__name__)
        assert results[0] == results[1], results
        self.check()
        return results[0] == "ok"

    def finish(self, rid: str, status: str) -> None:
        self.rust.finish_requests([rid], status)
        self.twin.finish_requests([rid], status)
        self.check()

    def failed_grammars(self) -> list[str]:
        """The requests the last schedule() found with a failed grammar."""
        failed, self._failed_grammars = self._failed_grammars, []
        return failed

    def abort(self, rids: list[str]) -> None:
        self.rust.finish_requests(rids)
        self.twin.finish_requests(rids)
        self.events["abort"] += 1
        self.check()

    def pin(self, block_ids: list[int]) -> None:
        self.rust.pin_blocks(block_ids)
        self.twin.pin_blocks(block_ids)
        self.events["pinned"] += len(block_ids)
        self.check()

    def unpin(self, block_ids: list[int]) -> None:
        self.rust.unpin_blocks(block_ids)
        self.twin.unpin_blocks(block_ids)
        self.check()

    def reset_prefix_cache(self, reset_running_requests: bool) -> None:
        a = self.rust.reset_prefix_cache(reset_running_requests)
        b = self.twin.reset_prefix_cache(reset_running_requests)
        assert a == b
        self.events["reset"] += 1
        self.check()

    def report_grammar(self, rid: str, compiled: bool) -> None:
        self.rust.report_grammar(rid, compiled)
        self.twin.report_grammar(rid, compiled)
        self.check()

    def schedule(self, throttle_prefills: bool = False) -> None:
        twin = self.cores[1]  # what this step will hold, asked of the twin
        decoding = any(not twin.requests[s].prefill_chunk for s in twin.running)
        self.events["prefill_held"] += twin.cadence.holds(throttle_prefills, lambda: decoding)
        self.events["decode_staggered"] += sum(
            twin.current_step + 1 < twin.requests[s].next_decode_step for s in twin.running
        )
        before = self.last_state
        r = self.rust.schedule(throttle_prefills)
        p = self.twin.schedule(throttle_prefills)
        assert list(r.entries()) == list(p.entries())
        for i in range(len(r.req_ids)):
            assert r.block_ids_per_group(i) == p.block_ids_per_group(i)
        assert r.preempted_req_ids == p.preempted_req_ids
        assert r.finished_req_ids == p.finished_req_ids
        assert r.new_block_ids_to_zero == p.new_block_ids_to_zero
        for grammar in (
            "has_structured_output_requests",
            "pending_structured_output_tokens",
            "drafts_needed",
            "grammar_released_req_ids",
            "grammar_failed_req_ids",
        ):
            assert getattr(r, grammar) == getattr(p, grammar), grammar
        self.events["grammar_released"] += len(r.grammar_released_req_ids)
        self.events["grammar_failed"] += len(r.grammar_failed_req_ids)
        self._failed_grammars = r.grammar_failed_req_ids
        self.events["grammar_pending"] += r.pending_structured_output_tokens
        for col in STEP_COLUMNS:
            a, b = getattr(r, col), getattr(p, col)
            assert a.dtype == b.dtype and a.tolist() == b.tolist(), col
        self.events["drafts_skippable"] += bool(r.entries()) and not r.drafts_needed
        # Budget (5), a drafter's input slots included, and concurrency (6).
        sc = self.rust.scheduler_config
        inputs = r.total_num_scheduled_tokens + sc.num_draft_slots * len(r.num_scheduled)
        assert inputs <= sc.max_num_batched_tokens
        assert all(n >= 1 for n in r.num_scheduled.tolist())
        assert len(self.rust.debug_state()["running"]) <= self.rust.scheduler_config.max_num_seqs
        self.events["preempted"] += len(r.preempted_req_ids)
        self.events["hit"] += sum(
            1 for e in r.entries() if e.kind != "running" and e.num_computed_tokens
        )
        self.events["resumed"] += sum(1 for e in r.entries() if e.kind == "resumed")
        state = self.rust.debug_state()
        rows = state["requests"].values()
        self.events["sessions_waiting"] += state["num_waiting_for_input"]
        self.events["kv_holding_admitted"] += sum(
            1
            for e in r.entries()
            if e.kind == "new" and e.num_computed_tokens and e.request_id in self.sessions
        )
        self.events["placeholders"] += sum(1 for r in rows if r["num_output_placeholders"] > 0)
        self.events["spec_scheduled"] += int(r.num_spec_tokens.sum())
        spec_counts = r.num_spec_tokens.tolist()
        self.events["spec_padded"] += sum(
            1 for e, n in zip(r.entries(), spec_counts, strict=True) if n and e.kind != "running"
        )
        self.events["skipped"] += sum(1 for r in rows if r["deferred"])
        if sc.runner == "encoder_only" and not sc.enable_chunked_prefill:
            # vLLM chunks an encoder-only deployment's prompt to the budget
            # left regardless (a cut below the long-prefill threshold).
            threshold = sc.long_prefill_token_threshold or sc.max_model_len
            requests = state["requests"]
            self.events["encoder_only_chunked"] += sum(
                1
                for e in r.entries()
                if e.num_computed_tokens + e.num_tokens < requests[e.request_id]["num_tokens"]
                and e.num_tokens < threshold
            )
        self.events["lora_capped"] += self.lora_capped()
        if self.config.get("kv_cache_groups") == ():
            # No KV cache: rows with no block and no slot (§7.14).
            assert r.new_block_ids.size == 0 and r.slot_mapping.size == 0
            self.events["no_kv_cache_rows"] += len(r.req_ids)
        self.compare_encoder(r, p)
        self.in_flight.append((r, p))
        self.check()
        self.count_groups(before, r)
        retained = max(self.config.get("drafter_read_ahead", 0) - 1, 0)
        check_windows_after_step(self.groups, state, r.req_ids, self.bs, retained)

    def compare_encoder(self, r: Any, p: Any) -> None:
        """The same encoder inputs, evictions and mismatches; the twin's
        encoder cache within its size and its counts consistent."""
        assert r.scheduled_encoder_inputs == p.scheduled_encoder_inputs
        assert r.free_encoder_mm_hashes == p.free_encoder_mm_hashes
        assert r.encoder_mismatch_req_ids == p.encoder_mismatch_req_ids
        self._encoder_mismatches = r.encoder_mismatch_req_ids
        self.events["encoder_inputs"] += sum(map(len, r.scheduled_encoder_inputs.values()))
        cross = self.cores[1].encoder_decoder_cache
        if cross is not None:
            # An encoder-decoder's slot count and pending frees, the same.
            allocated, to_free = cross.pending()
            twin = {"num_free_slots": cross.num_free(), "allocated": allocated, "to_free": to_free}
            assert _core.vllm_encoder_cache_state(self.cores[0].core) == twin
            self.events["cross_inputs"] += sum(map(len, r.scheduled_encoder_inputs.values()))
            self.events["cross_resumed"] += sum(
                1
                for e in r.entries()
                if e.kind == "resumed" and e.request_id in r.scheduled_encoder_inputs
            )
            return
        problem = self.cores[1].encoder_cache.check_invariants()
        assert problem is None, problem
        self.events["encoder_evicted"] += len(r.free_encoder_mm_hashes)
        self.events["encoder_mismatch"] += len(r.encoder_mismatch_req_ids)
        # A request with images that got less than it was behind by, its
        # cut before an image (budget, cache, unchunked).
        twin = self.cores[1]
        for e in r.entries():
            slot = twin.slot_of(e.request_id)
            if slot is None:
                continue
            t = twin.requests[slot]
            if t.mm_inputs and any(
                m.offset == e.num_computed_tokens + e.num_tokens for m in t.mm_inputs
            ):
                self.events["encoder_cut"] += 1

    def encoder_mismatches(self) -> list[str]:
        """The requests the last schedule() found reusing an image id."""
        found, self._encoder_mismatches = self._encoder_mismatches, []
        return found

    def lora_capped(self) -> int:
        """Waiting requests skipped for an adapter past ``max_loras`` (the
        running batch holds that many others) after a step, and the cap
        held (docs/scheduling.md §4.14)."""
        twin = self.cores[1]
        max_loras = twin.config.max_loras
        if max_loras is None:
            return 0
        running = {twin.requests[s].lora_id for s in twin.running} - {None}
        assert len(running) <= max_loras, running
        if len(running) < max_loras:
            return 0
        return sum(
            1
            for r in map(twin.requests.__getitem__, twin.ids.values())
            if r.deferred and r.lora_id is not None and r.lora_id not in running
        )

    def count_groups(self, before: dict[str, Any], out: Any) -> None:
        """Events of hybrid caches: window blocks given back, admissions
        with prefix hits, hits a window group adopted with null padding,
        lookups that found a shared prefix a window group lacked."""
        if not self.hybrid:
            return
        after = self.last_state["requests"]
        for rid, row in after.items():
            old = before["requests"].get(rid)
            if old is None or not old["tables"][0] or not row["tables"][0]:
                continue
            for t0, t1 in zip(old["tables"], row["tables"], strict=True):
                self.events["window_freed"] += sum(
                    1 for a, b in zip(t0, t1, strict=False) if a != 0 and b == 0
                )
        for e in out.entries():
            if e.kind != "running" and e.num_computed_tokens and e.request_id in before["waiting"]:
                self.events["hybrid_hit"] += 1
                self.events["hybrid_hit_nulls"] += any(
                    0 in t for t in after[e.request_id]["tables"]
                )
        self.events["shared_boundary"] += sum(
            1
            for e in out.entries()
            if e.kind != "running" and after[e.request_id]["shared_prefix_boundary"]
        )

    def update_draft_token_ids(self, drafts: dict[str, list[int]]) -> None:
        self.rust.update_draft_token_ids(drafts)
        self.twin.update_draft_token_ids(drafts)
        self.check()

    def apply_oldest(
        self,
        choose: Any,
        reject: int | None = None,
        accepted: Any = None,
        kv_connector_output: Any = None,
        errors: list[str] | None = None,
        end_order: Any = None,
    ) -> None:
        """Apply the oldest output in flight; ``choose(rid)`` gives the token
        for a request whose step sampled (None: it produced none). A
        structured-output request's grammar rejects the token ``reject``.
        ``accepted(rid, drafts)`` says how many of a request's scheduled
        drafts the verification accepted (default: none); it then gets that
        many tokens and one more. ``kv_connector_output``: the worker's
        report of the step's KV transfers. ``errors``: requests to end with
        an error after the output (with failed loads), in ``end_order``'s
        order."""
        r, p = self.in_flight.pop(0)
        ends = {"errors": errors or [], "end_order": end_order}
        if self.config.get("runner") == "pooling":
            # The runner pools each prompt whose step reached its end.
            pooled = [rid for i, rid in enumerate(r.req_ids) if r.samples[i]]
            ru = self.rust.update_from_pooler_output(r, pooled, **ends)
            pu = self.twin.update_from_pooler_output(p, pooled, **ends)
            assert ru.errored == pu.errored
            self.events["errors_ended"] += len(ru.errored)
            assert [tuple(u) for u in ru] == [tuple(u) for u in pu]
            assert ru.cached_tokens.tolist() == pu.cached_tokens.tolist()
            self.events["pooled"] += len(ru.finished_req_ids)
            self.check()
            return
        sampled: dict[str, list[int]] = {}
        # An encoder-only deployment samples nothing; a consumed prompt ends.
        encoder_only = self.config.get("runner") == "encoder_only"
        num_spec = r.num_spec_tokens.tolist()
        spec_ids = r.spec_token_ids.tolist()
        start = 0
        for i, rid in enumerate(r.req_ids):
            drafts = spec_ids[start : start + num_spec[i]]
            start += num_spec[i]
            if r.samples[i] and not encoder_only:
                t = choose(rid)
                if t is not None:
                    a = accepted(rid, drafts) if accepted is not None and drafts else 0
                    sampled[rid] = [choose(rid) for _ in range(a)] + [t]
                    self.events["spec_accepted"] += a
                    self.events["spec_rejected"] += len(drafts) - a
        asked: dict[str, list[tuple[str, list[int]]]] = {"rust": [], "twin": []}

        def accept(side: str) -> Any:
            def judge(rid: str, kept: list[int]) -> bool:
                asked[side].append((rid, kept))
                return reject not in kept

            return judge

        kv = kv_connector_output
        if kv is not None and (kv.failed_recving or kv.invalid_block_ids):
            # A failure may cut back a loading request too.
            live = self.rust.debug_state()["requests"]
            self.kv_cut.update(
                rid for rid, r in live.items() if r["status"] == "WAITING_FOR_REMOTE_KVS"
            )
        ru = self.rust.update_from_output(
            r, sampled, accept=accept("rust"), kv_connector_output=kv, **ends
        )
        pu = self.twin.update_from_output(
            p, sampled, accept=accept("twin"), kv_connector_output=kv, **ends
        )
        assert asked["rust"] == asked["twin"]
        assert ru.errored == pu.errored
        if kv is not None and (kv.failed_recving or kv.invalid_block_ids):
            self.kv_cut.update(r.req_ids)
        named = set(ends["errors"])
        self.events["errors_ended"] += sum(1 for rid in ru.errored if rid in named)
        self.events["failed_loads_ended"] += sum(1 for rid in ru.errored if rid not in named)
        ur, up = [tuple(u) for u in ru], [tuple(u) for u in pu]
        assert ur == up, (ur, up)
        assert stats_fields(ru.spec_decoding_stats) == stats_fields(pu.spec_decoding_stats)
        self.events["grammar_rejected"] += sum(1 for _, kept in asked["rust"] if reject in kept)
        assert ru.cached_tokens.tolist() == pu.cached_tokens.tolist()
        self.events["finished"] += sum(1 for u in ur if u[2] is not None)
        self.events["encoder_only_finished"] += len(ru.finished_req_ids) if encoder_only else 0
        self.events["session_turns"] += sum(1 for u in ru if u.session_continues)
        self.events["repetition"] += sum(1 for u in ur if u[2] == "repetition")
        self.check()

    def check(self) -> None:
        ea, eb = (kv_events(core) for core in self.cores)
        assert ea == eb
        for kind, *_ in ea:
            self.events[f"kv_{kind}"] += 1
        a, b = self.rust.debug_state(), self.twin.debug_state()
        # The backends hash alike but not to the same values: retained
        # blocks are compared by when each side first retained them.
        for state, names in zip((a, b), self._aux_names, strict=True):
            name_aux_hashes(state, names)
        assert a == b
        self.last_state = a
        # A cut-back request's placeholder resolves with its next output.
        self.kv_cut = {rid for rid in self.kv_cut if rid in a["requests"]}
        # ``block_ids`` is group 0's table, in blocks of that group's size.
        bs0 = self.groups[0].tokens_per_block(self.bs) if self.groups else self.bs
        check_scheduler_invariants(
            self.rust, a, bs0, kv_cut=self.kv_cut, connector=self.with_connector
        )
        aligned = bool(self.rust.cache_config.enable_prefix_caching)
        retained = max(self.config.get("drafter_read_ahead", 0) - 1, 0)
        check_group_invariants(
            self.groups, a, self.bs, retained, caches_states=aligned, kv_cut=self.kv_cut
        )
        assert self.rust.num_free_blocks == self.twin.num_free_blocks
        assert self.rust.get_num_unfinished_requests() == len(a["requests"])


SPEC_STATS = (
    "num_spec_tokens",
    "num_drafts",
    "num_draft_tokens",
    "num_accepted_tokens",
    "num_accepted_tokens_per_pos",
    "num_draft_tokens_per_pos",
)


def name_aux_hashes(state: dict[str, Any], names: dict[int, int]) -> None:
    """Replace the block hashes of a state's auxiliary-output retention
    (``aux_retained`` in order, then ``aux_loading`` by slot) by the order
    in which this backend first retained each."""
    if "aux_retained" not in state:
        return

    def name(h: int) -> int:
        return names.setdefault(h, len(names))

    state["aux_retained"] = [name(h) for h in state["aux_retained"]]
    loading = state["aux_loading"]
    state["aux_loading"] = {slot: [name(h) for h in loading[slot]] for slot in sorted(loading)}


def stats_fields(stats: Any) -> tuple[Any, ...] | None:
    return (
        None
        if stats is None
        else tuple(list(getattr(stats, f)) if "pos" in f else getattr(stats, f) for f in SPEC_STATS)
    )


def check_scheduler_invariants(
    s: Scheduler,
    state: dict[str, Any],
    bs: int,
    kv_cut: Set[str] = frozenset(),
    connector: bool = False,
) -> None:
    requests = state["requests"]
    speculating = s.scheduler_config.num_speculative_tokens > 0
    # Without a KV cache (§7.14) a table is always empty: no block to hold.
    holds_blocks = s.cache_config.kv_cache_groups != ()
    running, waiting, kv_holding = state["running"], state["waiting"], state["kv_holding"]
    ref = state["block_ref_cnts"]
    n = len(ref)
    # 8. Queues: every unfinished request in exactly one queue, with a matching status;
    # those holding KV blocks wait apart (streaming sessions between turns).
    assert sorted(running + waiting + kv_holding) == sorted(requests)
    assert all(requests[r]["status"] == "RUNNING" for r in running)
    waiting_statuses = ("WAITING", "PREEMPTED", "WAITING_FOR_STREAMING_REQ")
    loading = [r for r in kv_holding if requests[r]["status"] == "WAITING_FOR_REMOTE_KVS"]
    assert all(requests[r]["status"] in waiting_statuses for r in waiting)
    assert all(requests[r]["status"] in waiting_statuses for r in kv_holding if r not in loading)
    assert all(requests[r]["num_computed_tokens"] == 0 for r in waiting)
    # (With a KV connector, a request that leaves its load with 0 computed
    # tokens stays in that queue until admitted, as in vLLM: a load that
    # failed whole, or a full load of a one-token prompt.)
    assert connector or all(requests[r]["num_computed_tokens"] > 0 for r in kv_holding)
    paused = [r for r in requests.values() if r["status"] == "WAITING_FOR_STREAMING_REQ"]
    assert state["num_waiting_for_input"] == len(paused)
    assert all(r["deferred"] for r in paused)
    # 1, 2. Conservation and reference counts, over every KV-cache group's
    # table (the null block, a window group's past, is nobody's).
    held = Counter(b for r in requests.values() for t in r["tables"] for b in t if b != 0)
    # Finished requests whose blocks a KV connector keeps (§4.19).
    held.update(b for tables in state["kv_held"].values() for t in tables for b in t if b != 0)
    # Freed requests' blocks fenced by a step in flight, each set once.
    held.update(b for _, blocks in state["deferred_frees"] for b in blocks)
    # Blocks pinned from outside any request (a connector's copies).
    held.update({b: n for b, n in state["pinned_blocks"]})
    assert [held.get(b, 0) for b in range(n)] == ref
    free = state["free_block_ids"]
    assert sorted(free) == [b for b in range(1, n) if ref[b] == 0]
    assert s.num_free_blocks == len(free)
    # 7. Table size; waiting requests hold nothing.
    for rid, r in requests.items():
        status, num_tokens, computed = r["status"], r["num_tokens"], r["num_computed_tokens"]
        table, cached = r["block_ids"], r["num_cached_blocks"]
        placeholders, in_flight = r["num_output_placeholders"], r["in_flight_tokens"]
        stale, drop_stale, deferred = r["stale_tokens"], r["drop_stale"], r["deferred"]
        # Drafts in flight count as computed until their output rolls the
        # rejected ones back.
        assert computed <= num_tokens + placeholders + (in_flight if speculating else 0)
        assert cached <= len(table)
        # A placeholder stands for a token sampled by a step still in flight.
        # (Not after a failed KV load dropped its output: vLLM leaves the
        # placeholder of the dropped token until the request's next output.)
        assert placeholders <= in_flight or rid in kv_cut
        assert stale <= in_flight
        if status == "RUNNING":
            assert len(table) >= cdiv(computed, bs) or not holds_blocks
            # Only a share that will be dropped lets a request resume early.
            assert not deferred and (stale == 0 or drop_stale)
        elif rid in kv_holding:
            # A session between turns keeps what it computed, nothing in flight counts.
            assert len(table) >= cdiv(computed, bs) or not holds_blocks, rid
            assert placeholders == 0, rid
        elif num_tokens == 1 and r["inflight_prefill"]:
            # A one-token prompt loaded whole by a KV connector gives its
            # token back (§4.19): 0 computed, so it waits among those that
            # hold nothing, its block kept (vLLM's queues alike).
            assert len(table) <= 1 and computed == 0 and placeholders == 0, rid
        else:
            assert table == [] and computed == 0 and placeholders == 0, rid
        # Only a released grammar lets a request run; a held one counts as skipped.
        if r["grammar"] not in (None, "ACTIVE"):
            assert status == "WAITING" and deferred, rid
    # 9. Return of blocks.
    idle = not state["kv_held"] and not state["deferred_frees"] and not state["pinned_blocks"]
    if not requests and idle:
        assert len(free) == n - 1


def null_prefix(table: list[int]) -> int:
    """How many leading positions of a table hold the null block."""
    n = 0
    while n < len(table) and table[n] == 0:
        n += 1
    return n


def check_group_invariants(
    groups: tuple[GroupSpec, ...],
    state: dict[str, Any],
    bs: int,
    retained: int,
    caches_states: bool = False,
    kv_cut: Set[str] = frozenset(),
) -> None:
    """Hybrid KV caches: every decoder group's table of a request is as long
    as the others of the cache's block size, and one of another block size
    (a mixed-precision hybrid's) covers as many tokens, to within a block (a
    recurrent group's, of its own, holds its scratch states past its tokens'
    blocks and nulls before its last processed token's); group 0's is the
    one ``block_ids`` reports; full and cross-attention hold no null
    position, and cross-attention tables (the encoder's tokens) exist only
    beside a decoder table; a window group's
    nulls are a prefix, and only of positions no token after the computed
    ones reads, nor of the ``retained`` last computed ones under a sliding
    window (multi-module MTP's, vLLM's ``extra_retained_tokens``). A
    recurrent group caching its states (``caches_states``: cache mode
    "align") holds nulls between them, its scratch states last."""
    for rid, r in state["requests"].items():
        tables, cached = r["tables"], r["num_cached_per_group"]
        assert len(tables) == len(groups) == len(cached), rid
        if not groups:  # no KV cache (§7.14): nothing held, nothing cached
            assert r["block_ids"] == [] and r["num_cached_blocks"] == 0, rid
            continue
        assert tables[0] == r["block_ids"] and cached[0] == r["num_cached_blocks"], rid
        decoder = [
            t
            for g, t in zip(groups, tables, strict=True)
            if not g.kind.is_cross()
            and g.tokens_per_block(bs) == bs
            and not g.kind.extra_blocks()
            # (an "align" state table covers no lookahead slots)
            and not (caches_states and g.kind.is_recurrent())
        ]
        assert all(len(t) == len(decoder[0]) for t in decoder), rid
        sized = [
            (g, t)
            for g, t in zip(groups, tables, strict=True)
            if g.block_size is not None and not g.kind.is_cross()  # (the encoder's tokens)
        ]
        covered = [len(t) * g.block_size for g, t in sized] + [len(t) * bs for t in decoder]
        widest = max([bs] + [g.block_size for g, _ in sized])
        assert max(covered, default=0) - min(covered, default=0) < widest, (rid, covered)
        assert all(c <= len(t) for c, t in zip(cached, tables, strict=True)), rid
        for g, table, num_cached in zip(groups, tables, cached, strict=True):
            nulls = null_prefix(table)
            if caches_states and isinstance(g.kind, Mamba):
                # States at chunk ends, nulls between (what lies before the
                # processed tokens' state is checked after each step), and
                # the scratch states past the last.
                assert not table or len(table) > g.kind.speculative_blocks, (rid, g, table)
                assert all(b != 0 for b in table[len(table) - g.kind.speculative_blocks :])
                continue
            assert 0 not in table[nulls:], (rid, table)
            if g.kind.is_full() or g.kind.is_cross():
                assert nulls == 0, (rid, table)
            if g.kind.is_cross():
                assert tables[0] or not table, (rid, table)
                assert num_cached == 0, rid  # never prefix cached
            # A chunk that is not a whole number of blocks lets vLLM's hit
            # pad a block more than the chunk skips (the core does too).
            exact = isinstance(g.kind, SlidingWindow | Mamba) or (
                isinstance(g.kind, ChunkedLocal) and g.kind.chunk % g.tokens_per_block(bs) == 0
            )
            # (A load that failed in part cuts a request's computed tokens
            # back below a window's nulls, in vLLM too: ``kv_cut``.)
            if exact and rid not in kv_cut:
                group_bs = g.tokens_per_block(bs)
                read = r["num_computed_tokens"]
                if r["status"] == "WAITING_FOR_REMOTE_KVS":
                    # A load's tokens count once it is reported; its table
                    # already leaves out what a window skips past them.
                    read = len(table) * group_bs
                if isinstance(g.kind, SlidingWindow):
                    read = max(read - retained, 0)
                skipped = g.kind.num_skipped_tokens(read) // group_bs
                # A hit's nulls stand before the run a window reads; the
                # tokens it retains for the drafter are nulls there too.
                if isinstance(g.kind, SlidingWindow) and retained:
                    skipped += -(-retained // group_bs)
                assert nulls <= skipped, (rid, g, table, r["num_computed_tokens"])
            if isinstance(g.kind, Mamba) and table:
                # Its scratch states come with its first blocks.
                assert len(table) > g.kind.speculative_blocks, (rid, g, table)


def check_windows_after_step(
    groups: tuple[GroupSpec, ...],
    state: dict[str, Any],
    scheduled: list[str],
    bs: int,
    retained: int,
) -> None:
    """Right after a step, each request it scheduled that still runs holds
    no block wholly before its windows as of the tokens it has processed
    (computed and not in flight), less the ``retained`` last ones a sliding
    window keeps for multi-module MTP: those went back when it allocated."""
    for rid in scheduled:
        r = state["requests"].get(rid)
        if r is None or r["status"] != "RUNNING":
            continue  # preempted later in the step
        processed = max(r["num_computed_tokens"] - r["in_flight_tokens"], 0)
        for g, table in zip(groups, r["tables"], strict=True):
            group_bs = g.tokens_per_block(bs)
            read = processed - retained if isinstance(g.kind, SlidingWindow) else processed
            skipped = min(g.kind.num_skipped_tokens(max(read, 0)) // group_bs, len(table))
            assert all(b == 0 for b in table[:skipped]), (rid, g, table, processed)
