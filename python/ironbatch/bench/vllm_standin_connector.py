"""The stand-in connector (ironbatch/bench/standin_connector.py) as vLLM 0.33 builds
connectors: a ``KVConnectorBase_V1`` named in a ``KVTransferConfig`` by
module path, its seed and shares in ``kv_connector_extra_config``. vLLM's
factory builds it, for vLLM's scheduler and for the drop-in alike, and
``kv_connector_output`` turns the stand-in worker's report into the
``KVConnectorOutput`` a model runner would return."""

from __future__ import annotations

import random
from dataclasses import asdict
from typing import Any

from vllm.config import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    SupportsHMA,
)
from vllm.v1.outputs import KVConnectorOutput
from vllm.v1.request import RequestStatus

from ironbatch.bench.standin_connector import (
    StandInConnector,
    StandInMeta,
    StandInShares,
    WorkerReport,
)
from ironbatch.vllm.harness import draw_layout

NORMAL_FINISH = (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH_CAPPED)


def random_settings(rng: random.Random, seed: int) -> dict[str, Any]:
    """A small engine with the stand-in, drawn: block size, lengths, budgets,
    chunking, prefix caching, policy, sync or async, the stand-in's shares,
    the load-failure policy, and whether the connector has hybrid support
    (with a window layout beside it, mostly; in half the gpt-oss, Gemma 3
    and Llama 4 ones, groups of different block sizes: a mixed-precision
    hybrid's; else recurrent states uncached in most)."""
    bs = rng.choice([4, 8, 16])
    max_model_len = rng.choice([64, 128])
    chunked = rng.random() < 0.8
    seqs = rng.choice([2, 4, 8])
    batched = max(rng.choice([16, 32, 64, 128]), seqs)
    if not chunked:
        batched = max(batched, max_model_len)
    need = -(-max_model_len // bs)
    # Tight caches preempt; an async load must fit beside what in-flight
    # prefills still need, so a cache below two sequences stalls some loads.
    blocks = rng.randint(need + 2, 2 * need + 2) if rng.random() < 0.5 else 8 * need
    shares = StandInShares.draw(rng)
    # (Drawn apart, so the draws above stay each seed's.) In some, a
    # connector with hybrid support (NIXL, offloading, Mooncake's): vLLM
    # then keeps a hybrid model's window groups beside full attention.
    drawn = random.Random(seed ^ 0x4B1D)
    hybrid = drawn.random() < 0.45
    layout: dict[str, Any] = {"kv_layout": "full"}
    if hybrid and drawn.random() < 0.8:
        kind = drawn.choice(["gpt-oss", "gpt-oss", "gemma3", "llama4"])
        layout = draw_layout(drawn, kind, bs)
        # Each window group takes blocks beside the full one.
        blocks *= 2 if kind == "gpt-oss" else 4
        sizes = random.Random(seed ^ 0x5EED)
        if sizes.random() < 0.5:
            # The windows' or the full group's blocks larger (drawn apart);
            # a retention interval on the scheduler block, their larger.
            # Llama 4's chunked groups' larger (vLLM's prefix lookup asserts
            # against smaller ones), chunks whole blocks of their own.
            larger = bs * sizes.choice([2, 4])
            which = sizes.choice(["window_block_size", "full_block_size"])
            if kind == "llama4":
                which = "window_block_size"
                layout["window"] = -(-layout["window"] // larger) * larger
            layout[which] = larger
            if layout.get("retention_interval"):
                layout["retention_interval"] = larger * sizes.choice([1, 2])
    caching = rng.random() < 0.8
    divergent = False
    # In some with hybrid support, recurrent states beside attention
    # (Qwen3-Next, Jamba, a window and a state: drawn apart), uncached:
    # prefix caching off (vLLM's cache mode "none"), one state block each,
    # of the model's length or shorter.
    states = random.Random(seed ^ 0x5747E5)
    if hybrid and states.random() < 0.3:
        kind = states.choice(["qwen3-next", "jamba", "swa-mamba"])
        layout = {"kv_layout": kind, "window": bs + 3, "retention_interval": None}
        layout["mamba_block_size"] = states.choice([None, max_model_len // 2, bs])
        caching = states.random() < 0.5
        if caching:  # (vLLM's "align": states of the block size, chunks to end on them)
            layout["mamba_block_size"] = None
            chunked = True
            # In half, a connector that completes divergent hybrid hits
            # (NIXL's): it is told full attention's own hit.
            divergent = states.random() < 0.5
        blocks = blocks + 6 * seqs
    return dict(
        **layout,
        block_size=bs,
        num_blocks=blocks,
        max_model_len=max_model_len,
        max_num_seqs=seqs,
        max_num_batched_tokens=batched,
        enable_chunked_prefill=chunked,
        enable_prefix_caching=caching,
        policy=rng.choice(["fcfs", "priority"]),
        async_scheduling=rng.random() < 0.5,
        kv_transfer_config=kv_transfer_config(
            seed, rng.choice(["fail", "recompute"]), shares, hybrid=hybrid, divergent=divergent
        ),
    )


def kv_transfer_config(
    seed: int,
    policy: str = "fail",
    shares: StandInShares | None = None,
    scripted: dict[str, tuple[int, bool]] | None = None,
    hybrid: bool = False,
    divergent: bool = False,
) -> KVTransferConfig:
    """A config that has vLLM build the stand-in (role kv_both: it loads and
    sends, and vLLM fences its frees under async scheduling); ``hybrid``:
    the stand-in with hybrid support (``StandInHMAKVConnector``);
    ``divergent``: one that also completes divergent hybrid hits
    (``StandInDivergentKVConnector``)."""
    name = "StandInKVConnector"
    if divergent:
        name = "StandInDivergentKVConnector"
    elif hybrid:
        name = "StandInHMAKVConnector"
    return KVTransferConfig(
        kv_connector=name,
        kv_connector_module_path=__name__,
        kv_role="kv_both",
        kv_load_failure_policy=policy,  # type: ignore[arg-type]
        kv_connector_extra_config={
            "seed": seed,
            "shares": asdict(shares or StandInShares()),
            "scripted": scripted or {},
        },
    )


class Metadata(KVConnectorMetadata):
    def __init__(self, meta: StandInMeta) -> None:
        self.meta = meta

    def __eq__(self, other: object) -> bool:  # two schedulers' metadata compared
        return isinstance(other, Metadata) and self.meta == other.meta

    __hash__ = None  # type: ignore[assignment]


class StandInKVConnector(KVConnectorBase_V1):
    """The scheduler side of the stand-in; the worker-side calls do nothing
    (tests run no model)."""

    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        extra = vllm_config.kv_transfer_config.kv_connector_extra_config
        self.stand_in = StandInConnector(
            extra["seed"],
            vllm_config.cache_config.block_size,
            StandInShares(**extra["shares"]),
            {rid: (n, is_async) for rid, (n, is_async) in extra["scripted"].items()},
        )

    def _seen(self, request: Any, blocks: Any = None) -> None:
        """The Request (and blocks) as this call sees them, in the log: a
        scheduler that hands a connector stale objects differs here."""
        cached = None
        if blocks is not None:  # per group, the positions of blocks with a hash
            cached = [
                [i for i, b in enumerate(group) if b.block_hash is not None]
                for group in blocks.blocks
            ]
        self.stand_in.log.append(
            (
                "seen",
                request.request_id,
                request.status.name,
                request.num_computed_tokens,
                list(request.all_token_ids),
                [bytes(h) for h in request.block_hashes],
                cached,
            )
        )

    def get_num_new_matched_tokens(
        self, request: Any, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        self._seen(request)
        return self.stand_in.get_num_new_matched_tokens(
            request.request_id, request.num_tokens, num_computed_tokens
        )

    def get_loaded_kv_cache_group_ids(self, request: Any) -> tuple[int, ...]:
        return self.stand_in.get_loaded_kv_cache_group_ids(request.request_id)

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        self._seen(request, blocks)
        ids = [list(group) for group in blocks.get_block_ids()]
        self.stand_in.update_state_after_alloc(request.request_id, ids, num_external_tokens)

    def build_connector_meta(self, scheduler_output: Any) -> Metadata:
        # The cached states offered (a recurrent group's, prefix caching on),
        # logged as a connector that stores them would take them.
        state = scheduler_output.kv_connector_block_state
        offloads = state.boundary_state_offloads if state is not None else {}
        if offloads:
            self.stand_in.log.append(("boundary_states", list(offloads.items())))
            self.stand_in.events["boundary_states"] += sum(map(len, offloads.values()))
        return Metadata(self.stand_in.build_connector_meta())

    def request_finished(
        self, request: Any, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        self._seen(request)
        normal = request.status in NORMAL_FINISH
        return self.stand_in.request_finished(request.request_id, [list(block_ids)], normal)

    # Worker side: nothing runs.
    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        pass

    def wait_for_layer_load(self, layer_name: str) -> None:
        pass

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kw: Any) -> None:
        pass

    def wait_for_save(self) -> None:
        pass


def stand_in_of(scheduler: Any) -> StandInConnector:
    """The stand-in behind a scheduler's connector."""
    connector = scheduler.get_kv_connector()
    assert isinstance(connector, StandInKVConnector), type(connector)
    return connector.stand_in


def kv_connector_output(report: WorkerReport) -> KVConnectorOutput:
    """A worker report as vLLM's model runner hands it over."""
    return KVConnectorOutput(
        finished_sending=set(report.finished_sending) or None,
        finished_recving=set(report.finished_recving) or None,
        invalid_block_ids=set(report.invalid_block_ids),
        failed_recving=set(report.failed_recving),
    )


class StandInHMAKVConnector(SupportsHMA, StandInKVConnector):
    """The stand-in as a connector with hybrid support (vLLM's
    ``SupportsHMA``: NIXL, offloading, Mooncake): vLLM keeps a hybrid
    model's KV-cache groups beside it and hands a finished request's
    blocks of every group."""

    def request_finished_all_groups(
        self, request: Any, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        self._seen(request)
        normal = request.status in NORMAL_FINISH
        return self.stand_in.request_finished(
            request.request_id, [list(ids) for ids in block_ids], normal
        )


class StandInDivergentKVConnector(StandInHMAKVConnector):
    """The stand-in as a connector that completes a hybrid's divergent local
    hits (NIXL's ``supports_divergent_local_hybrid_hits``): beside cached
    recurrent states vLLM tells it full attention's own hit, and finds the
    hit every group agrees on again when it answers no tokens."""

    @property
    def supports_divergent_local_hybrid_hits(self) -> bool:
        return True
