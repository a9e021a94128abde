"""Build and drive vLLM's own V1 Scheduler, and the drop-in
``ironbatch.vllm.Scheduler``, on the CPU from a local model config (no
weights, no network): the reference for benches/compare_vllm.py and
benches/record_vllm.py. Needs a Python environment with vLLM installed (see
the README); ironbatch itself never imports vLLM outside ``ironbatch.vllm``."""

from __future__ import annotations

import os
import time
from typing import Any

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

import numpy as np  # noqa: E402
import vllm  # noqa: E402
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request  # noqa: E402

from ironbatch.vllm import harness  # noqa: E402

VERSION = vllm.__version__
TRACE_SETTINGS = (
    "max_num_seqs",
    "max_num_batched_tokens",
    "max_model_len",
    "enable_chunked_prefill",
    "long_prefill_token_threshold",
    "policy",
    "block_size",
    "num_blocks",
    "enable_prefix_caching",
)


def build(cfg: dict[str, Any], kind: str = "vllm", async_scheduling: bool = False) -> Any:
    """vLLM's scheduler (``kind="vllm"``) or the drop-in (``"ironbatch"``)
    for an ironbatch-trace/1 style config dict."""
    settings = {k: cfg[k] for k in TRACE_SETTINGS}
    return harness.make_scheduler(kind, async_scheduling=async_scheduling, **settings)


def request(d: dict[str, Any], block_size: int) -> Request:
    """vLLM's Request for an ironbatch-trace/1 request object."""
    return harness.make_request(
        d["request_id"],
        d["prompt_token_ids"],
        d["max_tokens"],
        block_size=block_size,
        min_tokens=d.get("min_tokens", 0),
        ignore_eos=d.get("ignore_eos", False),
        stop_token_ids=list(d.get("stop_token_ids", [])),
        arrival_time=d.get("arrival_time", 0.0),
        priority=d.get("priority", 0),
    )


class RunnerEmulator:
    """The model runner's part, as a real one does it: it learns each
    request's tokens from the SchedulerOutputs (not from the scheduler's
    Request objects) and samples ``token`` for every request whose step
    reaches its last known token."""

    def __init__(self, token: int) -> None:
        self.token = token
        self.num_tokens: dict[str, int] = {}

    def output(self, so: Any) -> ModelRunnerOutput:
        for rid in so.finished_req_ids:
            self.num_tokens.pop(rid, None)
        computed: dict[str, int] = {}
        for d in so.scheduled_new_reqs:
            tokens = d.prefill_token_ids if d.prefill_token_ids is not None else d.prompt_token_ids
            self.num_tokens[d.req_id] = len(tokens)
            computed[d.req_id] = d.num_computed_tokens
        cached = so.scheduled_cached_reqs
        for rid, tokens in cached.all_token_ids.items():
            self.num_tokens[rid] = len(tokens)
        computed.update(zip(cached.req_ids, cached.num_computed_tokens, strict=True))
        ids = list(so.num_scheduled_tokens)
        sampled = []
        for rid in ids:
            if computed[rid] + so.num_scheduled_tokens[rid] >= self.num_tokens[rid]:
                sampled.append([self.token])
                self.num_tokens[rid] += 1
            else:
                sampled.append([])
        return ModelRunnerOutput(
            req_ids=ids,
            req_id_to_index={r: i for i, r in enumerate(ids)},
            sampled_token_ids=sampled,
        )


class VllmDriver:
    """A vLLM-interface scheduler as an ``ironbatch.bench`` driver: vLLM's
    own (``kind="vllm"``) or the drop-in (``"ironbatch"``), both fed vLLM
    Requests and ModelRunnerOutputs and both returning vLLM's objects."""

    def __init__(self, workload: Any, kind: str = "vllm", async_scheduling: bool = False) -> None:
        self.name = f"vllm-{VERSION}" if kind == "vllm" else "drop-in"
        self.async_scheduling = async_scheduling
        self.pending: tuple[Any, ModelRunnerOutput] | None = None  # async: the step in flight
        self.bs = workload.block_size
        self.sched = build(
            {
                "max_num_seqs": workload.max_num_seqs,
                "max_num_batched_tokens": workload.max_num_batched_tokens,
                "max_model_len": workload.max_model_len,
                "enable_chunked_prefill": True,
                "long_prefill_token_threshold": 0,
                "policy": "fcfs",
                "block_size": workload.block_size,
                "num_blocks": workload.num_blocks,
                "enable_prefix_caching": True,
            },
            kind,
            async_scheduling,
        )
        self.runner = RunnerEmulator(5)
        self.last_prefill_rows = -1

    def add(self, r: Any) -> None:
        p = r.sampling_params
        self.sched.add_request(
            request(
                {
                    "request_id": r.request_id,
                    "prompt_token_ids": r.prompt_token_ids,
                    "max_tokens": p.max_tokens,
                    "min_tokens": p.min_tokens,
                    "ignore_eos": p.ignore_eos,
                    "stop_token_ids": p.stop_token_ids,
                    "arrival_time": r.arrival_time,
                    "priority": r.priority,
                },
                self.bs,
            )
        )

    def step(self) -> float:
        t0 = time.perf_counter()
        so = self.sched.schedule()
        t1 = time.perf_counter()
        mro = self.runner.output(so)  # the model runner's part
        self.last_prefill_rows = int(
            np.count_nonzero(np.fromiter(so.num_scheduled_tokens.values(), dtype=np.int64) > 1)
        )
        if self.async_scheduling:  # as vLLM's engine does: this step's output arrives next time
            (so, mro), self.pending = self.pending or (None, None), (so, mro)
        t2 = time.perf_counter()
        if so is not None:
            self.sched.update_from_output(so, mro)
        t3 = time.perf_counter()
        return (t1 - t0) + (t3 - t2)

    def is_steady(self) -> bool:
        return self.last_prefill_rows == 0
