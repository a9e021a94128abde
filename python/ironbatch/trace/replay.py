"""Replay an ironbatch-trace/1 file through a scheduler and report the first
difference from the recorded decisions, or that there is none."""

from __future__ import annotations

import gzip
import io
import json
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ironbatch.config import CacheConfig, KVCacheGroup, SchedulerConfig
from ironbatch.request import Request
from ironbatch.sampling_params import SamplingParams
from ironbatch.scheduler import Scheduler
from ironbatch.scheduler_output import SchedulerOutput
from ironbatch.trace.speculation import (
    SPEC_STATS,
    SPEC_TOKENS,
    scheduled_spec_tokens,
    stats_record,
    step_drafts,
)

LEVELS = ("decisions", "blocks")
FORMAT = "ironbatch-trace/1"


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

    def __str__(self) -> str:
        if self.identical:
            return f"{self.path}: identical ({self.steps} steps)"
        return (
            f"{self.path}: step {self.step}: {self.field} differs\n"
            f"  recorded: {self.expected}\n  replayed: {self.actual}"
        )


@contextmanager
def open_trace(path: str | Path) -> Iterator[tuple[dict[str, Any], Iterator[dict[str, Any]]]]:
    """A trace's header and its step records, read one line at a time, so
    memory does not grow with the number of steps. ``path`` is a ``.jsonl``
    file, a gzip-compressed ``.jsonl.gz`` one, or ``-`` for standard input."""
    with _open_text(path) as f:
        first = f.readline()
        if not first.strip():
            raise ValueError(f"{path}: empty file, not an {FORMAT} trace")
        header = json.loads(first)
        if not isinstance(header, dict) or header.get("format") != FORMAT:
            found = header.get("format") if isinstance(header, dict) else None
            raise ValueError(f"{path}: not an {FORMAT} trace (format = {found!r})")
        yield header, (json.loads(line) for line in f if line.strip())


@contextmanager
def _open_text(path: str | Path) -> Iterator[IO[str]]:
    """Text lines from a file or standard input, gunzipped when the bytes
    start with gzip's magic (whatever the name says)."""
    with ExitStack() as stack:
        if str(path) == "-":
            raw: IO[bytes] = sys.stdin.buffer
        else:
            raw = stack.enter_context(open(path, "rb"))
        buffered = raw if isinstance(raw, io.BufferedReader) else io.BufferedReader(raw)  # type: ignore[arg-type]
        if buffered.peek(2)[:2] == b"\x1f\x8b":
            yield stack.enter_context(gzip.open(buffered, "rt", encoding="utf-8"))
        else:
            text = io.TextIOWrapper(buffered, encoding="utf-8")
            try:
                yield text
            finally:
                text.detach()  # the file (or stdin) stays its owner's to close


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
        ),
        CacheConfig(
            num_blocks=config["num_blocks"],
            block_size=config["block_size"],
            enable_prefix_caching=config["enable_prefix_caching"],
            # Optional (the growth rule): without them, one full-attention
            # group; sparse window caching is vLLM's default.
            kv_cache_groups=kv_cache_groups(config),
            sparse_retention=config.get("sparse_retention", True),
        ),
        backend=backend,
    )


def kv_cache_groups(config: dict[str, Any]) -> tuple[KVCacheGroup, ...] | None:
    """The config's ``kv_cache_groups`` as the scheduler takes them; None
    (one full-attention group) when the key is missing. Keys a group object
    does not define are ignored, as everywhere in the format."""
    groups = config.get("kv_cache_groups")
    if groups is None:
        return None
    if not isinstance(groups, list):
        raise TypeError(f"kv_cache_groups must be a list, got {type(groups).__name__}")
    out = []
    for i, g in enumerate(groups):
        if not isinstance(g, dict):
            raise TypeError(f"kv_cache_groups[{i}] must be an object, got {type(g).__name__}")
        out.append(
            KVCacheGroup(
                kind=g["kind"],
                size=g.get("size", 0),
                admission_cap_blocks=g.get("admission_cap_blocks"),
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
    )


def replay(path: str | Path, backend: str = "rust", level: str = "blocks") -> ReplayResult:
    """Replay one trace; ``level`` "blocks" also compares block ids and free
    counts, "decisions" only what was scheduled, preempted and output."""
    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
    with open_trace(path) as (header, steps):
        return _replay_steps(str(path), header, steps, backend, level == "blocks")


def _replay_steps(
    path: str, header: dict[str, Any], steps: Iterator[dict[str, Any]], backend: str, blocks: bool
) -> ReplayResult:
    sched = build_scheduler(header["config"], backend)
    n = 0
    for n, rec in enumerate(steps, 1):
        step = rec["step"]

        def differs(
            field: str, expected: Any, actual: Any, n: int = n, step: int = step
        ) -> ReplayResult:
            return ReplayResult(path, n, step, field, expected, actual)

        # Drafts first: vLLM's engine hands them over right after the
        # previous step's output, before it takes in new requests.
        if drafts := step_drafts(rec):
            sched.update_draft_token_ids(drafts)
        for d in rec["add"]:
            sched.add_request(trace_request(d))
        for rid in rec["abort"]:
            sched.finish_requests([rid])
        out = sched.schedule()
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
        updates = sched.update_from_output(out, {rid: toks for rid, toks in rec["sampled"]})
        got_outputs = [
            [u.request_id, u.new_token_ids, u.finish_reason, u.stop_reason] for u in updates
        ]
        if got_outputs != rec["outputs"]:
            return differs("outputs", rec["outputs"], got_outputs)
        if (
            SPEC_STATS in rec
            and (stats := stats_record(updates.spec_decoding_stats)) != rec[SPEC_STATS]
        ):
            return differs(SPEC_STATS, rec[SPEC_STATS], stats)
        if blocks and sched.num_free_blocks != rec["num_free_blocks"]:
            return differs("num_free_blocks", rec["num_free_blocks"], sched.num_free_blocks)
    return ReplayResult(path, n)
