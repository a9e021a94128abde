"""The drop-in against vLLM 0.33's scheduler with an encoder-cache
connector (docs/scheduling.md §4.20): the seeded stand-in
(``ironbatch.bench.vllm_standin_ec_connector``) built by vLLM's factory on
each side, over this run's random vision workloads (the differential's own
draws, test_vllm_differential.py, those that come with the connector).
Every SchedulerOutput (the connector's metadata too), every EngineCoreOutputs
(transfer parameters, errors for requests the connector can no longer
serve, stats) and the connector's own call log must be equal."""

from __future__ import annotations

import random
from collections import Counter

import test_vllm_differential as differential
from seeded import Workloads

PER_RUN, FULL = 12, 48


def test_dropin_equals_vllm_with_an_encoder_cache_connector(workloads: Workloads) -> None:
    seeds = [
        seed
        for seed in workloads.seeds(40 * PER_RUN, 40 * FULL, part="ec")
        if "ec_transfer_config" in differential.random_settings(random.Random(seed))
    ]
    wanted = FULL if workloads.full else PER_RUN
    assert len(seeds) >= wanted, f"only {len(seeds)} workloads drew the connector"
    events: Counter = Counter()
    for seed in seeds[:wanted]:
        try:
            events += differential.run_workload(seed)
        except AssertionError as e:
            raise AssertionError(f"workload seed {seed}: {e}") from e
    for what in ("ec_allocated", "ec_freed", "ec_in_transit", "ec_unavailable"):
        assert events[what] >= workloads.scaled(10, PER_RUN, FULL), (what, events)
