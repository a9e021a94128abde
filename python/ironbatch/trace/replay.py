"""Replay an ironbatch-trace/1 file through a scheduler and report the first
difference from the recorded decisions, or that there is none."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ironbatch.config import CacheConfig, KVCacheGroup, SchedulerConfig
from ironbatch.lora import LoRARequest
from ironbatch.multimodal import MultimodalInput
from ironbatch.request import Request
from ironbatch.sampling_params import SamplingParams
from ironbatch.scheduler import Scheduler
from ironbatch.scheduler_backends import EndOrder
from ironbatch.scheduler_output import SchedulerOutput
from ironbatch.trace.connector import (
    CALLS,
    REPORT,
    TraceConnector,
    TraceReport,
    check_calls,
    load_failure_policy,
)
from ironbatch.trace.reading import Trace, field_error
from ironbatch.trace.speculation import (
    SPEC_STATS,
    SPEC_TOKENS,
    scheduled_spec_tokens,
    stats_record,
    step_drafts,
)

LEVELS = ("decisions", "blocks")
BACKENDS = ("rust", "python")


@dataclass
class ReplayResult:
    path: str
    steps: int  # steps replayed (up to and including a difference)
    step: int | None = None  # the step that differs, if any
    field: str | None = None
    expected: Any = None
    actual: Any = None

    @property
    def identical(self) -> bool:
        return self.field is None

    def as_dict(self) -> dict[str, Any]:
        """For ``--json``: the fields, and whether the replay was identical."""
        d: dict[str, Any] = {"path": self.path, "identical": self.identical, "steps": self.steps}
        if not self.identical:
            d |= {"step": self.step, "field": self.field}
            d |= {"recorded": self.expected, "replayed": self.actual}
        return d

    def __str__(self) -> str:
        if self.identical:
            return f"{self.path}: identical ({self.steps} steps)"
        return (
            f"{self.path}: step {self.step}: {self.field} differs\n"
            f"  recorded: {self.expected}\n  replayed: {self.actual}"
        )


# In an image trace's "schedule": the images each request encodes, and the
# encoder-cache entries evicted since the previous step.
ENCODER_INPUTS = "encoder_inputs"
FREED_IMAGES = "free_encoder_mm_hashes"


def build_scheduler(config: dict[str, Any], backend: str) -> Scheduler:
    return Scheduler(
        SchedulerConfig(
            max_model_len=config["max_model_len"],
            max_num_seqs=config["max_num_seqs"],
            max_num_batched_tokens=config["max_num_batched_tokens"],
            enable_chunked_prefill=config["enable_chunked_prefill"],
            long_prefill_token_threshold=config["long_prefill_token_threshold"],
            policy=config["policy"],
            # Optional (the growth rule): traces without it do not speculate.
            num_speculative_tokens=config.get("num_speculative_tokens", 0),
            # Optional too: what a drafter with a forward pass of its own
            # (EAGLE, MTP, a draft model) adds; n-gram traces leave them out.
            num_lookahead_tokens=config.get("num_lookahead_tokens", 0),
            num_hash_lookahead_tokens=config.get("num_hash_lookahead_tokens", 0),
            num_draft_slots=config.get("num_draft_slots", 0),
            # Optional: only LoRA traces cap adapters.
            max_loras=config.get("max_loras"),
            # Optional: only image traces have an encoder.
            encoder_compute_budget=config.get("encoder_compute_budget"),
            encoder_cache_size=config.get("encoder_cache_size"),
            disable_chunked_mm_input=config.get("disable_chunked_mm_input", False),
        ),
        CacheConfig(
            num_blocks=config["num_blocks"],
            block_size=config["block_size"],
            enable_prefix_caching=config["enable_prefix_caching"],
            # Optional (the growth rule): without them, one full-attention
            # group; sparse window caching is vLLM's default.
            kv_cache_groups=kv_cache_groups(config),
            sparse_retention=config.get("sparse_retention", True),
            retention_interval=config.get("retention_interval", 0),
        ),
        backend=backend,
    )


def kv_cache_groups(config: dict[str, Any]) -> tuple[KVCacheGroup, ...] | None:
    """The config's ``kv_cache_groups`` as the scheduler takes them; None
    (one full-attention group) when the key is missing. Keys a group object
    does not define are ignored, as everywhere in the format."""
    groups = objects("kv_cache_groups", config.get("kv_cache_groups"))
    if groups is None:
        return None
    out = []
    for g in groups:
        out.append(
            KVCacheGroup(
                kind=g["kind"],
                size=g.get("size", 0),
                admission_cap_blocks=g.get("admission_cap_blocks"),
                speculative_blocks=g.get("speculative_blocks", 0),
                prefill_checkpoint_alignment=g.get("prefill_checkpoint_alignment"),
            )
        )
    return tuple(out)


def scheduled_entries(out: SchedulerOutput) -> list[list[Any]]:
    """``schedule.scheduled`` for a step: ``[request_id, num_tokens, kind,
    num_computed_tokens, block_ids]`` per row. ``block_ids`` is a list of
    ints with one KV-cache group; with several, one list per group in group
    order, read from the per-group offsets."""
    num_groups = out.num_kv_cache_groups
    if num_groups == 1:
        return [list(e) for e in out.entries()]
    ids = out.new_block_ids.tolist()
    offsets = out.new_block_offsets.tolist()
    rows: list[list[Any]] = []
    for i, e in enumerate(out.entries()):
        k = i * num_groups
        per_group = [ids[offsets[k + g] : offsets[k + g + 1]] for g in range(num_groups)]
        rows.append([e.request_id, e.num_tokens, e.kind, e.num_computed_tokens, per_group])
    return rows


def trace_request(d: dict[str, Any]) -> Request:
    return Request(
        d["request_id"],
        d["prompt_token_ids"],
        SamplingParams(
            max_tokens=d["max_tokens"],
            min_tokens=d.get("min_tokens", 0),
            ignore_eos=d.get("ignore_eos", False),
            stop_token_ids=d.get("stop_token_ids", []),
        ),
        eos_token_id=d.get("eos_token_id"),
        priority=d.get("priority", 0),
        arrival_time=d.get("arrival_time", 0.0),
        cache_salt=d.get("cache_salt"),
        lora_request=lora_request(d.get("lora_request")),
        mm_features=mm_features(d.get("mm_features")),
    )


def objects(name: str, value: Any) -> list[dict[str, Any]] | None:
    """``value`` checked as a list of objects (null: None), its items named
    ``name[i]`` in the error."""
    if value is None:
        return None
    if not isinstance(value, list):
        raise TypeError(f"{name} must be a list or null, got {type(value).__name__}")
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise TypeError(f"{name}[{i}] must be an object, got {type(item).__name__}")
    return value


def mm_features(items: Any) -> list[MultimodalInput] | None:
    """A request object's ``mm_features`` (a list of objects with
    ``offset``, ``length``, ``identifier`` and optional ``is_embed``, or
    null) as the scheduler takes them."""
    features = objects("mm_features", items)
    if features is None:
        return None
    out = []
    for i, m in enumerate(features):
        missing = [k for k in ("offset", "length", "identifier") if k not in m]
        if missing:
            raise KeyError(f"mm_features[{i}] needs {', '.join(missing)}")
        out.append(MultimodalInput(m["offset"], m["length"], m["identifier"], m.get("is_embed")))
    return out


def lora_request(d: Any) -> LoRARequest | None:
    """A request object's ``lora_request`` (an object with vLLM's field
    names, or null) as the scheduler takes it."""
    if d is None:
        return None
    if not isinstance(d, dict):
        raise TypeError(f"lora_request must be an object or null, got {type(d).__name__}")
    missing = [k for k in ("lora_int_id", "lora_name") if k not in d]
    if missing:
        raise KeyError(f"lora_request needs {', '.join(missing)}")
    return LoRARequest(d["lora_name"], d["lora_int_id"], d.get("lora_path", ""))


def recorded_end_order(outputs: list[list[Any]]) -> EndOrder:
    """The order a step's record ends its failed loads in (its error
    outputs'; vLLM ends them in a set's order, which only the record
    keeps). Where the record names other requests than those that failed,
    the scheduler's own order (the replay then differs at ``outputs``)."""
    recorded = [o[0] for o in outputs if o[2] == "error"]

    def end_order(
        whole: list[str], loading: list[str], running: list[str], requested: list[str]
    ) -> list[str]:
        found = list(dict.fromkeys([*whole, *loading, *running, *requested]))
        return recorded if sorted(recorded) == sorted(found) else found

    return end_order


def replay(
    trace: str | Path | Trace,
    backend: str = "rust",
    level: str = "blocks",
    on_step: Callable[[], None] | None = None,
) -> ReplayResult:
    """Replay one trace (a path, ``-`` for standard input, or a ``Trace``
    already opened, which this closes); ``level`` "blocks" also compares
    block ids and free counts, "decisions" only what was scheduled,
    preempted and output. ``on_step`` is called after each step replayed (a
    progress bar). A file that cannot be replayed raises ``TraceError`` (a
    ValueError) naming the file and the line."""
    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    opened = trace if isinstance(trace, Trace) else Trace(trace)
    with closing(opened):
        built = trace_scheduler(opened, backend)
        return _replay_steps(opened, built.scheduler, built.connector, level == "blocks", on_step)


@dataclass(frozen=True)
class TraceScheduler:
    """What a trace is replayed through: the scheduler its config
    describes, and the connector answering from the record where the
    config has one (§3.7)."""

    scheduler: Scheduler
    connector: TraceConnector | None


def trace_scheduler(trace: Trace, backend: str) -> TraceScheduler:
    """The scheduler (and connector) the header's config describes; a config
    it cannot take is the header line's ``TraceError``."""
    try:
        config = trace.header["config"]
        sched = build_scheduler(config, backend)
        policy = load_failure_policy(config)
        connector = None
        if policy is not None:
            connector = TraceConnector()
            sched.set_kv_connector(connector, policy)
        return TraceScheduler(sched, connector)
    except (KeyError, TypeError, ValueError, OverflowError) as e:
        raise field_error(trace.path, trace.header_line, e, "the header's config") from None


def _replay_steps(
    trace: Trace,
    sched: Scheduler,
    connector: TraceConnector | None,
    blocks: bool,
    on_step: Callable[[], None] | None,
) -> ReplayResult:
    n = 0
    for n, (line, rec) in enumerate(trace.steps, 1):
        try:
            result = _replay_step(trace.path, n, sched, connector, rec, blocks)
        # What a record of the wrong shape raises (OverflowError: a count the
        # core's integers cannot hold).
        except (KeyError, TypeError, ValueError, IndexError, OverflowError) as e:
            raise field_error(trace.path, line, e) from None
        if result is not None:
            return result
        if on_step is not None:
            on_step()
    return ReplayResult(trace.path, n)


def _replay_step(
    path: str,
    n: int,
    sched: Scheduler,
    connector: TraceConnector | None,
    rec: dict[str, Any],
    blocks: bool,
) -> ReplayResult | None:
    """One step record: the difference it shows, or None."""
    step = rec["step"]

    def differs(field: str, expected: Any, actual: Any) -> ReplayResult:
        return ReplayResult(path, n, step, field, expected, actual)

    report = None
    if connector is not None:
        connector.begin_step(check_calls(rec.get(CALLS, [])))
        report = TraceReport.of(rec.get(REPORT))
    # Drafts first: vLLM's engine hands them over right after the
    # previous step's output, before it takes in new requests.
    if drafts := step_drafts(rec):
        sched.update_draft_token_ids(drafts)
    for d in rec["add"]:
        sched.add_request(trace_request(d))
    for rid in rec["abort"]:
        sched.finish_requests([rid])
    out = sched.schedule()
    # The connector's answers fed the decisions: where its calls part from
    # the record is the first thing to say.
    if connector is not None and (diff := connector.first_difference(complete=False)):
        return differs(*diff)
    want = rec["schedule"]
    got = scheduled_entries(out) if blocks else [list(e)[:4] for e in out.entries()]
    expected = want["scheduled"]
    if not blocks:
        expected = [e[:4] for e in expected]
    if got != expected:
        return differs("scheduled", expected, got)
    if sorted(out.preempted_req_ids) != want["preempted"]:
        return differs("preempted", want["preempted"], sorted(out.preempted_req_ids))
    if sorted(out.finished_req_ids) != want["finished"]:
        return differs("finished", want["finished"], sorted(out.finished_req_ids))
    if SPEC_TOKENS in want and (spec := scheduled_spec_tokens(out)) != want[SPEC_TOKENS]:
        return differs(SPEC_TOKENS, want[SPEC_TOKENS], spec)
    if ENCODER_INPUTS in want:
        encoded = [[rid, ids] for rid, ids in out.scheduled_encoder_inputs.items()]
        if encoded != want[ENCODER_INPUTS]:
            return differs(ENCODER_INPUTS, want[ENCODER_INPUTS], encoded)
        if out.free_encoder_mm_hashes != want[FREED_IMAGES]:
            return differs(FREED_IMAGES, want[FREED_IMAGES], out.free_encoder_mm_hashes)
    sampled = {rid: toks for rid, toks in rec["sampled"]}
    if connector is None:
        updates = sched.update_from_output(out, sampled)
    else:
        updates = sched.update_from_output(
            out,
            sampled,
            kv_connector_output=report,
            end_order=recorded_end_order(rec["outputs"]),
        )
    got_outputs = [[u.request_id, u.new_token_ids, u.finish_reason, u.stop_reason] for u in updates]
    # Requests a failed KV load ended: an error output each, after the
    # others, in the order they ended.
    got_outputs += [[rid, [], "error", None] for rid in updates.errored]
    if got_outputs != rec["outputs"]:
        return differs("outputs", rec["outputs"], got_outputs)
    if connector is not None and (diff := connector.first_difference(complete=True)):
        return differs(*diff)
    if (
        SPEC_STATS in rec
        and (stats := stats_record(updates.spec_decoding_stats)) != rec[SPEC_STATS]
    ):
        return differs(SPEC_STATS, rec[SPEC_STATS], stats)
    if blocks and sched.num_free_blocks != rec["num_free_blocks"]:
        return differs("num_free_blocks", rec["num_free_blocks"], sched.num_free_blocks)
    return None
