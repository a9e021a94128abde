"""The drop-in against vLLM 0.33's own scheduler with a KV connector: the
stand-in (ironbatch/bench/standin_connector.py) built by vLLM's factory on each side,
random workloads, sync and async, in some with hybrid support and window
KV-cache groups beside it (docs/scheduling.md §4.19). Every
SchedulerOutput (the connector's metadata included), every
EngineCoreOutputs (transfer parameters, failed loads' errors, stats) and
every request must be equal, and so must each connector's call log: which
calls, in which order, with which answers, and the Request and blocks each
call saw (tokens, block hashes, computed count, status, cached blocks)."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest
from test_vllm_connector_standin import check_blocks
from vllm.distributed.kv_transfer.kv_connector.v1.base import SupportsHMA
from vllm.pooling_params import PoolingParams
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.kv_cache_interface import MambaSpec
from vllm.v1.request import RequestStatus

from ironbatch.bench.standin_connector import StandInShares, StandInWorker, WorkerReport
from ironbatch.bench.standin_ec_connector import EcShares
from ironbatch.bench.vllm_standin_connector import (
    kv_connector_output,
    kv_transfer_config,
    random_settings,
    stand_in_of,
)
from ironbatch.bench.vllm_standin_ec_connector import ec_transfer_config

import vllm_setup
from fake_grammar import REJECTED
from seeded import Workloads
from test_vllm_differential import image_pool, place_images, step_room
from vllm_pair import VllmPair, VllmPoolDry, VllmUnderflow

VOCAB = 50
# Per run, each sync or async at random (about 120 with window groups beside
# a connector with hybrid support, about 40 of them of different block
# sizes, 75 with images, 25 an embedding model's); FULL_WORKLOADS with
# IRONBATCH_FULL=1.
WORKLOADS = 300
FULL_WORKLOADS = 1200


def run_seed(seed: int) -> Counter:
    rng = random.Random(seed)
    settings = random_settings(rng, seed)
    # An EAGLE-style drafter in some (drawn apart): beside a connector vLLM
    # keeps the plain hashes, so each prefix hit gives up its last block.
    drafter = random.Random(seed ^ 0xEA61E)
    # (Not beside window groups: there the drop from plain hashes makes the
    # drop-in use vLLM's scheduler.)
    if drafter.random() < 0.3 and settings["kv_layout"] == "full":
        settings["speculative_config"] = {
            "method": drafter.choice(["eagle", "eagle3"]),
            "num_speculative_tokens": drafter.choice([1, 2, 3]),
        }
    # A vision model (Qwen2.5-VL's shape) in some, drawn apart: images
    # beside external hits, loaded or in the step.
    vision = random.Random(seed ^ 0x1AA6E)
    if vision.random() < 0.25:
        compute = vision.choice([8, 24, 48, 96])
        settings["target"] = "vision"
        settings["mm_budget"] = (compute, vision.choice([compute, 2 * compute]))
        settings["disable_chunked_mm_input"] = vision.random() < 0.3
        # An encoder-cache connector beside half of them: images loaded
        # from elsewhere, requests it can no longer serve ended with an
        # error in the update that settles KV transfers.
        if vision.random() < 0.5:
            shares = EcShares.draw(vision)
            settings["ec_transfer_config"] = ec_transfer_config(vision.randrange(2**32), shares)
    # An embedding model in some (drawn apart, neither a drafter nor a
    # vision model beside it): prompts that end at their pooled result, their
    # blocks saved or loaded like any.
    pooling = random.Random(seed ^ 0x9001).random() < 0.15
    if pooling and "speculative_config" not in settings and "target" not in settings:
        settings["runner"] = "pooling"
    # Routed experts in some (drawn apart; vLLM returns them from a
    # generating model with prefix caching): an external hit is kept only
    # where the workers hold its blocks' routing (docs/scheduling.md §7.12).
    routed = random.Random(seed ^ 0xA0C5).random() < 0.3
    if routed and settings["enable_prefix_caching"] and "runner" not in settings:
        settings["return_routed_experts"] = True
    # Structured-output requests in some (drawn apart, a generating model):
    # grammars compile late, fail (the next update ends them with the
    # failed loads, before KV transfers settle) or reject a token.
    grammars = random.Random(seed ^ 0x6A4A).random() < 0.3 and "runner" not in settings
    pair = VllmPair(rng, **settings)
    capped = count_capped_external_hits(pair)
    images = image_pool(vision, settings, step_room(pair)) if "target" in settings else []
    ours, theirs = stand_in_of(pair.ours), stand_in_of(pair.vllm)
    worker = StandInWorker()
    step = 0

    def report(so: SchedulerOutput) -> Any:
        nonlocal step
        step += 1
        out = worker.report(so.kv_connector_metadata.meta, step)
        return kv_connector_output(out)

    pair.kv_reports = report

    def choose() -> int:
        x = rng.random()
        if grammars and x > 0.97:
            return REJECTED
        return vllm_setup.EOS if x < 0.08 else rng.randrange(3, VOCAB)

    pair.choose = choose
    max_len = settings["max_model_len"]
    depth = 2 if settings["async_scheduling"] else 1
    prefixes = [[rng.randrange(3, VOCAB) for _ in range(max_len)] for _ in range(3)]
    arrivals = rng.randint(6, 20)
    added = 0

    def check() -> None:
        assert ours.log == theirs.log
        check_blocks(pair.vllm)

    try:
        for _ in range(2000):
            if added < arrivals and rng.random() < 0.5:
                n = rng.randint(1, max_len - 8)
                prompt = rng.choice(prefixes)[: rng.randint(0, n)]
                prompt += [rng.randrange(3, VOCAB) for _ in range(n - len(prompt))]
                max_tokens = rng.randint(1, max(1, min(24, max_len - n - 1)))
                features = place_images(vision, prompt, images) if images else []
                pair.events["images"] += len(features)
                # An embedding request samples nothing: its pooled result ends it.
                kind = (
                    {"pooling_params": PoolingParams(task="embed")}
                    if pair.pooling
                    else {"max_tokens": max_tokens}
                )
                pair.add(
                    f"r{added}",
                    prompt,
                    priority=rng.randint(0, 2),
                    mm_features=features,
                    grammar=grammars and rng.random() < 0.4,
                    **kind,
                )
                added += 1
            for rid in list(pair.compiling):  # grammars compile in their own time
                if rng.random() < 0.3 or added == arrivals:
                    pair.resolve_grammar(rid, compiled=rng.random() < 0.8)
            live = [rid for rid, r in pair.vllm.requests.items() if not r.is_finished()]
            if live and rng.random() < 0.05:
                victim = rng.choice(sorted(live))
                loading = pair.vllm.requests[victim].status == RequestStatus.WAITING_FOR_REMOTE_KVS
                pair.events["aborted_loading"] += loading
                pair.abort([victim])
                check()
            if added == arrivals and not pair.vllm.has_requests() and not worker.busy:
                while pair.in_flight:
                    pair.update_oldest()
                if not pair.vllm.has_requests() and not worker.busy:
                    break
            requests = pair.vllm.requests.values()
            pair.events["loading"] += sum(
                r.status == RequestStatus.WAITING_FOR_REMOTE_KVS for r in requests
            )
            pair.schedule()
            check()
            while len(pair.in_flight) >= depth:
                pair.update_oldest()
                check()
        else:
            raise AssertionError("no progress")
    except VllmUnderflow:
        # vLLM's own bug, past which nothing compares (see VllmUnderflow).
        pair.events["vllm_underflow"] += 1
        return pair.events
    except VllmPoolDry:
        # vLLM's own bug again (see VllmPoolDry): the core's request waits.
        pair.events["vllm_pool_dry"] += 1
        return pair.events
    assert pair.ours._core.num_free_blocks == settings["num_blocks"] - 1, "blocks leaked"
    events = pair.events
    if pair.vllm.ec_connector is not None:
        ec_theirs, ec_ours = pair.vllm.ec_connector.stand_in, pair.ours.ec_connector.stand_in
        assert ec_ours.log == ec_theirs.log, "the encoder-cache connector was called differently"
        events.update(ec_ours.events)
        events["ec_connector"] += 1
    events.update(theirs.events)
    events.update(worker.events)
    events["async" if settings["async_scheduling"] else "sync"] += 1
    events["drafting"] += "speculative_config" in settings
    # A connector with hybrid support, and window groups beside it.
    events["hybrid_connector"] += isinstance(pair.vllm.connector, SupportsHMA)
    groups = pair.vllm.kv_cache_config.kv_cache_groups
    states = [g for g in groups if isinstance(g.kv_cache_spec, MambaSpec)]
    events["window_groups"] += len(groups) > 1 and not states
    # A mixed-precision hybrid's (its new blocks zeroed, but those a load
    # writes).
    events["mixed_block_sizes"] += len({g.kv_cache_spec.block_size for g in groups}) > 1
    # Recurrent states beside attention, uncached (prefix caching off).
    events["recurrent_states"] += bool(states)
    events["recurrent_states_loaded"] += bool(states) and theirs.events["async_loads"] > 0
    events["recurrent_states_cached"] += bool(states) and settings["enable_prefix_caching"]
    # A connector that completes divergent hybrid hits beside them (NIXL's).
    events["divergent_hits"] += bool(pair.vllm.connector.supports_divergent_local_hybrid_hits)
    events["vision"] += bool(images)
    events["routed_experts"] += "return_routed_experts" in settings
    events["routed_experts_capped"] += capped[0]
    events["workloads"] += 1
    return events


def count_capped_external_hits(pair: VllmPair) -> list[int]:
    """A counter, kept up to date, of the external hits vLLM's
    auxiliary-output connector cut (none without routed experts)."""
    capped = [0]
    aux = pair.vllm.aux_output_connector
    if aux is None:
        return capped
    cap = aux.cap_external_hit

    def counted(request: Any, num_local: int, num_external: int) -> int:
        kept = cap(request, num_local, num_external)
        capped[0] += kept < num_external
        return kept

    aux.cap_external_hit = counted
    return capped


def test_dropin_equals_vllm_with_the_stand_in(workloads: Workloads) -> None:
    """At least 300 workloads a run (1,200 with IRONBATCH_FULL=1), each
    connector path seen often enough to matter."""
    needs = {
        what: workloads.scaled(count, WORKLOADS, FULL_WORKLOADS)
        for what, count in {
            "sync": 240,
            "async": 240,
            "async_loads": 1200,
            "sync_loads": 1200,
            "failed_loads": 160,
            "invalid_blocks": 320,
            "delayed_frees": 1200,
            "loading": 3200,
            "preempted": 80,
            "aborted_loading": 40,
            "drafting": 160,
            "hybrid_connector": 280,
            "window_groups": 240,
            "mixed_block_sizes": 80,
            "recurrent_states": 120,
            "recurrent_states_loaded": 80,
            "recurrent_states_cached": 50,
            "divergent_hits": 20,
            "boundary_states": 800,
            "vision": 160,
            "images": 1200,
            "pooled": 400,
            "routed_experts": 40,
            "routed_experts_capped": 40,
            "ec_connector": 60,
            "ec_unavailable": 10,
            "grammar_failed": 40,
        }.items()
    }
    events = workloads.run_covering(run_seed, needs, WORKLOADS, FULL_WORKLOADS)
    for what, n in needs.items():
        assert events[what] >= n, (what, events)


@pytest.mark.parametrize("seed", range(3))
def test_a_workload_replays(seed: int) -> None:
    """One workload, run twice: the same events (the test is deterministic)."""
    assert run_seed(seed) == run_seed(seed)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_request_with_nothing_computed_names_every_state_block(async_scheduling: bool) -> None:
    """Qwen3-Next's layout with prefix caching off (three linear-attention
    groups uncached beside full attention) behind a connector with hybrid
    support, which recomputes failed loads: a request's 16-token load comes
    back failed, so it has computed nothing, and it is aborted then. Its
    full-attention group names none of its blocks, but each state group
    names its state block (no token range: vLLM clips attention groups
    only). The drop-in's calls are vLLM's."""
    shares = StandInShares(load_failed=0.0, block_invalid=0.0, delay_free=0.0)
    config = kv_transfer_config(0, "recompute", shares, {"a": (16, True)}, hybrid=True)
    settings = dict(
        kv_layout="qwen3-next",
        block_size=8,
        num_blocks=40,
        max_model_len=64,
        max_num_batched_tokens=64,
        enable_prefix_caching=False,
        async_scheduling=async_scheduling,
        kv_transfer_config=config,
    )
    pair = VllmPair(random.Random(0), **settings)
    ours, theirs = stand_in_of(pair.ours), stand_in_of(pair.vllm)
    pair.add("a", list(range(3, 30)), max_tokens=4)
    pair.schedule()  # the load starts: "a" waits for its KV
    report = WorkerReport(finished_recving={"a"}, failed_recving={"a"})
    pair.kv_reports = lambda _: kv_connector_output(report)
    pair.update_oldest()
    assert pair.vllm.requests["a"].num_computed_tokens == 0
    pair.abort(["a"])
    finished = [call for call in theirs.log if call[0] == "finished"]
    assert [(rid, [bool(ids) for ids in groups]) for _, rid, groups, _ in finished] == [
        ("a", [True, True, True, False])
    ]
    assert ours.log == theirs.log


def test_a_request_preempted_after_it_offered_a_state_withdraws_it() -> None:
    """tests/test_kv_connector.py's case against vLLM (synchronous
    scheduling, as there): Jamba's layout with
    every state cached, the priority policy, "L" preempted at step 4 right
    after it cached (and offered) its state at 16 tokens. vLLM drops the
    offer with the blocks (its MambaManager's pop_blocks_for_free), and so
    does the drop-in: no offer that step, and the same calls."""
    shares = StandInShares(unknown=0.0, hit=0.0, load_failed=0.0, block_invalid=0.0)
    config = kv_transfer_config(0, "fail", shares, hybrid=True)
    settings = dict(
        kv_layout="jamba",
        block_size=4,
        num_blocks=9,
        max_model_len=24,
        max_num_seqs=4,
        max_num_batched_tokens=8,
        enable_prefix_caching=True,
        enable_chunked_prefill=True,
        policy="priority",
        retention_interval=None,
        async_scheduling=False,
        kv_transfer_config=config,
    )
    pair = VllmPair(random.Random(0), **settings)
    pair.choose = lambda: 7
    ours, theirs = stand_in_of(pair.ours), stand_in_of(pair.vllm)
    pair.add("L", list(range(10, 24)), max_tokens=4, priority=1)
    offered, preempted = [], []
    for step in range(5):
        if step == 1:
            pair.add("H", [30, 31], max_tokens=4, priority=0)
        before = len(theirs.log)
        pair.schedule()
        preempted.append(sorted(pair.in_flight[-1][0].preempted_req_ids))
        offered.append([call[1] for call in theirs.log[before:] if call[0] == "boundary_states"])
        pair.update_oldest()
        assert ours.log == theirs.log
    assert preempted[4] == ["L"]
    # ("L" offered at 8 and 12 tokens, "H" at 4; nothing at step 4.)
    assert [[rid for entry in step for rid, _ in entry] for step in offered][3:] == [["H"], []]
