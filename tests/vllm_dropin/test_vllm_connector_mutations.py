"""The connector differential (test_vllm_connector_dropin) must catch a
drop-in that gets the connector protocol wrong: each test breaks one rule
where the drop-in hands the core its inputs (a delayed free done at once, a
failed load not recomputed, a request leaving WAITING_FOR_REMOTE_KVS before
its load is reported, external hit tokens double-counted, a connector shown
a stale Request, per-group hits not told, a hit found again not counted)
and checks that the random workloads fail within a few seeds."""

from __future__ import annotations

import copy
import dataclasses
import random
from typing import Any

import pytest

pytest.importorskip("vllm")

from test_vllm_connector_dropin import run_seed  # noqa: E402
from vllm.v1.request import RequestStatus  # noqa: E402

from ironbatch.bench.vllm_standin_connector import random_settings  # noqa: E402
from ironbatch.vllm import kv_connector as bridge_module  # noqa: E402
from ironbatch.vllm import scheduler as scheduler_module  # noqa: E402
from ironbatch.vllm.kv_connector import ConnectorBridge  # noqa: E402
from ironbatch.vllm.scheduler import Scheduler  # noqa: E402

SEEDS = 12


def caught(seeds: int = SEEDS, of: list[int] | None = None) -> bool:
    """Whether some workload's comparison with vLLM fails (of the first
    ``seeds`` seeds, or of ``of``)."""
    for seed in range(seeds) if of is None else of:
        try:
            run_seed(seed)
        except AssertionError:
            return True
    return False


def divergent_seeds(n: int) -> list[int]:
    """The first ``n`` seeds whose connector completes divergent hybrid
    hits beside cached recurrent states (one workload in about 30)."""
    found: list[int] = []
    seed = 0
    while len(found) < n:
        settings = random_settings(random.Random(seed), seed)
        if settings["kv_transfer_config"].kv_connector == "StandInDivergentKVConnector":
            found.append(seed)
        seed += 1
    return found


def test_the_unbroken_drop_in_passes() -> None:
    assert not caught(4)


def test_a_delayed_free_done_at_once_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    finished = ConnectorBridge.request_finished

    def never_hold(self: Any, request_id: str, block_ids: Any, status: str) -> bool:
        finished(self, request_id, block_ids, status)
        return False

    monkeypatch.setattr(ConnectorBridge, "request_finished", never_hold)
    assert caught()


def _with_report(monkeypatch: pytest.MonkeyPatch, change: Any) -> None:
    """The drop-in's update hands the core (and its connector) a report
    changed by ``change(scheduler, report)``."""
    update = Scheduler.update_from_output

    def changed(self: Any, scheduler_output: Any, model_runner_output: Any) -> Any:
        report = model_runner_output.kv_connector_output
        if report is not None:
            model_runner_output.kv_connector_output = change(self, copy.deepcopy(report))
        return update(self, scheduler_output, model_runner_output)

    monkeypatch.setattr(Scheduler, "update_from_output", changed)


def test_a_failed_load_not_recomputed_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_failures(s: Any, report: Any) -> Any:
        report.failed_recving = set()
        report.invalid_block_ids = set()
        return report

    _with_report(monkeypatch, no_failures)
    assert caught()


def test_leaving_the_load_wait_early_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    def all_loads_done(s: Any, report: Any) -> Any:
        loading = {
            rid for rid, r in s.requests.items() if r.status == RequestStatus.WAITING_FOR_REMOTE_KVS
        }
        report.finished_recving = set(report.finished_recving or ()) | loading
        return report

    _with_report(monkeypatch, all_loads_done)
    assert caught()


def test_external_hits_counted_twice_are_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    ask = ConnectorBridge.get_num_new_matched_tokens

    def doubled(self: Any, request_id: str, num_tokens: int, num_computed: int) -> Any:
        tokens, load_async = ask(self, request_id, num_tokens, num_computed)
        if tokens:
            left = num_tokens - num_computed - (0 if load_async else 1)
            tokens = min(2 * tokens, left)
        return tokens, load_async

    monkeypatch.setattr(ConnectorBridge, "get_num_new_matched_tokens", doubled)
    assert caught()


def test_a_stale_request_shown_to_the_connector_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def tokens_not_brought_up_to_date(r: Any, tokens: list[int]) -> None:
        pass

    monkeypatch.setattr(bridge_module, "set_tokens", tokens_not_brought_up_to_date)
    assert caught()


def test_per_group_hits_not_told_are_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A drop-in that tells NIXL-like connectors the hit every group agrees
    on (the core's per-group hits off) is caught: caught in 46 of 60 such
    workloads when written."""
    setup = bridge_module.connector_setup

    def without(vllm_config: Any, connector: Any) -> Any:
        return dataclasses.replace(setup(vllm_config, connector), divergent_hybrid_hits=False)

    monkeypatch.setattr(scheduler_module, "connector_setup", without)
    assert caught(of=divergent_seeds(SEEDS))


def test_a_hit_found_again_not_counted_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A drop-in whose stats keep the per-group hit after the core found the
    agreed one again (the connector answered no tokens) is caught: 26 of 60
    when written."""
    monkeypatch.setattr(ConnectorBridge, "local_hit_reconciled", lambda *_: None)
    assert caught(of=divergent_seeds(SEEDS))
