"""A KV connector's side of the scheduler (docs/scheduling.md §4.19) on both
backends: the API, the worked example, and the core against the twin over
random workloads with the stand-in connector (ironbatch/bench/standin_connector.py),
whose call logs, metadata and worker reports must match step for step.
Loads that fail, whole or by block, under both failure policies."""

from __future__ import annotations

import dataclasses
import random
import sys
from collections import Counter
from typing import Any

import pytest
from test_scheduler_differential import AUX_DRAW, image_pool, place_images, random_groups

from ironbatch import KVCacheGroup
from ironbatch.bench.standin_connector import (
    CoreStandIn,
    StandInConnector,
    StandInShares,
    StandInWorker,
)

from scheduler_helpers import BACKENDS, make, req, rows, step
from scheduler_pair import SchedulerPair
from seeded import Workloads

VOCAB = 40
EOS = 2
WORKLOADS = 200  # per run; FULL_WORKLOADS with IRONBATCH_FULL=1
FULL_WORKLOADS = 800


class Scripted:
    """Fixed answers by request id, every call logged."""

    def __init__(self, answers: dict[str, Any], holds: tuple[str, ...] = ()) -> None:
        self.answers = answers
        self.holds = holds
        self.log: list[tuple[Any, ...]] = []

    def get_num_new_matched_tokens(self, rid: str, n: int, local: int) -> Any:
        self.log.append(("matched", rid, n, local))
        return self.answers.get(rid, (0, False))

    def update_state_after_alloc(self, rid: str, block_ids: list[list[int]], ext: int) -> None:
        self.log.append(("after_alloc", rid, block_ids, ext))

    def request_finished(self, rid: str, block_ids: list[list[int]], status: str) -> bool:
        self.log.append(("finished", rid, block_ids, status))
        return rid in self.holds

    def local_hit_reconciled(self, rid: str, local: int) -> None:
        self.log.append(("reconciled", rid, local))


class Report:
    """A worker's report, as vLLM's ``KVConnectorOutput`` carries it."""

    def __init__(self, **fields: Any) -> None:
        self.finished_recving = fields.pop("finished_recving", None)
        self.finished_sending = fields.pop("finished_sending", None)
        self.failed_recving = fields.pop("failed_recving", None)
        self.invalid_block_ids = fields.pop("invalid_block_ids", None)
        assert not fields, fields


def scheduler(backend: str, connector: Any, policy: str = "fail", **kw: Any) -> Any:
    s = make(
        backend,
        num_blocks=kw.pop("num_blocks", 20),
        block_size=4,
        max_model_len=64,
        max_num_seqs=8,
        max_num_batched_tokens=64,
        **kw,
    )
    s.set_kv_connector(connector, policy)
    return s


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_worked_example_without_its_failed_block(backend: str) -> None:
    """§4.19's decode instance: a 14-token prompt loaded over two steps is
    scheduled from its last token once the load is reported."""
    c = Scripted({"r": (14, True)})
    s = scheduler(backend, c)
    s.add_request(req("r", range(100, 114), max_tokens=4))
    out = s.schedule()
    assert out.num_scheduled_tokens == {}
    assert s.debug_state()["kv_holding"] == ["r"]
    assert s.debug_state()["requests"]["r"]["status"] == "WAITING_FOR_REMOTE_KVS"
    s.update_from_output(out, {})
    out = s.schedule()
    assert out.num_scheduled_tokens == {}
    s.update_from_output(out, {}, kv_connector_output=Report(finished_recving={"r"}))
    out = s.schedule()
    assert out.num_scheduled_tokens == {"r": 1}
    assert c.log == [
        ("matched", "r", 14, 0),
        ("after_alloc", "r", [[1, 2, 3, 4]], 14),
        ("after_alloc", "r", [[1, 2, 3, 4]], 0),
    ]


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_embedding_model_loads_then_pools_and_a_failed_load_recomputes(backend: str) -> None:
    """A pooling runner behind a connector (vLLM schedules its prompts as
    any): "a" loads 12 of its 14 tokens, then its last 2 are scheduled and
    pooled; "b"'s load fails in its first block under "recompute", so it
    computes its whole prompt itself and pools then. The pooled update takes
    the report as a generating update does."""
    c = Scripted({"a": (12, True), "b": (8, True)})
    s = scheduler(backend, c, "recompute", runner="pooling")
    s.add_request(req("a", range(100, 114), max_tokens=1))
    out = s.schedule()
    assert out.num_scheduled_tokens == {}
    # Bad reports and orders are refused as update_from_output refuses them.
    before = s.debug_state()
    with pytest.raises(TypeError, match="end_order must be callable, got int"):
        s.update_from_pooler_output(out, [], end_order=5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="ghost"):
        s.update_from_pooler_output(out, [], kv_connector_output=Report(finished_sending={"ghost"}))
    assert s.debug_state() == before
    s.update_from_pooler_output(out, [], kv_connector_output=Report(finished_recving={"a"}))
    out = s.schedule()
    assert out.num_scheduled_tokens == {"a": 2}
    s.add_request(req("b", range(200, 210), max_tokens=1))
    assert s.update_from_pooler_output(out, ["a"]).finished_req_ids == ["a"]
    out = s.schedule()
    assert out.num_scheduled_tokens == {}  # b loads
    b_blocks = s.debug_state()["requests"]["b"]["tables"][0]
    failed = Report(finished_recving={"b"}, invalid_block_ids={b_blocks[0]})
    s.update_from_pooler_output(out, [], kv_connector_output=failed)
    c.answers["b"] = (0, False)  # asked again: nothing to load now
    out = s.schedule()
    assert out.num_scheduled_tokens == {"b": 10}
    assert s.update_from_pooler_output(out, ["b"]).finished_req_ids == ["b"]
    assert not s.has_unfinished_requests() and s.num_free_blocks == 19


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_held_request_frees_its_blocks_when_its_send_is_reported(backend: str) -> None:
    c = Scripted({}, holds=("r",))
    s = scheduler(backend, c)
    s.add_request(req("r", range(100, 110), max_tokens=1))
    out = s.schedule()
    assert s.update_from_output(out, {"r": [7]}).finished_req_ids == ["r"]
    assert s.num_free_blocks == 19 - 3
    assert not s.has_unfinished_requests()
    assert s.debug_state()["kv_held"] == {"r": [[1, 2, 3]]}
    with pytest.raises(ValueError, match="is already"):
        s.add_request(req("r", [1, 2]))
    out = s.schedule()
    s.update_from_output(out, {}, kv_connector_output=Report(finished_sending={"r"}))
    assert s.num_free_blocks == 19 and s.debug_state()["kv_held"] == {}


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_lost_block_is_claimed_anew_by_the_running_walk(backend: str) -> None:
    """vLLM walks the loading requests and the running ones separately,
    each walk claiming the lost blocks afresh: ``r1`` (running, its first
    8 tokens loaded in the step) and ``r2`` (loading, hitting ``r1``'s
    blocks) both hold lost block 1, and each is cut back to 0; the running
    one then recomputes its whole prompt, not just the step's tokens."""
    c = Scripted({"r1": (8, False), "r2": (3, True)})
    s = scheduler(backend, c, policy="recompute")
    s.add_request(req("r1", range(100, 112), max_tokens=4))
    s.add_request(req("r2", [*range(100, 112), 7, 8, 9, 10], max_tokens=4))
    out = s.schedule()
    assert rows(out) == [["r1", 4, "new", 8, [1, 2, 3]]]
    assert s.debug_state()["requests"]["r2"]["status"] == "WAITING_FOR_REMOTE_KVS"
    s.update_from_output(out, {"r1": [5]}, kv_connector_output=Report(invalid_block_ids={1}))
    assert rows(s.schedule()) == [["r1", 12, "running", 0, []]]


def _loads_failing(backend: str, end_order: Any) -> tuple[Any, list[str], Scripted]:
    """Three requests loading over steps whose loads all fail whole in one
    report ("fail" policy): the scheduler, the requests ended in the order
    ended, and the connector's log."""
    c = Scripted({rid: (8, True) for rid in ("a", "b", "c")})
    s = scheduler(backend, c)
    for rid in ("a", "b", "c"):
        s.add_request(req(rid, range(100, 110), max_tokens=2))
    out = s.schedule()
    failed = Report(finished_recving=["a", "b", "c"], failed_recving=["a", "b", "c"])
    updates = s.update_from_output(out, {}, kv_connector_output=failed, end_order=end_order)
    return s, updates.errored, c


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_caller_orders_the_requests_a_failed_load_ends(backend: str) -> None:
    """``end_order`` gets each search's ids and its answer is the order the
    requests end in (their blocks freed, the connector told), as a trace
    recorded it; without it, the report's order."""
    seen: list[tuple[list[str], ...]] = []

    def reverse(*groups: list[str]) -> list[str]:
        seen.append(groups)
        return ["c", "b", "a"]

    _, ended, c = _loads_failing(backend, None)
    assert ended == ["a", "b", "c"]
    s, ended, c = _loads_failing(backend, reverse)
    assert ended == ["c", "b", "a"]
    assert seen == [(["a", "b", "c"], [], [], [])]
    assert [call[1] for call in c.log if call[0] == "finished"] == ["c", "b", "a"]
    assert s.get_num_unfinished_requests() == 0 and s.num_free_blocks == 19


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("ordered", [False, True])
def test_the_callers_errors_end_with_the_failed_loads_in_one_order(
    backend: str, ordered: bool
) -> None:
    """``errors`` end after the output with the failed loads, before the
    loads settle, in ``end_order``'s one order (vLLM's: one set's): "d"
    runs and is named, "e" is named but stops in this very step, "zz" is
    unknown; the last two are skipped, as vLLM's ``finish_requests`` skips
    them. Without ``end_order``: as found, failed loads first."""
    seen: list[tuple[list[str], ...]] = []

    def end_order(*sources: list[str]) -> list[str]:
        seen.append(sources)
        return ["d", "c", "b", "a"]

    c = Scripted({rid: (8, True) for rid in ("a", "b", "c")})
    s = scheduler(backend, c)
    for rid in ("a", "b", "c"):
        s.add_request(req(rid, range(100, 110), max_tokens=2))
    s.add_request(req("d", range(200, 204), max_tokens=4))
    s.add_request(req("e", range(300, 304), max_tokens=1))
    out = s.schedule()
    assert sorted(out.req_ids) == ["d", "e"]
    failed = Report(finished_recving=["a", "b", "c"], failed_recving=["a", "b", "c"])
    updates = s.update_from_output(
        out,
        {"d": [5], "e": [5]},
        kv_connector_output=failed,
        errors=["zz", "e", "d", "d"],
        end_order=end_order if ordered else None,
    )
    want = ["d", "c", "b", "a"] if ordered else ["a", "b", "c", "d"]
    assert updates.errored == want
    assert seen == ([(["a", "b", "c"], [], [], ["d"])] if ordered else [])
    assert [call[1] for call in c.log if call[0] == "finished"] == ["e", *want]
    # "d" got its token first, then its error (no row of its own).
    assert {u.request_id: u.finish_reason for u in updates} == {"d": None, "e": "length"}
    assert s.get_num_unfinished_requests() == 0 and s.num_free_blocks == 19


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("errors", "message"),
    [
        ("d", "errors must be an iterable of request ids, got str"),
        (["d", 3], "errors must hold request ids \\(str\\), got int"),
        (5, "errors must be an iterable of request ids, got int"),
    ],
    ids=["a str", "not a str", "not iterable"],
)
def test_bad_errors_are_refused_and_nothing_changes(
    backend: str, errors: Any, message: str
) -> None:
    s = scheduler(backend, Scripted({}))
    s.add_request(req("d", range(200, 204), max_tokens=4))
    out = s.schedule()
    with pytest.raises(TypeError, match=message):
        s.update_from_output(out, {"d": [5]}, errors=errors)
    updates = s.update_from_output(out, {"d": [5]})
    assert [u.request_id for u in updates] == ["d"] and updates.errored == []


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("end_order", "reports"),
    [
        (lambda *groups: ["a", "b"], 0),  # not all of them: ignored
        (lambda *groups: ["a", "b", "x"], 1),  # one that did not fail
        (lambda *groups: 1 / 0, 1),
    ],
    ids=["too few", "another id", "raises"],
)
def test_a_bad_end_order_is_reported_and_the_report_order_stands(
    backend: str, end_order: Any, reports: int
) -> None:
    reported: list[Any] = []
    hook = sys.unraisablehook
    sys.unraisablehook = reported.append
    try:
        s, ended, _ = _loads_failing(backend, end_order)
    finally:
        sys.unraisablehook = hook
    assert ended == ["a", "b", "c"]
    assert len(reported) == reports
    assert s.get_num_unfinished_requests() == 0 and s.num_free_blocks == 19
    with pytest.raises(TypeError, match="end_order must be callable"):
        s.update_from_output(s.schedule(), {}, end_order=["a"])


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_transfer_reports_and_setups_are_refused_unchanged(backend: str) -> None:
    s = scheduler(backend, Scripted({}))
    s.add_request(req("a", range(100, 110)))
    out = s.schedule()
    before = s.debug_state()
    bad = [
        (
            ValueError,
            'finished_recving: request "nobody" is not a live',
            Report(finished_recving={"nobody"}),
        ),
        (
            ValueError,
            'finished_recving: request "a" is not loading',
            Report(finished_recving={"a"}),
        ),
        (
            ValueError,
            'finished_sending: request "a" has not finished',
            Report(finished_sending={"a"}),
        ),
        (TypeError, "finished_sending must hold str", Report(finished_sending={1})),
        (
            TypeError,
            "failed_recving must be a collection of request ids",
            Report(failed_recving="a"),
        ),
        (ValueError, "block 20 is not in the pool of 20 blocks", Report(invalid_block_ids={20})),
        (ValueError, "invalid_block_ids: -1 is not a block id", Report(invalid_block_ids={-1})),
    ]
    for error, message, report in bad:
        with pytest.raises(error, match=message):
            s.update_from_output(out, {"a": [7]}, kv_connector_output=report)
        assert s.debug_state() == before
    # Refused whole: the step's output still applies, once.
    s.update_from_output(out, {"a": [7]}, kv_connector_output=Report(failed_recving={"a"}))
    assert s.debug_state()["requests"]["a"]["num_tokens"] == 11
    with pytest.raises(ValueError, match="kv_load_failure_policy must be 'fail' or 'recompute'"):
        make(backend, max_model_len=64).set_kv_connector(Scripted({}), "retry")
    for flag in ("defer_block_free", "requires_kv_delivery", "divergent_hybrid_hits"):
        fresh = make(backend, max_model_len=64)
        with pytest.raises(TypeError, match=f"{flag} must be a bool, got int"):
            fresh.set_kv_connector(Scripted({}), **{flag: 1})
        fresh.set_kv_connector(Scripted({}), **{flag: True})  # (nothing was attached)
    with pytest.raises(ValueError, match="kv_connector: it must be set before the first request"):
        s.set_kv_connector(Scripted({}))
    # A pooling model takes one (its prompts' blocks are saved and loaded
    # alike); a model without a KV cache does not.
    make(backend, max_model_len=64, runner="pooling").set_kv_connector(Scripted({}))
    no_kv = make(backend, max_model_len=64, runner="pooling", kv_cache_groups=(), caching=False)
    with pytest.raises(ValueError, match="kv_connector: kv_cache_groups must be attention"):
        no_kv.set_kv_connector(Scripted({}))
    # Window groups beside full attention are taken (a connector with
    # hybrid support keeps them), and recurrent states, cached or not;
    # cross-attention is not.
    windows = (KVCacheGroup("sliding_window", 8), KVCacheGroup("full"))
    make(backend, max_model_len=64, kv_cache_groups=windows).set_kv_connector(Scripted({}))
    recurrent = (KVCacheGroup("mamba", 16), KVCacheGroup("full"))
    for caching in (False, True):
        hybrid = make(backend, max_model_len=64, kv_cache_groups=recurrent, caching=caching)
        hybrid.set_kv_connector(Scripted({}))
    cross = (KVCacheGroup("full"), KVCacheGroup("cross_attention"))
    encoder_decoder = make(
        backend,
        max_model_len=64,
        kv_cache_groups=cross,
        caching=False,
        enable_chunked_prefill=False,
        encoder_compute_budget=64,
        encoder_cache_size=64,
    )
    with pytest.raises(ValueError, match="kv_cache_groups must be attention or recurrent-state"):
        encoder_decoder.set_kv_connector(Scripted({}))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_connector_that_raises_stalls_only_its_request(
    backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    reported: list[Any] = []
    monkeypatch.setattr("sys.unraisablehook", reported.append)

    class Raising(Scripted):
        def get_num_new_matched_tokens(self, rid: str, n: int, local: int) -> Any:
            if rid == "bad":
                raise RuntimeError("connector down")
            return super().get_num_new_matched_tokens(rid, n, local)

    s = scheduler(backend, Raising({"odd": (3, "yes")}))
    s.add_request(req("bad", range(100, 110)))
    s.add_request(req("odd", range(200, 210)))
    s.add_request(req("good", range(300, 310)))
    out = s.schedule()
    assert out.num_scheduled_tokens == {"good": 10}
    assert [type(r.exc_value) for r in reported] == [RuntimeError, TypeError]


def random_config(rng: random.Random) -> dict[str, Any]:
    bs = rng.choice([4, 8, 16])
    max_len = rng.choice([32, 64, 128])
    chunked = rng.random() < 0.8
    seqs = rng.choice([2, 4, 8])
    batched = max(rng.choice([16, 32, 64]), seqs)
    if not chunked:
        batched = max(batched, max_len)
    # Full attention beside windows or chunked local attention in some
    # (a connector with hybrid support: NIXL, offloading, Mooncake).
    groups = random_groups(rng, bs) if rng.random() < 0.4 else None
    # Groups of different block sizes in half of those with full attention
    # and windows alone (drawn apart): a mixed-precision hybrid's, whose
    # new blocks are zeroed but those an asynchronous load writes
    # (docs/scheduling.md §4.19, §7.16).
    sizes = random.Random(rng.random())
    mixed: dict[str, Any] = {}
    kinds = {g.kind for g in groups or ()}
    if kinds == {"full", "sliding_window"} and sizes.random() < 0.5:
        larger = [sizes.choice([None, 2 * bs, 4 * bs]) for _ in groups]
        larger[sizes.randrange(len(larger))] = None  # the cache's own block size stays
        groups = tuple(
            dataclasses.replace(g, block_size=size) for g, size in zip(groups, larger, strict=True)
        )
        mixed = {"mixed_precision": True}
    need = -(-max_len // bs) * (1 if groups is None else len(groups))
    need *= 4 if mixed else 1
    # Recurrent states (Mamba, linear attention) beside the attention
    # groups in some (drawn apart: Qwen3-Next, Jamba): in half cached
    # (prefix caching on: vLLM's cache mode "align", states of the block
    # size), else uncached, each a state block of the model's length or
    # shorter.
    recurrent = random.Random(rng.random())
    states: tuple[KVCacheGroup, ...] = ()
    cached_states = False
    if not mixed and recurrent.random() < 0.25:
        cached_states = recurrent.random() < 0.5
        size = bs if cached_states else recurrent.choice([max_len, max_len // 2, bs, 3])
        states = tuple(KVCacheGroup("mamba", size) for _ in range(recurrent.choice([1, 1, 2, 3])))
        hybrid = [*(groups or (KVCacheGroup("full"),)), *states]
        recurrent.shuffle(hybrid)
        groups = tuple(hybrid)
        need += len(states) * -(-max_len // size)
        chunked = chunked or cached_states  # (vLLM: states are cached at chunk ends)
    # A vision model's encoder in some (drawn apart): images beside
    # external hits.
    vision = random.Random(rng.random())
    encoder: dict[str, Any] = {}
    if vision.random() < 0.3:
        compute = vision.choice([8, 16, 40, 96])
        encoder = dict(
            encoder_compute_budget=compute,
            encoder_cache_size=vision.choice([compute, 2 * compute, 5 * compute]),
            # (Images never split only without a long-prefill cap, as vLLM.)
            disable_chunked_mm_input=False,
        )
    return dict(
        **encoder,
        **mixed,
        kv_cache_groups=groups,
        block_size=bs,
        num_blocks=rng.randint(2 * need + 2, 3 * need) if rng.random() < 0.4 else 8 * need,
        max_model_len=max_len,
        max_num_seqs=seqs,
        max_num_batched_tokens=batched,
        enable_chunked_prefill=chunked,
        long_prefill_token_threshold=rng.choice([0, 0, 8]),
        policy=rng.choice(["fcfs", "priority"]),
        caching=cached_states or (rng.random() < 0.8 and not states),
        async_scheduling=rng.random() < 0.5,
    )


class SortedReport:
    """A worker's report as vLLM's ``KVConnectorOutput`` reads, each set
    iterated sorted (both backends take its order as given)."""

    def __init__(self, report: Any) -> None:
        self.finished_recving = sorted(report.finished_recving)
        self.finished_sending = sorted(report.finished_sending)
        self.failed_recving = sorted(report.failed_recving)
        self.invalid_block_ids = sorted(report.invalid_block_ids)


def run_seed(seed: int) -> Counter:
    rng = random.Random(seed)
    config = random_config(rng)
    shares = StandInShares.draw(rng)
    policy = rng.choice(["fail", "recompute"])
    # A consumer role with two steps in flight fences its frees (vLLM's
    # defer_block_free); some connectors drop a preempted request's output.
    fenced = config["async_scheduling"] and rng.random() < 0.6
    delivery = rng.random() < 0.3
    # A connector that completes divergent hybrid hits (NIXL's) is told
    # full attention's own hit beside cached states (§4.19.2).
    divergent = random.Random(rng.random()).random() < 0.5
    pair = SchedulerPair(**config)
    events: Counter = Counter()
    stand_ins = [StandInConnector(seed, config["block_size"], shares) for _ in range(2)]
    workers = [StandInWorker(), StandInWorker()]
    for s, stand_in in zip((pair.rust, pair.twin), stand_ins, strict=True):
        s.set_kv_connector(
            CoreStandIn(stand_in),
            policy,
            defer_block_free=fenced,
            requires_kv_delivery=delivery,
            divergent_hybrid_hits=divergent,
        )
    pair.with_connector = True
    # A connector that pins blocks while it copies them out (SimpleCPU
    # offload's kind) in some, drawn apart: pins asked from inside the
    # scheduler's calls and between them (§4.19.3).
    if random.Random(seed ^ 0x9124).random() < 0.3:
        for s, stand_in in zip((pair.rust, pair.twin), stand_ins, strict=True):
            stand_in.pin_requests = s.pin_requests()
        events["pinning_connector"] += 1
    # Routed experts followed (auxiliary outputs, §7.12) in some, drawn
    # apart: external hits capped where the workers hold no routing.
    aux = config["caching"] and random.Random(seed ^ AUX_DRAW).random() < 0.3
    if aux:
        pair.follow_aux_outputs()
        events["aux_outputs"] += 1
    max_len = config["max_model_len"]
    prefixes = [[rng.randrange(3, VOCAB) for _ in range(max_len)] for _ in range(3)]
    depth = 2 if config["async_scheduling"] else rng.choice([1, 1, 2])
    metas: list[Any] = []
    pool = image_pool(rng, config) if "encoder_compute_budget" in config else []
    arrivals, added, step = rng.randint(6, 20), 0, 0
    # With routed experts, requests enough that the finished ones' blocks
    # pass what the workers retain (twice the cache's blocks).
    arrivals *= 4 if aux else 1

    def choose(_rid: str) -> int:
        return EOS if rng.random() < 0.1 else rng.randrange(3, VOCAB)

    def apply_oldest() -> None:
        nonlocal step
        step += 1
        meta = metas.pop(0)
        reports = [w.report(m, step) for w, m in zip(workers, meta, strict=True)]
        assert reports[0] == reports[1]
        report = SortedReport(reports[0])
        pair.apply_oldest(choose, kv_connector_output=report)

    for _ in range(3000):
        if added < arrivals and rng.random() < 0.5:
            n = rng.randint(1, max_len - 2)
            prompt = rng.choice(prefixes)[: rng.randint(0, n)]
            prompt += [rng.randrange(3, VOCAB) for _ in range(n - len(prompt))]
            images = place_images(rng, pool, prompt) if pool else []
            events["images"] += len(images)
            pair.add(
                f"r{added}",
                prompt,
                max_tokens=rng.randint(1, 8),
                priority=rng.randint(0, 2),
                images=images,
            )
            added += 1
        live = sorted(pair.rust.debug_state()["requests"])
        if live and rng.random() < 0.05:
            victim = rng.choice(live)
            status = pair.rust.debug_state()["requests"][victim]["status"]
            events["aborted_loading"] += status == "WAITING_FOR_REMOTE_KVS"
            pair.abort([victim])
        state = pair.rust.debug_state()
        busy = any(w.busy for w in workers) or state["kv_held"] or stand_ins[0].copying
        if added == arrivals and not state["requests"] and not busy:
            while pair.in_flight:
                apply_oldest()
            state = pair.rust.debug_state()
            idle = not state["kv_held"] and not any(w.busy for w in workers)
            if not state["requests"] and idle and not stand_ins[0].copying:
                break
        events["loading"] += sum(
            r["status"] == "WAITING_FOR_REMOTE_KVS" for r in state["requests"].values()
        )
        events["fenced_frees"] += len(state["deferred_frees"])
        pair.schedule()
        # The cached states offered to the connector (§4.19.2, rule 7).
        offered = pair.cores[0].take_boundary_states()
        twin_offered = pair.cores[1].take_boundary_states()
        twin_requests = pair.cores[1].requests
        assert offered == [
            (twin_requests[o.owner].request_id, o.group, o.block_id, o.num_tokens)
            for o in twin_offered
        ]
        events["boundary_states"] += len(offered)
        metas.append([x.build_connector_meta() for x in stand_ins])
        while len(pair.in_flight) >= depth:
            apply_oldest()
    else:
        raise AssertionError("no progress")
    assert stand_ins[0].log == stand_ins[1].log
    assert pair.rust.take_pin_errors() == pair.twin.take_pin_errors() == []
    final = pair.rust.debug_state()
    # Blocks fenced by the last step stay aside until a step with tokens
    # comes back (vLLM's too); all others are free.
    fenced_blocks = sum(len(blocks) for _, blocks in final["deferred_frees"])
    free = len(final["free_block_ids"])
    assert free + fenced_blocks == config["num_blocks"] - 1, "blocks leaked"
    events.update(stand_ins[0].events)
    events.update(workers[0].events)
    events["unknown"] += sum(1 for c in stand_ins[0].log if c[0] == "matched" and c[4][0] is None)
    events.update(pair.events)
    events["mixed_block_sizes"] += config.get("mixed_precision", False)
    states = any(g.kind == "mamba" for g in config["kv_cache_groups"] or ())
    events["recurrent_states"] += states
    events["recurrent_states_cached"] += states and config["caching"]
    events["divergent_hits_beside_cached_states"] += states and config["caching"] and divergent
    return events


def test_core_and_twin_agree_with_the_stand_in(workloads: Workloads) -> None:
    needs = {
        what: workloads.scaled(count, WORKLOADS, FULL_WORKLOADS)
        for what, count in {
            "async_loads": 600,
            "sync_loads": 400,
            "delayed_frees": 400,
            "unknown": 120,
            "loading": 600,
            "aborted_loading": 20,
            "preempted": 60,
            "failed_loads": 60,
            "invalid_blocks": 60,
            "failed_loads_ended": 30,
            "fenced_frees": 120,
            "images": 400,
            "mixed_block_sizes": 40,
            "recurrent_states": 40,
            "recurrent_states_cached": 20,
            "divergent_hits_beside_cached_states": 8,
            "boundary_states": 200,
            "aux_outputs": 10,
            "aux_external_capped": 10,
            "aux_released": 10,
            "pinning_connector": 40,
            "pinned_copies": 200,
        }.items()
    }
    events = workloads.run_covering(run_seed, needs, WORKLOADS, FULL_WORKLOADS)
    for what, n in needs.items():
        assert events[what] >= n, (what, events)


@pytest.mark.parametrize("backend", BACKENDS)
def test_blocks_an_async_load_writes_are_zeroed_only_once_it_fails(backend: str) -> None:
    """Where new blocks are zeroed (a mixed-precision KV cache), those an
    asynchronous load writes are not, which would race the load (vLLM's
    ``skip_zeroing_group_ids``, every group the connector loads); when the
    load fails in part and its request computes the rest itself, the blocks
    from the cut on are listed for zeroing then (vLLM's
    ``record_blocks_for_zeroing``). Here block 3 (tokens 8-12) did not
    arrive: 8 tokens stand, blocks 3 and 4 are zeroed and computed."""
    c = Scripted({"r": (14, True)})
    s = scheduler(backend, c, policy="recompute", mixed_precision=True)
    s.add_request(req("r", range(100, 114), max_tokens=4))
    out = s.schedule()
    assert out.num_scheduled_tokens == {} and out.new_block_ids_to_zero == []
    report = Report(finished_recving={"r"}, invalid_block_ids={3})
    s.update_from_output(out, {}, kv_connector_output=report)
    out = s.schedule()
    assert out.num_scheduled_tokens == {"r": 6}
    assert out.new_block_ids_to_zero == [3, 4]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("answer", [[True], [1.0], [-1], ["x"], None])
def test_bad_loaded_groups_are_reported_and_every_group_stands(backend: str, answer: Any) -> None:
    """A connector's loaded groups that are not ints >= 0 (a bool, a float,
    a negative, a string, not a list) are reported, and the safe answer,
    every group, stands: no block the load writes is zeroed."""

    class Answering(Scripted):
        def get_loaded_kv_cache_group_ids(self, rid: str) -> Any:
            return answer

    reported: list[Any] = []
    hook = sys.unraisablehook
    sys.unraisablehook = reported.append
    try:
        s = scheduler(backend, Answering({"r": (14, True)}), mixed_precision=True)
        s.add_request(req("r", range(100, 114), max_tokens=4))
        assert s.schedule().new_block_ids_to_zero == []
    finally:
        sys.unraisablehook = hook
    assert len(reported) == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_external_hit_beside_cached_states_waits_where_the_pool_runs_dry(backend: str) -> None:
    """Cached recurrent states (prefix caching on: vLLM's cache mode
    "align") take a block for an external hit that vLLM's count leaves out:
    with four blocks free, a 9-token prompt with 8 tokens loaded synchronously
    counts four (three of full attention, the state's growth) but takes five
    (the state's block for the hit too), where vLLM's pool runs dry
    mid-allocation and raises. The request waits instead, and is admitted
    once blocks come back (docs/scheduling.md §4.19.2, rule 7)."""
    groups = (KVCacheGroup("mamba", 4), KVCacheGroup("full"))
    s = make(
        backend,
        num_blocks=7,
        block_size=4,
        max_model_len=16,
        max_num_seqs=8,
        max_num_batched_tokens=64,
        kv_cache_groups=groups,
        caching=True,
        enable_chunked_prefill=True,
    )
    c = Scripted({"r": (8, False)})
    s.set_kv_connector(c, "fail")
    s.add_request(req("a", [7], max_tokens=3))
    step(s)
    s.add_request(req("r", list(range(100, 109))))
    out = s.schedule()
    assert out.num_scheduled_tokens == {"a": 1} and s.num_free_blocks == 4
    s.update_from_output(out, {"a": [9]})
    for _ in range(4):  # "a" ends at its third token, and "r" takes its blocks
        out, _ = step(s)
        if "r" in out.num_scheduled_tokens:
            break
    assert out.num_scheduled_tokens == {"r": 1}
    assert [call[1] for call in c.log if call[0] == "after_alloc"] == ["a", "r"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("divergent", "external", "told", "computed", "calls"),
    [
        # The hit every group agrees on: the state's, 12 tokens.
        (False, 0, 12, 12, ["matched", "after_alloc"]),
        (False, 2, 12, 14, ["matched", "after_alloc"]),
        # Full attention's own hit, 16 tokens; with no tokens to complete
        # the lagging state, the agreed hit is found again.
        (True, 0, 16, 12, ["matched", "reconciled", "after_alloc"]),
        (True, 2, 16, 18, ["matched", "after_alloc"]),
    ],
)
def test_a_connector_completing_divergent_hits_is_told_full_attentions_own_hit(
    backend: str, divergent: bool, external: int, told: int, computed: int, calls: list[str]
) -> None:
    """Beside cached recurrent states, full attention caches every block and
    a state only where a chunk ends: "a" (14 prompt tokens in chunks of 8,
    then 4 decoded) leaves full attention's blocks for 16 tokens and its
    last state at 12. A connector that completes divergent hybrid hits
    (NIXL's) is told 16 and, answering tokens, the request takes 16 of its
    own plus those; answering none, it takes the 12 every group agrees on
    (vLLM's ``get_computed_blocks_for_connector``, docs/scheduling.md
    §4.19.2, rule 8)."""
    groups = (KVCacheGroup("full"), KVCacheGroup("mamba", 4))
    s = make(
        backend,
        num_blocks=40,
        block_size=4,
        max_model_len=64,
        max_num_seqs=8,
        max_num_batched_tokens=8,
        kv_cache_groups=groups,
        caching=True,
        enable_chunked_prefill=True,
    )
    c = Scripted({"r": (external, False)})
    s.set_kv_connector(c, "fail", divergent_hybrid_hits=divergent)
    prompt = list(range(100, 114))
    s.add_request(req("a", prompt, max_tokens=4))
    for _ in range(8):
        step(s, 7)
    s.add_request(req("r", [*prompt, 7, 7, 7, 7, 9]))
    out = s.schedule()
    log = [call for call in c.log if call[1] == "r"]
    assert [call[0] for call in log] == calls
    assert log[0] == ("matched", "r", 19, told)
    if "reconciled" in calls:
        assert log[1] == ("reconciled", "r", computed)
    # (Its chunk ends where the next state is cached, at 16, or at its end.)
    assert out.num_scheduled_tokens == {"r": (16 if computed < 16 else 19) - computed}


def offers_by_step(backend: str) -> tuple[list[Any], list[list[str]]]:
    """The preemption that withdraws offers (docs/scheduling.md §4.19.2, rule
    7): Jamba's layout (full attention, states of 4 tokens, every state
    cached), 9 blocks, a budget of 8, the priority policy. "L" (priority 1,
    14 tokens) runs first; "H" (priority 0, 2 tokens) comes at step 1. At
    step 4 "L" decodes to 16 tokens, caching the state there, then "H"
    needs a block: "L", already scheduled, is preempted and its blocks go
    back, so the state it offered this step is withdrawn. Each step's
    offers as (request, group, block, tokens), and its preempted ids."""
    groups = (KVCacheGroup("full"), KVCacheGroup("mamba", 4))
    s = make(
        backend,
        num_blocks=9,
        block_size=4,
        max_model_len=24,
        max_num_seqs=4,
        max_num_batched_tokens=8,
        kv_cache_groups=groups,
        caching=True,
        enable_chunked_prefill=True,
        policy="priority",
        sparse_retention=False,
    )
    s.set_kv_connector(Scripted({}), "fail")
    core = s._core.core if backend == "rust" else s._core.twin
    s.add_request(req("L", list(range(100, 114)), max_tokens=4, priority=1))
    offers: list[Any] = []
    preempted: list[list[str]] = []
    for i in range(5):
        if i == 1:
            s.add_request(req("H", [200, 201], max_tokens=4, priority=0))
        out = s.schedule()
        taken = core.take_boundary_states()
        if backend == "python":
            taken = [
                (core.requests[o.owner].request_id, o.group, o.block_id, o.num_tokens)
                for o in taken
            ]
        offers.append(taken)
        preempted.append(sorted(out.preempted_req_ids))
        s.update_from_output(out, {rid: [7] for i, rid in enumerate(out.req_ids) if out.samples[i]})
    return offers, preempted


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_request_preempted_after_it_offered_a_state_withdraws_it(backend: str) -> None:
    offers, preempted = offers_by_step(backend)
    assert preempted == [[], [], [], [], ["L"]]
    # (vLLM's offers in the same run: tests/vllm_dropin/test_vllm_connector_dropin.py.)
    assert offers == [
        [("L", 1, 3, 8)],
        [("L", 1, 5, 12)],
        [],
        [("H", 1, 7, 4)],
        [],
    ]


class SettledHeard(Scripted):
    """Scripted, hearing the external hit each admission takes."""

    def external_hit_settled(self, rid: str, num_tokens: int, load_async: bool) -> None:
        self.log.append(("settled", rid, num_tokens, load_async))


@pytest.mark.parametrize("backend", BACKENDS)
def test_routed_experts_a_load_reads_stay_retained_and_cap_later_hits(backend: str) -> None:
    """Routed experts followed beside a connector (§7.12): the workers keep
    the finished requests' blocks' routing, up to twice the cache's blocks.
    Past that, the least recently used go, but never those a load in
    progress reads; an external hit over released blocks is cut to none."""
    c = SettledHeard({"d": (16, True), "f": (16, False), "g": (16, False)})
    # (7 blocks: the routing of 16 retained at most.)
    s = make(backend, num_blocks=8, block_size=4, max_model_len=24, max_num_seqs=4)
    s.set_kv_connector(c, "fail")
    backend_of = s._core
    (backend_of.core if backend == "rust" else backend_of.twin).enable_aux_outputs()
    prompts = {rid: list(range(k * 16, k * 16 + 16)) for k, rid in enumerate("abcx")}
    for rid in "abcx":  # one at a time: 16 blocks retained, most evicted since
        s.add_request(req(rid, prompts[rid], max_tokens=1))
        out = s.schedule()
        s.update_from_output(out, {rid: [EOS]})
    # d loads a's blocks (its local hit evicted, the workers hold their routing).
    s.add_request(req("d", prompts["a"] + [1, 1, 1, 1], max_tokens=1))
    out = s.schedule()
    assert s.debug_state()["requests"]["d"]["status"] == "WAITING_FOR_REMOTE_KVS"
    s.update_from_output(out, {})
    # Lookups of b's, c's and x's prompts use their blocks: a's are now the
    # least recently used (each waits for room d holds, and goes).
    for rid in "bcx":
        s.add_request(req(f"t{rid}", prompts[rid] + [2, 2, 2, 2], max_tokens=1))
        assert s.schedule().num_scheduled_tokens == {}
        s.finish_requests([f"t{rid}"])
    # e finishes meanwhile: two blocks more, the two least recent that d's
    # load does not read go (b's).
    s.add_request(req("e", list(range(200, 208)), max_tokens=1))
    out = s.schedule()
    assert out.num_scheduled_tokens == {"e": 8}
    s.update_from_output(out, {"e": [EOS]})
    # f reads a's blocks again (kept), g b's (released: cut to none); each
    # waits for room d holds.
    s.add_request(req("f", prompts["a"] + [3, 3, 3, 3], max_tokens=1))
    assert s.schedule().num_scheduled_tokens == {}
    s.finish_requests(["f"])
    s.add_request(req("g", prompts["b"] + [3, 3, 3, 3], max_tokens=1))
    s.schedule()
    matched = [e for e in c.log if e[0] == "matched"]
    assert [e[1:] for e in matched if e[1] in "dfg"] == [("d", 20, 0), ("f", 20, 0), ("g", 20, 0)]
    settled = [e[1:] for e in c.log if e[0] == "settled" and e[1] in "dfg"]
    assert settled == [("d", 16, True), ("f", 16, False), ("g", 0, False)]
