"""The random suites' seeds (tests/seeded.py): a run seed gives the same
workloads again and another gives others; a run's seeds begin the full
size's; a run short of an event goes on, but only so far."""

from __future__ import annotations

from collections import Counter

from seeded import REACH, Workloads


def test_a_run_seed_gives_its_workloads_again_and_another_others() -> None:
    a = Workloads(7, False, "suite.py")
    assert a.seeds(5, 20) == Workloads(7, False, "suite.py").seeds(5, 20)
    assert a.seeds(5, 20) != Workloads(8, False, "suite.py").seeds(5, 20)
    assert a.seeds(5, 20) != Workloads(7, False, "other.py").seeds(5, 20)
    assert a.seeds(5, 20, part="1") != a.seeds(5, 20, part="2")
    full = Workloads(7, True, "suite.py").seeds(5, 20)
    assert len(full) == 20 and full[:5] == a.seeds(5, 20)


def test_counts_scale_with_the_size_rounded_up() -> None:
    assert Workloads(0, False, "s").scaled(20, 20, 60) == 7
    assert Workloads(0, True, "s").scaled(20, 20, 60) == 20
    assert Workloads(0, False, "s").scaled(1, 20, 80) == 1


def test_a_run_short_of_an_event_goes_on_up_to_its_reach() -> None:
    w = Workloads(3, False, "s")
    ran: list[int] = []

    def rare(seed: int) -> Counter:
        ran.append(seed)
        return Counter(rare=len(ran) == 12, common=1)

    events = w.run_covering(rare, {"rare": 1, "common": 5}, per_run=5, full=10)
    assert ran == w.seeds(12, 40)[:12] and events == Counter(rare=1, common=12)
    ran.clear()
    never = w.run_covering(lambda seed: Counter(common=1), {"rare": 1}, per_run=5, full=10)
    assert never == Counter(common=REACH * 10)
