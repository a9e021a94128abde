"""The vLLM drop-in's views of a step and of an update, made in Rust as
Python lists (``_core.VllmStepRows``, ``_core.VllmStepUpdate``), agree with
the step's NumPy columns and with the core's own update on random
workloads: admissions with prefix hits, chunked prefills, preemptions and
resumptions, finishes, drafts, and hybrid KV-cache groups. They need no
vLLM: the drop-in's tests check the vLLM objects built from them."""

from __future__ import annotations

import dataclasses
import random
from typing import Any, NamedTuple

import numpy as np
import pytest

from ironbatch import (
    CacheConfig,
    KVCacheGroup,
    Request,
    SamplingParams,
    Scheduler,
    SchedulerConfig,
    _core,
)
from ironbatch.scheduler_output import Kind

LAYOUTS = {
    "full": None,
    "window": (KVCacheGroup("full"), KVCacheGroup("sliding_window", 32)),
}


def make(seed: int, layout: str, spec: int) -> Scheduler:
    rng = random.Random(seed)
    return Scheduler(
        SchedulerConfig(
            max_num_seqs=rng.choice([4, 8, 16]),
            max_num_batched_tokens=rng.choice([48, 96, 256]),
            max_model_len=512,
            num_speculative_tokens=spec,
        ),
        CacheConfig(
            num_blocks=rng.choice([70, 140, 800]),
            block_size=16,
            kv_cache_groups=LAYOUTS[layout],
        ),
    )


def add_requests(s: Scheduler, rng: random.Random, first: int, n: int) -> None:
    shared = list(range(3, 3 + 40))  # a shared prefix: prefix hits
    for i in range(first, first + n):
        own = [rng.randrange(100, 30_000) for _ in range(rng.randrange(1, 120))]
        prompt = (shared if rng.random() < 0.5 else []) + own
        s.add_request(
            Request(
                f"r{i}",
                prompt,
                SamplingParams(max_tokens=rng.randrange(1, 40), ignore_eos=True),
                eos_token_id=2,
            )
        )


def expected_rows(out: Any, groups: int) -> dict[str, Any]:
    """What the drop-in read from the columns before the Rust view."""
    kinds = out.kinds
    num_running = int(np.count_nonzero(kinds == int(Kind.RUNNING)))
    offsets = out.new_block_offsets.tolist()
    flat = out.new_block_ids
    return {
        "req_ids": list(out.req_ids),
        "slots": out.req_slots.tolist(),
        "num_scheduled": out.num_scheduled.tolist(),
        "computed": out.num_computed_tokens.tolist(),
        "num_output_tokens": out.num_output_tokens.tolist(),
        "num_running": num_running,
        "new": [i for i in range(num_running, len(kinds)) if kinds[i] == int(Kind.NEW)],
        "resumed": [i for i in range(num_running, len(kinds)) if kinds[i] == int(Kind.RESUMED)],
        "running_grown": [
            i for i in range(num_running) if offsets[i * groups] != offsets[(i + 1) * groups]
        ],
        "num_scheduled_tokens": dict(zip(out.req_ids, out.num_scheduled.tolist(), strict=True)),
        "total_num_scheduled_tokens": int(out.num_scheduled.sum()),
        "block_ids": [
            tuple(
                flat[offsets[i * groups + g] : offsets[i * groups + g + 1]].tolist()
                for g in range(groups)
            )
            for i in range(len(kinds))
        ],
        "spec": {
            rid: drafts
            for rid, chunk in zip(
                out.req_ids,
                np.split(out.spec_token_ids, np.cumsum(out.num_spec_tokens)[:-1]),
                strict=True,
            )
            if (drafts := chunk.tolist())
        }
        if len(out.req_ids)
        else {},
    }


def seen_rows(rows: Any) -> dict[str, Any]:
    return {
        "req_ids": list(rows.req_ids),
        "slots": rows.slots,
        "num_scheduled": rows.num_scheduled,
        "computed": rows.computed,
        "num_output_tokens": rows.num_output_tokens,
        "num_running": rows.num_running,
        "new": rows.new,
        "resumed": rows.resumed,
        "running_grown": rows.running_grown,
        "num_scheduled_tokens": rows.num_scheduled_tokens,
        "total_num_scheduled_tokens": rows.total_num_scheduled_tokens,
        "block_ids": [rows.block_ids(i) for i in range(len(rows.slots))],
        "spec": rows.spec_decode_tokens(),
    }


def sampled_lists(out: Any, rng: random.Random, spec: int) -> tuple[dict[str, int], list[Any]]:
    """A vLLM runner's output for ``out``: rows in a shuffled order, a
    token (or, verifying drafts, up to 1 + drafts) for each sampling row."""
    order = list(range(len(out.req_ids)))
    rng.shuffle(order)
    index = {out.req_ids[i]: k for k, i in enumerate(order)}
    sampled: list[Any] = [None] * len(order)
    for k, i in enumerate(order):
        n = 0
        if out.samples[i]:
            n = 1 + rng.randrange(0, int(out.num_spec_tokens[i]) + 1)
        sampled[k] = [rng.randrange(100, 30_000) for _ in range(n)]
    return index, sampled


@pytest.mark.parametrize("spec", [0, 2])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("seed", range(6))
def test_views_agree_with_columns_and_the_core_update(seed: int, layout: str, spec: int) -> None:
    rng = random.Random(seed)
    a, b = make(seed, layout, spec), make(seed, layout, spec)  # twins on the core
    groups = 1 if LAYOUTS[layout] is None else len(LAYOUTS[layout])
    next_id = 0
    kinds_seen: set[str] = set()
    shared_lists = 0
    known: dict[str, list[int]] = {}  # each request's tokens, prompt first
    finished_seen = 0
    for _ in range(200):
        if rng.random() < 0.3:
            n = rng.randrange(1, 5)
            add_requests(a, random.Random(next_id), next_id, n)
            add_requests(b, random.Random(next_id), next_id, n)
            next_id += n
            for rid, r in a.requests.items():
                known.setdefault(rid, list(r.prompt_token_ids))
        out_a, out_b = a.schedule(), b.schedule()
        step = out_b._handle
        rows = _core.VllmStepRows(step, groups)
        expected = expected_rows(out_a, groups)
        assert seen_rows(rows) == expected
        kinds_seen.update(k for k in ("new", "resumed", "running_grown") if expected[k])
        if spec and len(out_a):
            # Drafts for the next step, the same on both.
            drafts = {rid: [7] * rng.randrange(0, spec + 1) for rid in out_a.req_ids}
            a.update_draft_token_ids(drafts)
            b.update_draft_token_ids(drafts)
        index, sampled = sampled_lists(out_a, rng, spec)
        by_id = {rid: sampled[index[rid]] for rid in out_a.req_ids}
        ua = a.update_from_output(out_a, by_id)
        ub = _core.vllm_update_from_runner_output(
            b._core.core.core,
            step=step,
            req_id_to_index=index,
            sampled_token_ids=sampled,
        )
        for rid in ua.finished_req_ids:
            b.requests.pop(rid, None)
        assert ub.rows == ua.rows.tolist()
        assert ub.req_ids == list(ua.req_ids)
        assert ub.slots == [int(out_a.req_slots[r]) for r in ua.rows.tolist()]
        offs = ua.token_offsets.tolist()
        kept = [ua.tokens[offs[k] : offs[k + 1]].tolist() for k in range(len(ua))]
        assert ub.new_token_ids == kept
        assert ub.cached_tokens == ua.cached_tokens.tolist()
        assert [f.record for f in ub.finished] == sorted(ua.finished)
        for record in ua:
            known[record.request_id].extend(record.new_token_ids)
        for f in ub.finished:
            # A finished request's whole token list, as it ended.
            tokens = known[ub.req_ids[f.record]]
            assert (f.num_tokens, f.token_ids_from(0)) == (len(tokens), tokens)
            assert f.token_ids_from(len(tokens) - 1) == tokens[-1:]
            finished_seen += 1
        for k, row in enumerate(ub.rows):
            # The runner's own list where every sampled token was kept.
            runner_list = sampled[index[out_a.req_ids[row]]]
            same = ub.new_token_ids[k] is runner_list
            assert same == (len(runner_list) == len(kept[k]))
            shared_lists += same
        if rng.random() < 0.1 and a.requests:
            victim = rng.choice(sorted(a.requests))
            a.finish_requests([victim])
            b.finish_requests([victim])
    assert {"new", "running_grown"} <= kinds_seen
    assert shared_lists > 0 and finished_seen > 0


def test_records_of_finds_the_records_of_given_slots() -> None:
    s = make(0, "full", 0)
    add_requests(s, random.Random(0), 0, 6)
    for _ in range(20):  # until a step's update has several records
        out = s.schedule()
        index = {rid: i for i, rid in enumerate(out.req_ids)}
        sampled = [[5] if out.samples[i] else [] for i in range(len(out.req_ids))]
        u = _core.vllm_update_from_runner_output(
            s._core.core.core, step=out._handle, req_id_to_index=index, sampled_token_ids=sampled
        )
        if len(u.slots) >= 4:
            break
    assert len(u.slots) >= 4
    assert u.records_of([]) == []
    want = u.slots[1::2]
    assert u.records_of(want) == list(range(1, len(u.slots), 2))
    assert u.records_of(list(reversed(want))) == list(range(1, len(u.slots), 2))
    assert u.records_of([max(u.slots) + 100]) == []


def test_rows_refuse_a_wrong_group_count() -> None:
    s = make(0, "full", 0)
    add_requests(s, random.Random(0), 0, 3)
    step = s.schedule()._handle
    with pytest.raises(IndexError, match="num_groups 2"):
        _core.VllmStepRows(step, 2)
    rows = _core.VllmStepRows(step, 1)
    n = len(step)
    with pytest.raises(IndexError, match=f"row {n} of a step of {n} rows"):
        rows.block_ids(n)


def test_step_column_names_its_error() -> None:
    s = make(0, "full", 0)
    add_requests(s, random.Random(0), 0, 2)
    step = s.schedule()._handle
    assert step.column("num_scheduled").tolist() == step.columns()["num_scheduled"].tolist()
    assert step.columns() is step.columns()  # made once
    with pytest.raises(KeyError, match="not a step column"):
        step.column("nope")


# --- VllmObjects: vLLM's per-step objects made in Rust -----------------------
# Stand-ins with vLLM 0.33's field names (the drop-in's tests use vLLM's own
# classes): the maker must give what each dataclass's __init__ gives.


@dataclasses.dataclass
class FakeCachedRequestData:
    req_ids: list[str]
    resumed_req_ids: set[str]
    new_token_ids: list[list[int]]
    all_token_ids: dict[str, list[int]]
    new_block_ids: list[Any]
    num_computed_tokens: list[int]
    num_output_tokens: list[int]


@dataclasses.dataclass
class FakeSchedulerOutput:
    scheduled_new_reqs: list[Any]
    scheduled_cached_reqs: FakeCachedRequestData
    num_scheduled_tokens: dict[str, int]
    total_num_scheduled_tokens: int
    scheduled_spec_decode_tokens: dict[str, list[int]]
    scheduled_encoder_inputs: dict[str, list[int]]
    finished_req_ids: set[str]
    free_encoder_mm_hashes: list[str]
    encoder_input_updates: dict[str, Any] = dataclasses.field(default_factory=dict)
    preempted_req_ids: set[str] | None = None
    has_structured_output_requests: bool = False
    pending_structured_output_tokens: bool = False
    num_spec_tokens_to_schedule: int = 0
    num_common_prefix_blocks: list[int] = dataclasses.field(default_factory=list)
    skip_drafts: bool = False
    new_block_ids_to_zero: list[int] | None = None


@dataclasses.dataclass
class FakePrefixCacheStats:
    reset: bool = False
    requests: int = 0
    queries: int = 0
    hits: int = 0
    preempted_requests: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0
    hits_by_source: dict[str, int] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class FakeSchedulerStats:
    num_running_reqs: int = 0
    num_waiting_reqs: int = 0
    num_skipped_waiting_reqs: int = 0
    num_kv_fetch_reqs_by_stage: dict[str, int] = dataclasses.field(default_factory=dict)
    step_counter: int = 0
    kv_cache_usage: float = 0.0
    prefix_cache_stats: FakePrefixCacheStats = dataclasses.field(
        default_factory=FakePrefixCacheStats
    )
    kv_cache_eviction_events: list[Any] = dataclasses.field(default_factory=list)
    spec_decoding_stats: Any = None
    kv_connector_stats: dict[str, Any] | None = None
    waiting_lora_adapters: dict[str, int] = dataclasses.field(default_factory=dict)
    cudagraph_stats: Any = None
    perf_stats: Any = None


class FakeEngineCoreOutput(NamedTuple):
    request_id: str
    new_token_ids: list[int]


STAGES = ("queued", "loading")


def objects(
    groups: int = 1,
    v2: bool = True,
    spec: int = 0,
    send_token_ids: bool = False,
    cached_request_data: type = FakeCachedRequestData,
) -> Any:
    return _core.VllmObjects(
        scheduler_output=FakeSchedulerOutput,
        cached_request_data=cached_request_data,
        scheduler_stats=FakeSchedulerStats,
        prefix_cache_stats=FakePrefixCacheStats,
        engine_core_output=FakeEngineCoreOutput,
        kv_fetch_stages=STAGES,
        num_kv_cache_groups=groups,
        model_runner_v2=v2,
        send_token_ids=send_token_ids,
        num_speculative_tokens=spec,
        can_skip_drafts=True,
    )


def same_as_init(made: Any) -> None:
    """``made`` equals what its class's __init__ makes from its fields,
    field for field and in the same order."""
    cls = type(made)
    fields = {f.name: getattr(made, f.name) for f in dataclasses.fields(cls) if f.init}
    want = cls(**fields)
    assert made == want
    assert list(vars(made)) == list(vars(want))


def expected_output(out: Any, rows_before: dict[str, Any], v2: bool, spec: int) -> dict[str, Any]:
    """The SchedulerOutput the drop-in built in Python before the core made it."""
    n = rows_before["num_running"]
    resumed = [] if v2 else rows_before["resumed"]
    cached = [*range(n), *resumed]
    ids, blocks = rows_before["req_ids"], rows_before["block_ids"]
    grown = set(rows_before["running_grown"])
    return {
        "cached": {
            "req_ids": [ids[i] for i in cached],
            "resumed_req_ids": {ids[i] for i in resumed},
            "new_token_ids": [],
            "all_token_ids": {},
            "new_block_ids": [blocks[i] if i in grown or i >= n else None for i in cached],
            "num_computed_tokens": [rows_before["computed"][i] for i in cached],
            "num_output_tokens": [rows_before["num_output_tokens"][i] for i in cached],
        },
        "num_scheduled_tokens": list(rows_before["num_scheduled_tokens"].items()),
        "total_num_scheduled_tokens": rows_before["total_num_scheduled_tokens"],
        "scheduled_spec_decode_tokens": rows_before["spec"] if spec else {},
        "preempted_req_ids": set(out.preempted_req_ids),
        "finished_req_ids": set(out.finished_req_ids),
        "num_spec_tokens_to_schedule": spec,
        "skip_drafts": not out.drafts_needed,
    }


def made_output(so: Any) -> dict[str, Any]:
    c = so.scheduled_cached_reqs
    return {
        "cached": dataclasses.asdict(c),
        "num_scheduled_tokens": list(so.num_scheduled_tokens.items()),
        "total_num_scheduled_tokens": so.total_num_scheduled_tokens,
        "scheduled_spec_decode_tokens": so.scheduled_spec_decode_tokens,
        "preempted_req_ids": so.preempted_req_ids,
        "finished_req_ids": so.finished_req_ids,
        "num_spec_tokens_to_schedule": so.num_spec_tokens_to_schedule,
        "skip_drafts": so.skip_drafts,
    }


@pytest.mark.parametrize("v2", [False, True])
@pytest.mark.parametrize("spec", [0, 2])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("seed", range(4))
def test_objects_are_what_the_rows_say(seed: int, layout: str, spec: int, v2: bool) -> None:
    """A twin pair on the core: one scheduled through the façade (the
    columns), one through VllmObjects; every step's SchedulerOutput and
    outputs must say what the columns say, and be what __init__ makes."""
    rng = random.Random(seed)
    a, b = make(seed, layout, spec), make(seed, layout, spec)
    groups = 1 if LAYOUTS[layout] is None else len(LAYOUTS[layout])
    maker = objects(groups, v2, spec)
    next_id = 0
    seen = {"resumed": 0, "grown": 0, "news": 0, "finished": 0}
    for _ in range(200):
        if rng.random() < 0.3:
            n = rng.randrange(1, 5)
            add_requests(a, random.Random(next_id), next_id, n)
            add_requests(b, random.Random(next_id), next_id, n)
            next_id += n
        out_a = a.schedule()
        rows = maker.schedule(b._core.core.core)
        so = rows.output
        want_rows = expected_rows(out_a, groups)
        assert seen_rows(rows) == want_rows
        assert made_output(so) == expected_output(out_a, want_rows, v2, spec)
        assert so.scheduled_new_reqs == [] and so.encoder_input_updates == {}
        same_as_init(so)
        same_as_init(so.scheduled_cached_reqs)
        news = bool(want_rows["new"] or want_rows["resumed"] or out_a.preempted_req_ids)
        assert rows.has_news == news
        seen["news"] += news
        seen["resumed"] += bool(want_rows["resumed"])
        seen["grown"] += bool(want_rows["running_grown"])
        if spec and len(out_a):
            drafts = {rid: [7] * rng.randrange(0, spec + 1) for rid in out_a.req_ids}
            a.update_draft_token_ids(drafts)
            b.update_draft_token_ids(drafts)
        index, sampled = sampled_lists(out_a, rng, spec)
        ua = a.update_from_output(out_a, {rid: sampled[index[rid]] for rid in out_a.req_ids})
        ub = maker.update(
            b._core.core.core, step=rows.step, req_id_to_index=index, sampled_token_ids=sampled
        )
        assert ub.outputs == [
            FakeEngineCoreOutput(rid, toks)
            for rid, toks in zip(ub.req_ids, ub.new_token_ids, strict=True)
        ]
        assert ub.req_ids == list(ua.req_ids)
        seen["finished"] += len(ua.finished_req_ids)
        for rid in ua.finished_req_ids:
            b.requests.pop(rid, None)
        stats_a, stats_b = (
            a.make_stats(),
            maker.scheduler_stats(
                b._core.core.core,
                kv_cache_eviction_events=[],
                spec_decoding_stats=None,
                kv_connector_stats=None,
                cudagraph_stats=None,
                perf_stats=None,
            ),
        )
        same_as_init(stats_b)
        same_as_init(stats_b.prefix_cache_stats)
        assert stats_b.num_kv_fetch_reqs_by_stage == dict.fromkeys(STAGES, 0)
        assert (stats_b.num_running_reqs, stats_b.num_waiting_reqs) == (
            stats_a.num_running_reqs,
            stats_a.num_waiting_reqs,
        )
        assert stats_b.kv_cache_usage == stats_a.kv_cache_usage
        pa, pb = stats_a.prefix_cache_stats, stats_b.prefix_cache_stats
        assert (pb.reset, pb.requests, pb.queries, pb.hits) == (
            pa.reset,
            pa.requests,
            pa.queries,
            pa.hits,
        )
    assert seen["news"] and seen["grown"] and seen["finished"]


def test_objects_send_pipeline_stages_the_scheduled_tokens() -> None:
    """Synchronous pipeline parallelism: each cached request's scheduled
    tokens, cut at the known ones."""
    s = make(1, "full", 0)
    add_requests(s, random.Random(1), 0, 4)
    maker = objects(1, v2=True, spec=0, send_token_ids=True)
    core = s._core.core.core
    for _ in range(12):
        rows = maker.schedule(core)
        cached = rows.output.scheduled_cached_reqs
        for k in range(len(cached.req_ids)):
            tokens, _ = _core.vllm_request_state(core, rows.slots[k])
            start, n = rows.computed[k], rows.num_scheduled[k]
            assert cached.new_token_ids[k] == tokens[start : start + n]
        index = {rid: i for i, rid in enumerate(rows.req_ids)}
        sampled = [[5] for _ in rows.req_ids]
        maker.update(core, step=rows.step, req_id_to_index=index, sampled_token_ids=sampled)


def test_fresh_defaults_are_fresh() -> None:
    """Fields with a default_factory get a new value in every made object."""
    s = make(0, "full", 0)
    add_requests(s, random.Random(0), 0, 2)
    maker = objects(1, v2=True, spec=0)
    core = s._core.core.core
    one = maker.schedule(core).output
    two = maker.schedule(core).output  # a second step before the first's output
    assert one.encoder_input_updates is not two.encoder_input_updates
    assert one.num_common_prefix_blocks is not two.num_common_prefix_blocks
    assert one.scheduled_new_reqs is not two.scheduled_new_reqs


@dataclasses.dataclass
class WithPostInit(FakeCachedRequestData):
    def __post_init__(self) -> None:
        pass


@dataclasses.dataclass
class MissingField:
    req_ids: list[str]


Frozen = dataclasses.make_dataclass(
    "Frozen", [f.name for f in dataclasses.fields(FakeCachedRequestData)], frozen=True
)


@pytest.mark.parametrize(
    ("cls", "message"),
    [
        (WithPostInit, "has __post_init__"),
        (Frozen, "is frozen"),
        (MissingField, 'no field "resumed_req_ids"'),
        (int, "not a dataclass"),
    ],
)
def test_objects_refuse_a_class_they_cannot_make(cls: type, message: str) -> None:
    with pytest.raises(TypeError, match=f"{cls.__qualname__}: {message}"):
        objects(cached_request_data=cls)
    objects()  # and the stand-ins themselves are fine


def test_objects_refuse_a_required_field_they_do_not_set() -> None:
    names = [f.name for f in dataclasses.fields(FakeCachedRequestData)]
    new_required = dataclasses.make_dataclass("NewRequired", [*names, "extra"])
    with pytest.raises(TypeError, match='NewRequired: field "extra" has no default and is not set'):
        objects(cached_request_data=new_required)
