"""The vLLM drop-in's views of a step and of an update, made in Rust as
Python lists (``_core.VllmStepRows``, ``_core.VllmStepUpdate``), agree with
the step's NumPy columns and with the core's own update on random
workloads: admissions with prefix hits, chunked prefills, preemptions and
resumptions, finishes, drafts, and hybrid KV-cache groups. They need no
vLLM: the drop-in's tests check the vLLM objects built from them."""

from __future__ import annotations

import random
from typing import Any

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
    for _ in range(200):
        if rng.random() < 0.3:
            n = rng.randrange(1, 5)
            add_requests(a, random.Random(next_id), next_id, n)
            add_requests(b, random.Random(next_id), next_id, n)
            next_id += n
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
    assert shared_lists > 0


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
