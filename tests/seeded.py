"""This run's random workloads (docs/testing.md): their seeds follow from the
run's seed, so each run draws new ones and IRONBATCH_SEED gives the same
again; a suite runs fewer of them than at full size (IRONBATCH_FULL=1)."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

SEED_LIMIT = 2**32
# A suite whose run misses an event it counts runs more workloads, up to
# REACH times its full size.
REACH = 4


@dataclass(frozen=True)
class Workloads:
    run_seed: int
    full: bool
    suite: str  # the test file's name: its tests share their seeds

    def size(self, per_run: int, full: int) -> int:
        return full if self.full else per_run

    def scaled(self, count: int, per_run: int, full: int) -> int:
        """A count asked of ``full`` workloads, for this run's size (rounded up)."""
        return -(-count * self.size(per_run, full) // full)

    def seeds(self, per_run: int, full: int, part: str = "") -> list[int]:
        """``per_run`` workload seeds, or ``full`` at full size; a part (a
        chunk of a suite) has seeds of its own. A run's seeds begin the full
        size's list of the same run seed."""
        return self._stream(part, self.size(per_run, full))

    def run_covering(
        self,
        run: Callable[[int], Counter],
        needs: Mapping[str, int],
        per_run: int,
        full: int,
        part: str = "",
    ) -> Counter:
        """Runs this run's workloads, adding up their events, then more (up
        to REACH times the full size) while an event is short of its count
        in ``needs``: random seeds may leave a rare event out of a run, and
        that must cost time, not fail the run by chance."""
        size = self.size(per_run, full)
        events: Counter = Counter()
        for i, seed in enumerate(self._stream(part, REACH * full)):
            if i >= size and all(events[what] >= n for what, n in needs.items()):
                break
            try:
                events += run(seed)
            except AssertionError as e:
                raise AssertionError(f"workload seed {seed}: {e}") from e
        return events

    def _stream(self, part: str, n: int) -> list[int]:
        rng = random.Random(f"{self.run_seed}:{self.suite}:{part}")
        return [rng.randrange(SEED_LIMIT) for _ in range(n)]


def run_machine(machine: Any, examples: int, full_examples: int, steps: int, full: bool) -> None:
    """A Hypothesis state machine, ``examples`` runs (``full_examples`` at
    full size) of ``steps`` steps; Hypothesis takes the run's seed."""
    # Here, not at the top: the drop-in's venv has no Hypothesis.
    from hypothesis import HealthCheck, settings
    from hypothesis.stateful import run_state_machine_as_test

    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=full_examples if full else examples,
            stateful_step_count=steps,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
