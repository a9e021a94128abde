"""Build and drive vLLM's own V1 Scheduler, and the drop-in
``ironbatch.vllm.Scheduler``, on the CPU from a local model config (no
weights, no network): the vLLM side of benches/compare_vllm.py and the
recorder of benches/record_vllm.py. Imports vLLM, so ``ironbatch.bench``
does not import this module; it needs an environment with vLLM installed."""

from __future__ import annotations

import os
from typing import Any

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

from concurrent.futures import Future  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import vllm  # noqa: E402
from vllm.config import KVEventsConfig, KVTransferConfig, LoRAConfig, SpeculativeConfig  # noqa: E402
from vllm.lora.request import LoRARequest as VllmLoRARequest  # noqa: E402
from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange  # noqa: E402
from vllm.sampling_params import StructuredOutputsParams  # noqa: E402
from vllm.v1.outputs import DraftTokenIds, KVConnectorOutput, ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request  # noqa: E402

from ironbatch.bench.scheduler_steps import TimedDriver  # noqa: E402
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


def build(
    cfg: dict[str, Any], kind: str = "vllm", async_scheduling: bool = False, **extras: Any
) -> Any:
    """vLLM's scheduler (``kind="vllm"``) or the drop-in (``"ironbatch"``)
    for an ironbatch-trace/1 style config dict (``extras``: VllmConfig parts
    such as ``kv_events_config``)."""
    settings = {k: cfg[k] for k in TRACE_SETTINGS}
    return harness.make_scheduler(kind, async_scheduling=async_scheduling, **settings, **extras)


JSON_SCHEMA = StructuredOutputsParams(json={"type": "object"})


class AcceptingGrammar:
    """A compiled grammar that takes every token and fills its mask row in
    one call: the schedulers' structured-output work without a grammar
    engine's (which is the same library work under either scheduler)."""

    def accept_tokens(self, request_id: str, tokens: list[int]) -> bool:
        return True

    def validate_tokens(self, tokens: list[int]) -> list[int]:
        return tokens

    def rollback(self, num_tokens: int) -> None:
        pass

    def fill_bitmask(self, bitmask: torch.Tensor, batch_index: int) -> None:
        bitmask[batch_index].fill_(-1)

    def is_terminated(self) -> bool:
        return False

    def reset(self) -> None:
        pass


class MaskBackend:
    """The structured-output manager's backend: only the mask buffer."""

    def allocate_token_bitmask(self, max_num_seqs: int) -> torch.Tensor:
        return torch.zeros((max_num_seqs, 4096), dtype=torch.int32)  # a 128k vocabulary


def vllm_lora(lora: Any) -> VllmLoRARequest:
    """vLLM's LoRARequest for ironbatch's, or for a trace's request object's
    ``lora_request``."""
    if isinstance(lora, dict):
        return VllmLoRARequest(lora["lora_name"], lora["lora_int_id"], lora.get("lora_path", ""))
    return VllmLoRARequest(lora.lora_name, lora.lora_int_id, lora.lora_path)


def request(d: dict[str, Any], block_size: int, hash_lookahead_tokens: int = 0) -> Request:
    """vLLM's Request for an ironbatch-trace/1 request object, its block
    hashes covering ``hash_lookahead_tokens`` after each block (the engine's
    ``vllm_config.num_hash_lookahead_tokens``, as EngineCore builds its
    requests' hasher)."""
    return harness.make_request(
        d["request_id"],
        d["prompt_token_ids"],
        d["max_tokens"],
        block_size=block_size,
        hash_lookahead_tokens=hash_lookahead_tokens,
        min_tokens=d.get("min_tokens", 0),
        ignore_eos=d.get("ignore_eos", False),
        stop_token_ids=list(d.get("stop_token_ids", [])),
        arrival_time=d.get("arrival_time", 0.0),
        priority=d.get("priority", 0),
        structured_outputs=d.get("structured_outputs"),
        lora_request=vllm_lora(d["lora_request"]) if d.get("lora_request") else None,
        mm_features=[vllm_feature(m) for m in d.get("mm_features") or ()],
        **(
            {"extra_args": {"kv_transfer_params": d["kv_transfer_params"]}}
            if d.get("kv_transfer_params")
            else {}
        ),
    )


def vllm_feature(m: Any) -> MultiModalFeatureSpec:
    """vLLM's MultiModalFeatureSpec for an image given by offset, length,
    identifier and optional is_embed (ironbatch's MultimodalInput, or a
    trace's dict of those keys)."""
    get = m.get if isinstance(m, dict) else lambda k, default=None: getattr(m, k, default)
    mask = get("is_embed")
    return MultiModalFeatureSpec(
        data=None,
        modality="image",
        identifier=get("identifier"),
        mm_position=PlaceholderRange(
            offset=get("offset"),
            length=get("length"),
            is_embed=None if mask is None else torch.tensor(list(mask)),
        ),
    )


class RunnerEmulator:
    """The model runner's part, as a real one does it: it learns each
    request's tokens from the SchedulerOutputs (not from the scheduler's
    Request objects) and samples ``token`` for every request whose step
    reaches its last known token."""

    def __init__(self, token: int, num_speculative_tokens: int = 0) -> None:
        self.token = token
        self.num_tokens: dict[str, int] = {}
        self.k = num_speculative_tokens
        self.turn = 0  # accepted drafts cycle through 0..k

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
        drafts = so.scheduled_spec_decode_tokens
        sampled = []
        for rid in ids:
            if computed[rid] + so.num_scheduled_tokens[rid] >= self.num_tokens[rid]:
                # The verification keeps some drafts and samples one more.
                kept = 0
                if d := len(drafts.get(rid, ())):
                    self.turn += 1
                    kept = self.turn % (d + 1)
                sampled.append([self.token] * (kept + 1))
                self.num_tokens[rid] += kept + 1
            else:
                sampled.append([])
        return ModelRunnerOutput(
            req_ids=ids,
            req_id_to_index={r: i for i, r in enumerate(ids)},
            sampled_token_ids=sampled,
        )

    def drafts(self, mro: ModelRunnerOutput) -> DraftTokenIds:
        """An n-gram proposer's drafts (k each) for the requests that sampled."""
        ids = [rid for rid, t in zip(mro.req_ids, mro.sampled_token_ids, strict=True) if t]
        return DraftTokenIds(req_ids=ids, draft_token_ids=[[self.token] * self.k for _ in ids])


def offload_jobs_done(meta: Any) -> KVConnectorOutput | None:
    """The workers' report of CPU offloading's jobs that a step's metadata
    asked for, each done within the step: the jobs completed, an async
    load's request named as received (what vLLM's offloading worker
    reports)."""
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
        OffloadingConnectorMetadata,
        OffloadingWorkerMetadata,
    )

    if not isinstance(meta, OffloadingConnectorMetadata):
        return None
    jobs = {**meta.load_jobs, **meta.store_jobs}
    if not jobs:
        return None
    received = {job.req_id for job in meta.load_jobs.values() if not job.sync}
    return KVConnectorOutput(
        finished_recving=received or None,
        kv_connector_worker_meta=OffloadingWorkerMetadata(completed_jobs=dict.fromkeys(jobs, 1)),
    )


def remote_prefill_params(request_id: str, num_tokens: int, block_size: int = 16) -> dict[str, Any]:
    """The ``kv_transfer_params`` a prefill instance's NIXL hands a request
    to the decode instance with: where its prompt's blocks are."""
    return {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_block_ids": [list(range(1, -(-num_tokens // block_size) + 1))],
        "remote_engine_id": "prefill-0",
        "remote_request_id": request_id,
        "remote_host": "localhost",
        "remote_port": 5600,
        "tp_size": 1,
    }


class VllmDriver(TimedDriver):
    """A vLLM-interface scheduler as an ``ironbatch.bench`` driver: vLLM's
    own (``kind="vllm"``) or the drop-in (``"ironbatch"``), both fed vLLM
    Requests and ModelRunnerOutputs and both returning vLLM's objects."""

    def __init__(self, workload: Any, kind: str = "vllm", async_scheduling: bool = False) -> None:
        super().__init__(async_scheduling)
        self.name = f"vllm-{VERSION}" if kind == "vllm" else "drop-in"
        self.bs = workload.block_size
        self.structured_every = workload.structured_every
        extras: dict[str, Any] = {}
        self.speculating = workload.num_speculative_tokens > 0
        if self.speculating:  # n-gram: the runner proposes, no drafter model
            extras["speculative_config"] = SpeculativeConfig(
                method="ngram",
                num_speculative_tokens=workload.num_speculative_tokens,
                prompt_lookup_max=3,
                prompt_lookup_min=1,
            )
        if workload.kv_layout != "full":
            extras.update(kv_layout=workload.kv_layout, window=workload.window)
        if workload.max_loras is not None:
            extras["lora_config"] = LoRAConfig(max_loras=workload.max_loras, max_lora_rank=8)
        if workload.encoder_budget is not None:
            extras.update(target="vision", mm_budget=(workload.encoder_budget,) * 2)
        self.remote_prefill = workload.remote_prefill
        if workload.remote_prefill:  # a P/D decode instance: NIXL, consumer
            extras["kv_transfer_config"] = KVTransferConfig(
                kv_connector="NixlConnector", kv_role="kv_consumer"
            )
        self.cpu_offload = workload.cpu_offload
        if workload.cpu_offload:  # what --kv-offloading-size 4 builds
            extras["kv_transfer_config"] = KVTransferConfig(
                kv_connector="OffloadingConnector",
                kv_role="kv_both",
                kv_connector_extra_config={"cpu_bytes_to_use": 4 << 30},
            )
        if workload.kv_events:  # published to a null publisher: the work, not the socket
            extras["kv_events_config"] = KVEventsConfig(
                enable_kv_cache_events=True, publisher="null"
            )
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
                "enable_prefix_caching": workload.prefix_caching,
            },
            kind,
            async_scheduling,
            **extras,
        )
        self.sched.structured_output_manager.backend = MaskBackend()
        self.runner = RunnerEmulator(5, workload.num_speculative_tokens)
        self.proposed = DraftTokenIds(req_ids=[], draft_token_ids=[])

    def add(self, r: Any) -> None:
        p = r.sampling_params
        number = int(r.request_id.rsplit("-", 1)[-1])
        structured = self.structured_every and number % self.structured_every == 0
        vr = request(
            {
                "request_id": r.request_id,
                "prompt_token_ids": r.prompt_token_ids,
                "max_tokens": p.max_tokens,
                "min_tokens": p.min_tokens,
                "ignore_eos": p.ignore_eos,
                "stop_token_ids": p.stop_token_ids,
                "arrival_time": r.arrival_time,
                "priority": r.priority,
                "structured_outputs": JSON_SCHEMA if structured else None,
                "lora_request": r.lora_request,
                "mm_features": r.mm_features,
                "kv_transfer_params": remote_prefill_params(r.request_id, len(r.prompt_token_ids))
                if self.remote_prefill
                else None,
            },
            self.bs,
        )
        if structured:
            # Its grammar has compiled, as EngineCore leaves a finished
            # compile: a done Future on the request.
            compiled: Future = Future()
            compiled.set_result(AcceptingGrammar())
            vr.structured_output_request.grammar = compiled
        self.sched.add_request(vr)

    def schedule(self) -> Any:
        so = self.sched.schedule()
        # EngineCore asks for the grammar masks of every step it runs.
        self.sched.get_grammar_bitmask(so)
        return so

    def run_model(self, so: Any) -> ModelRunnerOutput:
        mro = self.runner.output(so)
        if self.remote_prefill:
            # The loads this step's metadata asked for are done by its end.
            loads = set(so.kv_connector_metadata.reqs_to_recv)
            mro.kv_connector_output = KVConnectorOutput(finished_recving=loads or None)
        if self.cpu_offload:
            mro.kv_connector_output = offload_jobs_done(so.kv_connector_metadata)
        if self.speculating and not self.async_scheduling:
            # The proposer runs in the worker, beside the model: not timed.
            self.proposed = self.runner.drafts(mro)
        return mro

    def prefill_rows(self, so: Any) -> int:
        # A decode verifying drafts schedules them too; it is no prefill.
        drafts = so.scheduled_spec_decode_tokens
        counts = np.fromiter(
            (n - len(drafts.get(rid, ())) for rid, n in so.num_scheduled_tokens.items()),
            dtype=np.int64,
        )
        return int(np.count_nonzero(counts > 1))

    def update(self, so: Any, mro: Any) -> None:
        self.sched.update_from_output(so, mro)
        if self.speculating and not self.async_scheduling:
            # EngineCore hands the proposer's drafts over after each output.
            self.sched.update_draft_token_ids(self.proposed)
