"""The stand-in encoder-cache connector (ironbatch/bench/standin_ec_connector.py)
as vLLM 0.33 builds encoder-cache connectors: an ``ECConnectorBase`` named
in an ``ECTransferConfig`` by module path, its seed and shares in
``ec_connector_extra_config``. vLLM's factory builds it, for vLLM's
scheduler and for the drop-in alike. Beside the stand-in's answers it
returns transfer parameters at a finish, reports requests it can no longer
serve now and then, and builds metadata the workers would get, so that each
of the scheduler's hand-offs shows in what the two schedulers return."""

from __future__ import annotations

import random
from dataclasses import asdict
from typing import Any

from vllm.config import ECTransferConfig
from vllm.distributed.ec_transfer.ec_connector.base import (
    ECConnectorBase,
    ECConnectorMetadata,
    ECConnectorRole,
)

from ironbatch.bench.standin_ec_connector import EcShares, StandInEcConnector


def ec_transfer_config(seed: int, shares: EcShares | None = None) -> ECTransferConfig:
    """A config that has vLLM build the stand-in (role ec_both)."""
    return ECTransferConfig(
        ec_connector="StandInECConnector",
        ec_connector_module_path=__name__,
        ec_role="ec_both",
        ec_connector_extra_config={"seed": seed, "shares": asdict(shares or EcShares())},
    )


class Metadata(ECConnectorMetadata):
    """The step's loads, as (request id, input index) in allocation order."""

    def __init__(self, loads: list[tuple[str, int]]) -> None:
        self.loads = loads

    def __eq__(self, other: object) -> bool:  # two schedulers' metadata compared
        return isinstance(other, Metadata) and self.loads == other.loads

    __hash__ = None  # type: ignore[assignment]


class StandInECConnector(ECConnectorBase):
    """The scheduler side of the stand-in; the worker-side calls do nothing
    (tests run no model)."""

    def __init__(self, vllm_config: Any, role: ECConnectorRole) -> None:
        super().__init__(vllm_config, role)
        extra = vllm_config.ec_transfer_config.ec_connector_extra_config
        self.seed = extra["seed"]
        self.stand_in = StandInEcConnector(self.seed, EcShares(**extra["shares"]))
        self._loads: list[tuple[str, int]] = []
        self._updates = 0

    def has_cache_item(self, identifier: str) -> bool:
        return self.stand_in.has_cache_item(identifier)

    def ensure_cache_available(self, request: Any, num_computed_tokens: int) -> bool:
        return self.stand_in.ensure_cache_available(request.request_id, num_computed_tokens)

    def update_state_after_alloc(self, request: Any, index: int) -> None:
        self.stand_in.update_state_after_alloc(request.request_id, index)
        self._loads.append((request.request_id, index))

    def update_state_after_free(self, request: Any, index: int) -> None:
        self.stand_in.update_state_after_free(request.request_id, index)

    def build_connector_meta(self, scheduler_output: Any) -> Metadata:
        meta, self._loads = Metadata(self._loads), []
        return meta

    def request_finished(self, request: Any) -> tuple[bool, dict[str, Any] | None]:
        hold = self.stand_in.request_finished(request.request_id)
        items = [f.identifier for f in request.mm_features or ()]
        return hold, {"stand_in_items": items} if items else None

    def take_unavailable_requests(self) -> set[str]:
        """Now and then, one request the stand-in asked about can no longer
        be served (drawn from the calls so far)."""
        self._updates += 1
        rng = random.Random(f"{self.seed}:unavailable:{self._updates}")
        asked = sorted({c[1] for c in self.stand_in.log if c[0] == "ensure_cache_available"})
        if asked and rng.random() < 0.02:
            self.stand_in.events["ec_unavailable"] += 1
            return {rng.choice(asked)}
        return set()

    # Worker side: nothing runs.
    def start_load_caches(self, encoder_cache: Any, **kwargs: Any) -> None:
        pass

    def save_caches(self, encoder_cache: Any, mm_hash: str, **kwargs: Any) -> None:
        pass
