"""What ``benches/record_vllm.py --connector NAME`` runs beside vLLM's
scheduler: the connector's deployment settings, a worker that reports each
step's transfers, and a log of the scheduler's calls to the connector with
its answers (docs/trace-format.md §3.7). Imports vLLM, so
``ironbatch.bench`` does not import this module.

The connectors:

- ``standin``: the seeded stand-in (``ironbatch.bench.standin_connector``):
  external hits beside local ones, loads in the step or over 1-6 steps,
  loads failed whole or losing a block, frees held for a send;
- ``nixl``: vLLM's NixlConnector as a P/D decode instance (``kv_consumer``):
  most requests arrive with their prompt's KV on a prefill instance, which
  a load pulls over 1-3 steps, now and then losing a block;
- ``offloading``: vLLM's OffloadingConnector (what ``--kv-offloading-size``
  builds): blocks stored to CPU memory and loaded back, each job done
  within its step.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from vllm.config import KVTransferConfig
from vllm.v1.outputs import KVConnectorOutput

from ironbatch.bench import vllm_standin_connector as standin
from ironbatch.bench.standin_connector import StandInShares, StandInWorker
from ironbatch.bench.vllm_driver import offload_jobs_done
from ironbatch.trace.connector import allocated_call, finished_call, matched_call

CONNECTORS = ("standin", "nixl", "offloading")


class ConnectorCalls:
    """The scheduler's calls to ``connector`` (vLLM's, as its scheduler
    holds it) with the answers, logged in the trace's shape: the connector's
    methods are wrapped on the instance, so the scheduler calls through the
    log and the connector answers as it would."""

    def __init__(self, connector: Any) -> None:
        self.calls: list[list[Any]] = []
        self._inside_finished = False  # one entry for a call that calls another
        matched = connector.get_num_new_matched_tokens
        allocated = connector.update_state_after_alloc

        def get_num_new_matched_tokens(request: Any, num_computed_tokens: int) -> Any:
            answer = matched(request, num_computed_tokens)
            tokens, load_async = answer
            self.calls.append(
                matched_call(request.request_id, num_computed_tokens, tokens, bool(load_async))
            )
            return answer

        def update_state_after_alloc(request: Any, blocks: Any, num_external_tokens: int) -> Any:
            block_ids = list(blocks.get_block_ids()[0])
            self.calls.append(allocated_call(request.request_id, block_ids, num_external_tokens))
            return allocated(request, blocks, num_external_tokens)

        connector.get_num_new_matched_tokens = get_num_new_matched_tokens
        connector.update_state_after_alloc = update_state_after_alloc
        # vLLM calls one of the two, as the connector supports hybrid
        # allocation or not; the all-groups one gets a list per group.
        connector.request_finished = self._finished(connector.request_finished, lambda b: b)
        if hasattr(connector, "request_finished_all_groups"):
            connector.request_finished_all_groups = self._finished(
                connector.request_finished_all_groups, lambda b: b[0]
            )

    def _finished(
        self, call: Callable[..., Any], group_zero: Callable[[Any], Any]
    ) -> Callable[..., Any]:
        def request_finished(request: Any, block_ids: Any) -> Any:
            if self._inside_finished:
                return call(request, block_ids)
            self._inside_finished = True
            try:
                delay_free, params = call(request, block_ids)
            finally:
                self._inside_finished = False
            ids = list(group_zero(block_ids))
            self.calls.append(finished_call(request.request_id, ids, bool(delay_free)))
            return delay_free, params

        return request_finished

    def take(self) -> list[list[Any]]:
        """The calls since the last take."""
        calls, self.calls = self.calls, []
        return calls


class StandInReports:
    """The stand-in's worker, reporting each step's due transfers."""

    def __init__(self) -> None:
        self.worker = StandInWorker()
        self.step = 0

    def report(self, so: Any) -> KVConnectorOutput | None:
        self.step += 1
        meta = so.kv_connector_metadata
        return standin.kv_connector_output(self.worker.report(meta.meta, self.step))

    @property
    def busy(self) -> bool:
        return self.worker.busy


class NixlLoads:
    """A decode instance's NIXL worker: a load its metadata asks for is
    reported done 1-3 steps later, one in ``invalid_share`` with one of its
    blocks lost."""

    def __init__(self, rng: random.Random, invalid_share: float) -> None:
        self.rng = rng
        self.invalid_share = invalid_share
        self.loads: dict[str, tuple[int, list[int]]] = {}  # request -> (steps left, blocks)

    def report(self, so: Any) -> KVConnectorOutput | None:
        for rid, meta in so.kv_connector_metadata.reqs_to_recv.items():
            # Per group. None: nothing to pull (the prompt all hit locally,
            # or the request aborted before its load): the worker only
            # tells the prefill instance to free, and reports nothing.
            if meta.local_block_ids and meta.local_block_ids[0]:
                self.loads[rid] = (self.rng.randint(1, 3), list(meta.local_block_ids[0]))
        done = [rid for rid, (left, _) in self.loads.items() if left <= 1]
        invalid = set()
        for rid in done:
            _, blocks = self.loads.pop(rid)
            if self.rng.random() < self.invalid_share:
                invalid.add(self.rng.choice(blocks))
        self.loads = {rid: (left - 1, blocks) for rid, (left, blocks) in self.loads.items()}
        if not done:
            return None
        return KVConnectorOutput(finished_recving=set(done), invalid_block_ids=invalid)

    @property
    def busy(self) -> bool:
        return bool(self.loads)


class OffloadJobs:
    """The offloading workers: every job a step's metadata starts is done
    within the step."""

    busy = False

    def report(self, so: Any) -> KVConnectorOutput | None:
        return offload_jobs_done(so.kv_connector_metadata)


@dataclass
class RecordedConnector:
    """One seed's connector: how vLLM builds it, its load-failure policy,
    the share of requests that arrive with a remote prefill, and the worker."""

    kv_transfer_config: KVTransferConfig
    policy: str
    worker: Any
    remote_prefill_share: float = 0.0

    @property
    def name(self) -> str:
        """``NixlConnector (kv_consumer)``: informational, for the header."""
        config = self.kv_transfer_config
        return f"{config.kv_connector} ({config.kv_role})"


def draw_connector(seed: int, name: str) -> RecordedConnector:
    """The connector ``--connector name`` records for ``seed``, from a
    stream of its own (the config and workload draws stay the seed's)."""
    rng = random.Random(f"ironbatch-record-connector-{seed}")
    policy = rng.choice(["fail", "recompute"])
    if name == "standin":
        shares = StandInShares.draw(rng)
        return RecordedConnector(
            kv_transfer_config=standin.kv_transfer_config(seed, policy, shares),
            policy=policy,
            worker=StandInReports(),
        )
    if name == "nixl":
        return RecordedConnector(
            kv_transfer_config=KVTransferConfig(
                kv_connector="NixlConnector",
                kv_role="kv_consumer",
                kv_load_failure_policy=policy,  # type: ignore[arg-type]
            ),
            policy=policy,
            worker=NixlLoads(
                random.Random(f"ironbatch-record-nixl-{seed}"), rng.choice([0.0, 0.1, 0.3])
            ),
            remote_prefill_share=rng.choice([0.5, 0.8, 1.0]),
        )
    if name == "offloading":
        return RecordedConnector(
            kv_transfer_config=KVTransferConfig(
                kv_connector="OffloadingConnector",
                kv_role="kv_both",
                kv_load_failure_policy=policy,  # type: ignore[arg-type]
                kv_connector_extra_config={"cpu_bytes_to_use": 1 << 30},
            ),
            policy=policy,
            worker=OffloadJobs(),
        )
    raise ValueError(f"connector must be one of {CONNECTORS}, got {name!r}")
