"""A stand-in encoder-cache connector (docs/scheduling.md §4.20), for tests:
the scheduler side of vLLM 0.33's ``ECConnectorBase``, by request id,
deterministic from a seed and independent of any engine.

It answers the way an encoder/prefill/decode deployment's connectors can:
some identifiers' encoder outputs are held elsewhere (loaded, not run), and
a request's outputs are now and then still in transit (it waits a step, at
most a few times). Each answer is drawn from (seed, identifier or request
id, how many times it was asked), so two schedulers that make the same calls
get the same answers, and the call log says where they parted."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class EcShares:
    """How often the stand-in does each thing (probabilities)."""

    #: An identifier whose encoder output the connector holds.
    held: float = 0.4
    #: An ask answered "still in transit" (at most ``max_waits`` a request).
    in_transit: float = 0.2
    max_waits: int = 3

    @classmethod
    def draw(cls, rng: random.Random) -> EcShares:
        return cls(
            held=rng.choice([0.0, 0.3, 0.7, 1.0]),
            in_transit=rng.choice([0.0, 0.1, 0.4]),
            max_waits=rng.choice([1, 3]),
        )


class StandInEcConnector:
    """The scheduler side, by request id. ``log`` records every call with
    its arguments and answer; ``events`` counts what a workload exercised."""

    def __init__(self, seed: int, shares: EcShares | None = None) -> None:
        self.seed = seed
        self.shares = shares or EcShares()
        self.log: list[tuple[Any, ...]] = []
        self.events: Counter = Counter()
        self._asks: Counter = Counter()
        self._waits: Counter = Counter()

    def has_cache_item(self, identifier: str) -> bool:
        held = random.Random(f"{self.seed}:{identifier}:held").random() < self.shares.held
        self.log.append(("has_cache_item", identifier, held))
        return held

    def ensure_cache_available(self, request_id: str, num_computed_tokens: int) -> bool:
        self._asks[request_id] += 1
        rng = random.Random(f"{self.seed}:{request_id}:ensure:{self._asks[request_id]}")
        waits = self._waits[request_id] < self.shares.max_waits
        available = not (waits and rng.random() < self.shares.in_transit)
        if not available:
            self._waits[request_id] += 1
            self.events["ec_in_transit"] += 1
        self.log.append(("ensure_cache_available", request_id, num_computed_tokens, available))
        return available

    def update_state_after_alloc(self, request_id: str, input_id: int) -> None:
        self.events["ec_allocated"] += 1
        self.log.append(("update_state_after_alloc", request_id, input_id))

    def update_state_after_free(self, request_id: str, input_id: int) -> None:
        self.events["ec_freed"] += 1
        self.log.append(("update_state_after_free", request_id, input_id))

    def request_finished(self, request_id: str) -> bool:
        # No hold: vLLM 0.33's encoder-cache connectors never hold a
        # request's blocks, and only a KV connector's report would free them.
        self.log.append(("request_finished", request_id))
        return False
