"""The object floor: what any scheduler behind vLLM's interface must build
per step, whatever it decides and however fast it decides it.

vLLM's engine reads a fresh ``SchedulerOutput`` from each ``schedule()``
(its ``NewRequestData`` and ``CachedRequestData`` inside) and a fresh
``EngineCoreOutputs`` per client from each ``update_from_output()`` (an
``EngineCoreOutput`` per request that got tokens, ``SchedulerStats`` when
stats are on). The floor lane makes exactly those objects, and nothing
else, from the ones vLLM's own scheduler returned for the same trace in an
earlier, untimed pass: it decides nothing. It builds them the cheapest way
we know in Python (an instance's ``__dict__`` made by one C-level dict
merge, as the drop-in's Rust does; msgspec's ``structs.replace``), and it
reads what goes into them from memory, as a scheduler reads its own state.
Its time per step, in lockstep with the other lanes, is an estimate of the
least a drop-in can cost; vLLM's time over it, of the best ratio a drop-in
can show (benches/RESULTS.md, "The object floor").

Imports vLLM, like ``vllm_driver``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from msgspec.structs import replace as replace_struct

from ironbatch.bench.azure_trace import TraceRequest
from ironbatch.bench.lockstep import Lane, replay, vllm_decisions, vllm_lane
from ironbatch.bench.trace_workload import Deployment

_new = object.__new__


@dataclass
class Recording:
    """vLLM's scheduler's objects for one replay, in the order made: each
    ``schedule()``'s SchedulerOutput, each ``update_from_output()``'s
    outputs by client, and its unfinished requests after each step."""

    async_scheduling: bool
    outputs: list[Any] = field(default_factory=list)
    updates: list[dict[int, Any]] = field(default_factory=list)
    unfinished: list[int] = field(default_factory=list)


class _Recorder:
    """A vLLM driver whose objects are kept (``Driver`` in lockstep.py)."""

    name = "vLLM, recorded"

    def __init__(self, driver: Any, recording: Recording) -> None:
        self.driver = driver
        self.recording = recording
        self.async_scheduling = driver.async_scheduling
        self.pending: tuple[Any, Any] | None = None
        self.sched = self  # the lane asks its driver's sched for the unfinished

    def add(self, request: Any) -> None:
        self.driver.add(request)

    def schedule(self) -> Any:
        so = self.driver.schedule()
        self.recording.outputs.append(so)
        return so

    def run_model(self, out: Any) -> Any:
        return self.driver.run_model(out)

    def update(self, out: Any, result: Any) -> None:
        # vLLM's scheduler itself, not the driver's update, which drops the
        # outputs; a replay's deployment has no drafts for it to hand over.
        self.recording.updates.append(self.driver.sched.update_from_output(out, result))

    def get_num_unfinished_requests(self) -> int:
        n = int(self.driver.sched.get_num_unfinished_requests())
        self.recording.unfinished.append(n)
        return n


def record(
    rows: Sequence[TraceRequest],
    *,
    deployment: Deployment,
    async_scheduling: bool,
    step_ms: float,
    rate_scale: float,
    max_steps: int | None,
) -> Recording:
    """Replay ``rows`` through vLLM's scheduler alone, keeping its objects."""
    vllm = vllm_lane(deployment, kind="vllm", async_scheduling=async_scheduling)
    rec = Recording(async_scheduling)
    lane = Lane(vllm.name, _Recorder(vllm.driver, rec), vllm_decisions, "vllm")
    replay(
        [lane],
        rows,
        deployment=deployment,
        step_ms=step_ms,
        rate_scale=rate_scale,
        max_steps=max_steps,
    )
    return rec


def _instance(cls: type, fields: dict[str, Any]) -> Any:
    obj: Any = _new(cls)
    obj.__dict__ = fields
    return obj


def _tables(block_ids: tuple[list[int], ...]) -> tuple[list[int], ...]:
    return tuple([list(ids) for ids in block_ids])


def build_scheduler_output(so: Any) -> Any:
    """A fresh SchedulerOutput equal to ``so``: every container new, the
    requests' own objects (ids, prompts, sampling params) shared, as a
    scheduler shares them with its requests."""
    new_reqs = [
        _instance(type(d), {**d.__dict__, "block_ids": _tables(d.block_ids)})
        for d in so.scheduled_new_reqs
    ]
    c = so.scheduled_cached_reqs
    cached = _instance(
        type(c),
        {
            **c.__dict__,
            "req_ids": list(c.req_ids),
            "resumed_req_ids": set(c.resumed_req_ids),
            "new_token_ids": list(c.new_token_ids),
            "all_token_ids": dict(c.all_token_ids),
            "new_block_ids": [None if b is None else _tables(b) for b in c.new_block_ids],
            "num_computed_tokens": list(c.num_computed_tokens),
            "num_output_tokens": list(c.num_output_tokens),
        },
    )
    preempted = so.preempted_req_ids
    return _instance(
        type(so),
        {
            **so.__dict__,
            "scheduled_new_reqs": new_reqs,
            "scheduled_cached_reqs": cached,
            "num_scheduled_tokens": dict(so.num_scheduled_tokens),
            "scheduled_spec_decode_tokens": dict(so.scheduled_spec_decode_tokens),
            "scheduled_encoder_inputs": dict(so.scheduled_encoder_inputs),
            "finished_req_ids": set(so.finished_req_ids),
            "free_encoder_mm_hashes": list(so.free_encoder_mm_hashes),
            "encoder_input_updates": dict(so.encoder_input_updates),
            "preempted_req_ids": None if preempted is None else set(preempted),
            "num_common_prefix_blocks": list(so.num_common_prefix_blocks),
        },
    )


def _engine_core_output(o: Any) -> Any:
    if o.events is None and o.prefill_stats is None and o.finish_reason is None:
        return replace_struct(o, new_token_ids=list(o.new_token_ids))  # a decode's: the usual
    stats = o.prefill_stats
    return replace_struct(
        o,
        new_token_ids=list(o.new_token_ids),
        events=None if o.events is None else [replace_struct(e) for e in o.events],
        prefill_stats=None if stats is None else _instance(type(stats), dict(stats.__dict__)),
    )


def _scheduler_stats(s: Any) -> Any:
    if s is None:
        return None
    p = s.prefix_cache_stats
    return _instance(
        type(s),
        {
            **s.__dict__,
            "prefix_cache_stats": None if p is None else _instance(type(p), dict(p.__dict__)),
        },
    )


def build_engine_core_outputs(outputs: dict[int, Any]) -> dict[int, Any]:
    """Fresh EngineCoreOutputs by client, equal to ``outputs``."""
    return {
        client: replace_struct(
            eco,
            outputs=[_engine_core_output(o) for o in eco.outputs],
            scheduler_stats=_scheduler_stats(eco.scheduler_stats),
            finished_requests=None if eco.finished_requests is None else set(eco.finished_requests),
        )
        for client, eco in outputs.items()
    }


class FloorDriver:
    """A lockstep driver that replays a Recording's objects, built afresh
    (``Driver`` in lockstep.py)."""

    name = "floor"
    pending: tuple[Any, Any] | None = None

    def __init__(self, recording: Recording) -> None:
        self.async_scheduling = recording.async_scheduling
        self.recording = recording
        self.sched = self  # the lane asks its driver's sched for the unfinished
        self.scheduled = 0
        self.updated = 0
        self.stepped = 0

    def add(self, request: Any) -> None:
        pass  # the recording has the scheduler's requests already

    def schedule(self) -> Any:
        so = build_scheduler_output(self.recording.outputs[self.scheduled])
        self.scheduled += 1
        return so

    def run_model(self, out: Any) -> None:
        return None

    def update(self, out: Any, result: Any) -> None:
        # Dropped at once, as the drop-in's lane drops what its update returns.
        build_engine_core_outputs(self.recording.updates[self.updated])
        self.updated += 1

    def get_num_unfinished_requests(self) -> int:
        n = self.recording.unfinished[self.stepped]
        self.stepped += 1
        return n


def floor_lane(recording: Recording) -> Lane:
    """The object floor as a lockstep lane, in the recording's scheduling
    mode; replay it over the recording's trace, or it runs out of steps."""
    return Lane("floor", FloorDriver(recording), vllm_decisions, "vllm")
