"""A prefill/decode pair with vLLM's NixlConnector, each instance the
drop-in beside vLLM's own scheduler (docs/scheduling.md §4.19): the prefill
instance (``kv_producer``) computes each prompt and holds its blocks for the
decode instance to read; the decode instance (``kv_consumer``) takes the
request with the prefill's ``kv_transfer_params`` (``do_remote_prefill``),
waits for its KV (``WAITING_FOR_REMOTE_KVS``) and decodes. A stand-in for
the two instances' workers reports each load done some steps after the
decode instance asks for it, and the matching send done on the prefill
side after that. On each instance every SchedulerOutput (NIXL's metadata
included), every EngineCoreOutputs (the transfer parameters the prefill
side returns) and every request must equal vLLM's."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest
from vllm.config import KVTransferConfig
from vllm.v1.engine import FinishReason
from vllm.v1.outputs import KVConnectorOutput
from vllm.v1.request import RequestStatus

import vllm_setup
from vllm_pair import VllmPair

VOCAB = 50


def nixl(role: str) -> KVTransferConfig:
    return KVTransferConfig(kv_connector="NixlConnector", kv_role=role)


class Transfers:
    """The two instances' workers: a load the decode side's metadata asks
    for is reported done 1-3 decode steps later; its send is then reported
    done by the prefill side at its next step."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.loads: dict[str, int] = {}  # request -> decode steps left
        self.sent: set[str] = set()  # loads done whose send is not yet reported
        self.events: Counter = Counter()

    def decode_report(self, so: Any) -> KVConnectorOutput | None:
        for rid in so.kv_connector_metadata.reqs_to_recv:
            self.loads[rid] = self.rng.randint(1, 3)
            self.events["loads"] += 1
        done = {rid for rid, left in self.loads.items() if left <= 1}
        self.loads = {rid: left - 1 for rid, left in self.loads.items() if left > 1}
        self.sent |= done
        return KVConnectorOutput(finished_recving=done or None)

    def prefill_report(self, so: Any) -> KVConnectorOutput | None:
        done, self.sent = self.sent, set()
        self.events["sends"] += len(done)
        return KVConnectorOutput(finished_sending=done or None)

    @property
    def busy(self) -> bool:
        return bool(self.loads or self.sent)


def run(seed: int, async_scheduling: bool) -> Counter:
    rng = random.Random(seed)
    settings = dict(
        block_size=8,
        num_blocks=48,
        max_model_len=128,
        max_num_seqs=4,
        max_num_batched_tokens=64,
        async_scheduling=async_scheduling,
    )
    prefill = VllmPair(rng, kv_transfer_config=nixl("kv_producer"), **settings)
    decode = VllmPair(rng, kv_transfer_config=nixl("kv_consumer"), **settings)
    transfers = Transfers(rng)
    prefill.kv_reports = transfers.prefill_report
    decode.kv_reports = transfers.decode_report
    for pair in (prefill, decode):
        pair.choose = lambda: rng.randrange(3, VOCAB)
    depth = 2 if async_scheduling else 1
    prompts: dict[str, list[int]] = {}
    handed: list[tuple[str, dict[str, Any]]] = []  # prefilled, for the decode side
    events: Counter = Counter()
    n = 12
    for _ in range(3000):
        if len(prompts) < n and rng.random() < 0.4:
            rid = f"r{len(prompts)}"
            prompts[rid] = [rng.randrange(3, VOCAB) for _ in range(rng.randint(5, 90))]
            params = {"do_remote_decode": True}
            prefill.add(rid, prompts[rid], max_tokens=16, extra_args={"kv_transfer_params": params})
        while handed and rng.random() < 0.7:
            rid, params = handed.pop(0)
            decode.add(
                rid,
                prompts[rid],
                max_tokens=rng.randint(1, 12),
                extra_args={"kv_transfer_params": params},
            )
            events["handed_over"] += 1
        for pair in (prefill, decode):
            pair.schedule()
            while len(pair.in_flight) >= depth:
                finished = _update(pair)
                if pair is prefill:
                    handed += finished
        events["decode_loading"] += sum(
            r.status == RequestStatus.WAITING_FOR_REMOTE_KVS for r in decode.vllm.requests.values()
        )
        idle = not (prefill.vllm.has_requests() or decode.vllm.has_requests())
        if len(prompts) == n and not handed and idle and not transfers.busy:
            break
    else:
        raise AssertionError("the pair made no progress")
    for pair in (prefill, decode):
        while pair.in_flight:
            _update(pair)
        assert pair.ours._core.num_free_blocks == settings["num_blocks"] - 1, "blocks leaked"
    events.update(transfers.events)
    events["decoded"] += decode.events["finished"]
    return events


def _update(pair: VllmPair) -> list[tuple[str, dict[str, Any]]]:
    """Apply the pair's oldest step; the requests the prefill side finished
    with transfer parameters for the decode side."""
    handed = []
    original = pair.vllm.update_from_output

    def capture(so: Any, mro: Any) -> Any:
        outs = original(so, mro)
        for eco in outs.values():
            for o in eco.outputs:
                if o.finish_reason == FinishReason.LENGTH and o.kv_transfer_params:
                    handed.append((o.request_id, dict(o.kv_transfer_params)))
        return outs

    pair.vllm.update_from_output = capture  # type: ignore[method-assign]
    try:
        pair.update_oldest()
    finally:
        del pair.vllm.update_from_output
    return handed


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("seed", range(3))
def test_a_prefill_decode_pair_hands_requests_over_as_vllm_does(
    seed: int, async_scheduling: bool
) -> None:
    events = run(seed, async_scheduling)
    assert events["handed_over"] == 12, events
    assert events["loads"] == 12 and events["sends"] == 12, events
    assert events["decode_loading"] > 0, events
    assert events["decoded"] == 12, events


def test_the_pair_is_built_with_the_drop_in_on_both_sides() -> None:
    for role in ("kv_producer", "kv_consumer", "kv_both"):
        s = vllm_setup.make_scheduler("ironbatch", kv_transfer_config=nixl(role))
        assert type(s).__module__ == "ironbatch.vllm.scheduler", role
        assert type(s.get_kv_connector()).__name__ == "NixlPullConnector"
