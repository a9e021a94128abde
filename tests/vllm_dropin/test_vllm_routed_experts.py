"""Routed experts beside a KV connector, on vLLM's scheduler and on the
drop-in, step for step (docs/scheduling.md §7.12's worked example): the
workers retain finished requests' blocks' routing up to twice the cache's
blocks; past that the least recently used go, but never those a load in
progress reads; an external hit over released blocks is cut to none. The
workers' metadata (the hashes retained and released) must be vLLM's, and
so must what the connector was asked and told."""

from __future__ import annotations

from typing import Any

import numpy as np
from vllm.distributed.aux_output_connector.connector import AuxRequestOutput
from vllm.v1.request import RequestStatus

from ironbatch.bench.standin_connector import StandInShares
from ironbatch.bench.vllm_standin_connector import kv_transfer_config, stand_in_of

import vllm_setup

BS = 4
# Only the scripted requests hit externally; nothing fails or is held.
QUIET = StandInShares(unknown=0.0, hit=0.0, load_failed=0.0, block_invalid=0.0, delay_free=0.0)
PROMPTS = {rid: list(range(3 + 16 * k, 3 + 16 * k + 16)) for k, rid in enumerate("abcx")}


def run(kind: str) -> tuple[list[Any], list[Any], Any]:
    """The scenario on ``kind``'s scheduler: each step's scheduled tokens
    and metadata, the connector's log, and the scheduler."""
    scripted = {"d": (16, True), "f": (16, False), "g": (16, False)}
    s = vllm_setup.make_scheduler(
        kind,
        block_size=BS,
        num_blocks=8,  # (7 blocks: the routing of 16 retained at most)
        max_model_len=24,
        max_num_seqs=4,
        max_num_batched_tokens=64,
        async_scheduling=False,
        return_routed_experts=True,
        kv_transfer_config=kv_transfer_config(0, "fail", QUIET, scripted=scripted),
    )
    steps: list[Any] = []
    aux = getattr(s, "aux_output_connector", None)
    if aux is not None:  # vLLM's: each external hit it is asked to cap
        cap = aux.cap_external_hit

        def capping(request: Any, num_local: int, num_external: int) -> int:
            kept = cap(request, num_local, num_external)
            steps.append(("cap", request.request_id, num_external, kept))
            return kept

        aux.cap_external_hit = capping

    def add(rid: str, prompt: list[int]) -> None:
        s.add_request(vllm_setup.make_request(rid, prompt, max_tokens=1, block_size=BS))

    def step(finishing: tuple[str, ...] = ()) -> Any:
        out = s.schedule()
        meta = out.aux_output_connector_metadata
        steps.append(
            (
                dict(out.num_scheduled_tokens),
                meta.requests,
                [list(meta.block_hashes[r]) for r in sorted(meta.block_hashes)],
                meta.retained_block_hashes and list(meta.retained_block_hashes),
                meta.released_block_hashes and list(meta.released_block_hashes),
            )
        )
        mro = vllm_setup.runner_output(out, {rid: [vllm_setup.EOS] for rid in finishing})
        mro.aux_output_connector_output = {
            rid: AuxRequestOutput(token_start=0, rows=np.zeros((24, 2), np.int32))
            for rid in out.num_scheduled_tokens
        }
        s.update_from_output(out, mro)
        return out

    for rid in "abcx":  # one at a time: 16 blocks retained, most evicted since
        add(rid, PROMPTS[rid])
        step(finishing=(rid,))
    add("d", PROMPTS["a"] + [1, 1, 1, 1])  # loads a's blocks
    step()
    for rid in "bcx":  # lookups over b's, c's, x's blocks: a's the least recent
        add(f"t{rid}", PROMPTS[rid] + [2, 2, 2, 2])
        step()
        s.finish_requests([f"t{rid}"], RequestStatus.FINISHED_ABORTED)
    add("e", list(range(200, 208)))  # finishes: two of the least recent go
    step(finishing=("e",))
    add("f", PROMPTS["a"] + [3, 3, 3, 3])  # a's blocks: kept
    step()
    s.finish_requests(["f"], RequestStatus.FINISHED_ABORTED)
    add("g", PROMPTS["b"] + [3, 3, 3, 3])  # b's: released, cut to none
    step()
    return steps, stand_in_of(s).log, s


def test_a_load_keeps_its_blocks_routing_and_a_hit_over_released_blocks_is_cut() -> None:
    theirs, their_log, vllm = run("vllm")
    caps = [x[1:] for x in theirs if x[0] == "cap"]
    theirs = [x for x in theirs if x[0] != "cap"]
    ours, our_log, _ = run("ironbatch")
    assert ours == theirs
    assert our_log == their_log
    # What the scenario is for, on vLLM's side: d's load stands, and still
    # runs when e's finish releases two blocks' routing; f's hit over a's
    # blocks (which d's load kept) stands, g's over b's is cut to none.
    assert vllm.requests["d"].status == RequestStatus.WAITING_FOR_REMOTE_KVS
    released = [r for *_, r in theirs if r]
    assert len(released) == 1 and len(released[0]) == 2
    assert [c for c in caps if c[1]] == [("d", 16, 16), ("f", 16, 16), ("g", 16, 0)]
