"""vLLM's own scheduler and the drop-in, built from the same VllmConfig and
driven side by side with identical vLLM Requests and model-runner outputs:
every SchedulerOutput, every EngineCoreOutputs and every request's state
must be equal (timestamps aside)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import random
from collections import Counter, deque
from collections.abc import Iterator
from typing import Any

from vllm.v1.core.sched.interface import PauseState
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.engine import FinishReason
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus

from ironbatch import _core

import vllm_setup

# Request fields the drop-in keeps current at every step; tokens and
# num_computed_tokens it brings up to date at admission, resumption, finish
# and abort (the core holds them meanwhile).
CURRENT = ("status", "num_preemptions", "stop_reason", "num_prompt_tokens")


def _new_request_data(d: Any) -> dict[str, Any]:
    fields = {f.name: getattr(d, f.name) for f in dataclasses.fields(d)}
    fields["sampling_params"] = repr(fields["sampling_params"])
    if fields["prefill_token_ids"] is not None:
        fields["prefill_token_ids"] = list(fields["prefill_token_ids"])
    return fields


def scheduler_output_view(so: SchedulerOutput) -> dict[str, Any]:
    """Every field of a SchedulerOutput, comparable."""
    view = {f.name: getattr(so, f.name) for f in dataclasses.fields(so)}
    view["scheduled_new_reqs"] = [_new_request_data(d) for d in so.scheduled_new_reqs]
    view["scheduled_cached_reqs"] = dataclasses.asdict(so.scheduled_cached_reqs)
    view["num_scheduled_tokens"] = list(so.num_scheduled_tokens.items())  # order matters too
    return view


def _struct_view(obj: Any, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    return {f: getattr(obj, f) for f in obj.__struct_fields__ if f not in skip}


def engine_outputs_view(outs: dict[int, Any]) -> dict[int, Any]:
    """EngineCoreOutputs per client, comparable: events by type only, no
    timestamps."""
    view: dict[int, Any] = {}
    for client, eco in outs.items():
        v = _struct_view(eco, skip=("timestamp", "outputs", "scheduler_stats"))
        v["outputs"] = []
        for o in eco.outputs:
            ov = _struct_view(o, skip=("events",))
            ov["events"] = None if o.events is None else [e.type for e in o.events]
            v["outputs"].append(ov)
        stats = eco.scheduler_stats
        v["scheduler_stats"] = None if stats is None else dataclasses.asdict(stats)
        view[client] = v
    return view


def request_view(r: Request, tokens: list[int] | None = None, computed: int | None = None) -> dict:
    """A request's state; ``tokens`` and ``computed`` stand in for its own."""
    v = {k: getattr(r, k) for k in CURRENT}
    v["all_token_ids"] = list(r.all_token_ids) if tokens is None else tokens
    v["num_computed_tokens"] = r.num_computed_tokens if computed is None else computed
    return v


def core_view(ours: Any, r: Request) -> dict:
    """The drop-in's view of a live request, read from its core (without
    bringing the Request object up to date, which would hide a missing sync)."""
    tokens, computed = _core.vllm_request_state(ours._core.core, ours._slot_of[r.request_id])
    return request_view(r, tokens, computed)


@contextlib.contextmanager
def _env(name: str, value: str | None) -> Iterator[None]:
    old = os.environ.get(name)
    if value is not None:
        os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


class VllmPair:
    """The two schedulers; ``events`` counts what a workload exercised."""

    def __init__(self, rng: random.Random, model_runner_v1: bool = False, **settings: Any) -> None:
        self.rng = rng
        self.settings = settings
        self.bs = settings.get("block_size", vllm_setup.DEFAULTS["block_size"])
        # Both schedulers read the runner version once, when built; V2 is the
        # default, V1 gets resumptions as cached data with all_token_ids.
        with _env("VLLM_USE_V2_MODEL_RUNNER", "0" if model_runner_v1 else None):
            self.vllm = vllm_setup.make_scheduler("vllm", **settings)
            self.ours = vllm_setup.make_scheduler("ironbatch", **settings)
        assert self.vllm.use_v2_model_runner == self.ours.use_v2_model_runner != model_runner_v1
        assert type(self.ours).__module__ == "ironbatch.vllm.scheduler", type(self.ours)
        # Steps scheduled, not yet updated: (vLLM's output, ours, rows that sample).
        self.in_flight: deque[tuple[SchedulerOutput, SchedulerOutput, list[str]]] = deque()
        self.made: dict[str, tuple[Request, Request]] = {}  # each request, as each side got it
        self.events: Counter = Counter()

    # -- inputs -----------------------------------------------------------------

    def add(self, rid: str, prompt: list[int], **kw: Any) -> None:
        pair = tuple(vllm_setup.make_request(rid, prompt, block_size=self.bs, **kw) for _ in "ab")
        self.made[rid] = pair
        self.vllm.add_request(pair[0])
        self.ours.add_request(pair[1])
        self.check_requests()

    def abort(self, rids: list[str]) -> None:
        a = self.vllm.finish_requests(rids, RequestStatus.FINISHED_ABORTED)
        b = self.ours.finish_requests(rids, RequestStatus.FINISHED_ABORTED)
        assert [r.request_id for r in a] == [r.request_id for r in b]
        for ra, rb in zip(a, b, strict=True):  # finished requests are brought up to date
            assert request_view(ra) == request_view(rb)
        self.events["aborted"] += len(a)
        self.check_requests()

    def reset_prefix_cache(self, reset_running_requests: bool) -> None:
        a = self.vllm.reset_prefix_cache(reset_running_requests)
        b = self.ours.reset_prefix_cache(reset_running_requests)
        assert a == b
        self.events["reset"] += 1
        self.check_requests()

    def set_pause_state(self, state: PauseState) -> None:
        self.vllm.set_pause_state(state)
        self.ours.set_pause_state(state)
        assert self.vllm.pause_state == self.ours.pause_state == state
        self.events["paused"] += state != PauseState.UNPAUSED
        self.check_requests()

    # -- steps --------------------------------------------------------------------

    def schedule(self) -> None:
        a, b = self.vllm.schedule(), self.ours.schedule()
        assert scheduler_output_view(a) == scheduler_output_view(b)
        # vLLM's runner samples for every scheduled request past its prefill.
        sampling = [
            rid for rid in a.num_scheduled_tokens if not self.vllm.requests[rid].is_prefill_chunk
        ]
        self.in_flight.append((a, b, sampling))
        self.events["steps"] += 1
        self.events["preempted"] += len(a.preempted_req_ids or ())
        self.events["prefix_hits"] += sum(1 for d in a.scheduled_new_reqs if d.num_computed_tokens)
        self.events["skip_reading"] += sum(
            1 for d in a.scheduled_new_reqs if self.made[d.req_id][0].skip_reading_prefix_cache
        )
        self.events["skipped"] += len(self.vllm.deferred_waiting)
        self.events["placeholders"] += sum(
            1 for r in self.vllm.requests.values() if r.num_output_placeholders > 1
        )
        self.check_requests()

    def update_oldest(self, choose: Any) -> None:
        """Apply the oldest step in flight; ``choose()`` gives each sampled token."""
        a, b, sampling = self.in_flight.popleft()
        runner_order = list(a.num_scheduled_tokens)
        self.rng.shuffle(runner_order)  # a persistent batch has its own row order
        tokens = {rid: [choose()] for rid in sampling}
        mro = ModelRunnerOutput(
            req_ids=runner_order,
            req_id_to_index={rid: i for i, rid in enumerate(runner_order)},
            sampled_token_ids=[tokens.get(rid, []) for rid in runner_order],
        )
        oa = self.vllm.update_from_output(a, mro)
        ob = self.ours.update_from_output(b, mro)
        va, vb = engine_outputs_view(oa), engine_outputs_view(ob)
        assert va == vb
        for eco in oa.values():
            for o in eco.outputs:
                if o.finish_reason is not None:
                    self.events["finished"] += 1
                    self.events["repetition"] += o.finish_reason == FinishReason.REPETITION
                    ra, rb = self.made[o.request_id]
                    assert request_view(ra) == request_view(rb), o.request_id
                r = self.vllm.requests.get(o.request_id)
                # Output of a step that ran before the request was preempted.
                self.events["stale"] += r is not None and r.status == RequestStatus.PREEMPTED
        self.check_requests()

    # -- state ---------------------------------------------------------------------

    def check_requests(self) -> None:
        a, b = self.vllm, self.ours
        assert list(a.requests) == list(b.requests)
        for rid, r in a.requests.items():
            assert request_view(r) == core_view(b, b.requests[rid]), rid
        assert a.get_request_counts() == b.get_request_counts()
        assert a.get_num_unfinished_requests() == b.get_num_unfinished_requests()
        assert a.has_finished_requests() == b.has_finished_requests()
        assert a.has_requests() == b.has_requests()
        assert a.get_kv_cache_usage() == b.get_kv_cache_usage()
