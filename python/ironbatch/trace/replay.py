"""Replay an ironbatch-trace/1 file through a scheduler and report the first
difference from the recorded decisions, or that there is none."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ironbatch.config import CacheConfig, SchedulerConfig
from ironbatch.request import Request
from ironbatch.sampling_params import SamplingParams
from ironbatch.scheduler import Scheduler

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


def load(path: str | Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    lines = Path(path).read_text().splitlines()
    header = json.loads(lines[0])
    if header.get("format") != FORMAT:
        raise ValueError(f"{path}: not an {FORMAT} trace (format = {header.get('format')!r})")
    return header, [json.loads(line) for line in lines[1:] if line.strip()]


def build_scheduler(config: dict[str, Any], backend: str) -> Scheduler:
    return Scheduler(
        SchedulerConfig(
            max_model_len=config["max_model_len"],
            max_num_seqs=config["max_num_seqs"],
            max_num_batched_tokens=config["max_num_batched_tokens"],
            enable_chunked_prefill=config["enable_chunked_prefill"],
            long_prefill_token_threshold=config["long_prefill_token_threshold"],
            policy=config["policy"],
        ),
        CacheConfig(
            num_blocks=config["num_blocks"],
            block_size=config["block_size"],
            enable_prefix_caching=config["enable_prefix_caching"],
        ),
        backend=backend,
    )


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
    header, steps = load(path)
    sched = build_scheduler(header["config"], backend)
    blocks = level == "blocks"
    for n, rec in enumerate(steps, 1):
        step = rec["step"]

        def differs(
            field: str, expected: Any, actual: Any, n: int = n, step: int = step
        ) -> ReplayResult:
            return ReplayResult(str(path), n, step, field, expected, actual)

        for d in rec["add"]:
            sched.add_request(trace_request(d))
        for rid in rec["abort"]:
            sched.finish_requests([rid])
        out = sched.schedule()
        want = rec["schedule"]
        got = [list(e) for e in out.entries()]
        expected = want["scheduled"]
        if not blocks:
            got = [e[:4] for e in got]
            expected = [e[:4] for e in expected]
        if got != expected:
            return differs("scheduled", expected, got)
        if sorted(out.preempted_req_ids) != want["preempted"]:
            return differs("preempted", want["preempted"], sorted(out.preempted_req_ids))
        if sorted(out.finished_req_ids) != want["finished"]:
            return differs("finished", want["finished"], sorted(out.finished_req_ids))
        updates = sched.update_from_output(out, {rid: toks for rid, toks in rec["sampled"]})
        got_outputs = [
            [u.request_id, u.new_token_ids, u.finish_reason, u.stop_reason] for u in updates
        ]
        if got_outputs != rec["outputs"]:
            return differs("outputs", rec["outputs"], got_outputs)
        if blocks and sched.num_free_blocks != rec["num_free_blocks"]:
            return differs("num_free_blocks", rec["num_free_blocks"], sched.num_free_blocks)
    return ReplayResult(str(path), len(steps))
