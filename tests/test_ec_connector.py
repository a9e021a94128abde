"""An encoder-cache connector's side of the scheduler (docs/scheduling.md
§4.20) on both backends: the worked example (an image held elsewhere is
loaded without encoder budget; a request whose image is in transit waits),
the calls in vLLM's order, a connector that raises, and bad setups. (The
core against the twin over random workloads with the stand-in is in
tests/test_scheduler_differential.py.)"""

from __future__ import annotations

import sys
from typing import Any

import pytest

from ironbatch import MultimodalInput

from scheduler_helpers import BACKENDS, make, req, step


class Scripted:
    """Holds the identifiers in ``held``; ``in_transit[request]`` asks
    answered "still in transit"; every call logged."""

    def __init__(self, held: set[str], in_transit: dict[str, int] | None = None) -> None:
        self.held = held
        self.in_transit = dict(in_transit or {})
        self.log: list[tuple[Any, ...]] = []

    def has_cache_item(self, identifier: str) -> bool:
        self.log.append(("has_cache_item", identifier))
        return identifier in self.held

    def ensure_cache_available(self, request_id: str, num_computed_tokens: int) -> bool:
        self.log.append(("ensure", request_id, num_computed_tokens))
        if self.in_transit.get(request_id, 0) > 0:
            self.in_transit[request_id] -= 1
            return False
        return True

    def update_state_after_alloc(self, request_id: str, input_id: int) -> None:
        self.log.append(("alloc", request_id, input_id))

    def update_state_after_free(self, request_id: str, input_id: int) -> None:
        self.log.append(("free", request_id, input_id))

    def request_finished(self, request_id: str) -> bool:
        self.log.append(("finished", request_id))
        return False


def scheduler(backend: str, connector: Any, compute: int = 20) -> Any:
    s = make(
        backend,
        max_num_seqs=4,
        max_num_batched_tokens=64,
        encoder_compute_budget=compute,
        encoder_cache_size=200,
    )
    s.set_ec_connector(connector)
    return s


def two_images(rid: str = "r") -> Any:
    """A 60-token prompt with two 20-embedding images, at 4 and at 30."""
    images = [MultimodalInput(4, 20, "a"), MultimodalInput(30, 20, "b")]
    return req(rid, [9] * 60, max_tokens=2, images=images)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_worked_example(backend: str) -> None:
    """§4.20: with a 20-embedding encoder budget the encoder runs one of
    the two images a step; the connector holds image "a", so both are there
    in the first step (it takes cache space, no budget), and the whole
    prompt runs. The connector hears of each allocation (the encoder's
    first) and of each release once the placeholders are computed."""
    c = Scripted(held={"a"})
    s = scheduler(backend, c)
    s.add_request(two_images())
    out, _ = step(s)
    assert out.num_scheduled_tokens == {"r": 60}
    assert out.scheduled_encoder_inputs == {"r": [1]}  # "a" is loaded, not run
    assert c.log == [
        ("ensure", "r", 0),
        ("has_cache_item", "a"),
        ("has_cache_item", "b"),
        ("alloc", "r", 1),
        ("alloc", "r", 0),
        ("free", "r", 0),
        ("free", "r", 1),
    ]
    c.log.clear()
    out, outputs = step(s)
    assert out.num_scheduled_tokens == {"r": 1}
    assert outputs[0][2] == "length"
    assert c.log == [("ensure", "r", 60), ("finished", "r")]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_connector_that_holds_nothing_leaves_the_budget_to_cut(backend: str) -> None:
    s = scheduler(backend, Scripted(held=set()))
    s.add_request(two_images())
    assert step(s)[0].num_scheduled_tokens == {"r": 30}
    assert step(s)[0].num_scheduled_tokens == {"r": 30}


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_request_whose_images_are_in_transit_waits(backend: str) -> None:
    """Waiting, it is skipped (and asked again each step) while the others
    are admitted; running, it sits out a step. A request without images is
    never asked."""
    c = Scripted(held=set(), in_transit={"r": 2})
    s = scheduler(backend, c, compute=100)
    s.add_request(two_images())
    s.add_request(req("q", [8] * 8, max_tokens=3))
    assert step(s)[0].num_scheduled_tokens == {"q": 8}
    assert step(s)[0].num_scheduled_tokens == {"q": 1}
    assert [x for x in c.log if x[0] == "ensure"] == [("ensure", "r", 0)] * 2
    assert step(s)[0].num_scheduled_tokens == {"q": 1, "r": 60}
    c.in_transit["r"] = 1
    assert step(s)[0].num_scheduled_tokens == {}
    assert step(s)[0].num_scheduled_tokens == {"r": 1}


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_connector_that_raises_costs_encoder_work_not_requests(backend: str) -> None:
    """Every call raises: each is reported, and counts as the safe answer
    (not held: the encoder runs it; not in transit; no hold)."""

    class Broken:
        def __getattr__(self, name: str) -> Any:
            def fail(*args: Any) -> Any:
                raise RuntimeError(f"{name} is broken")

            return fail

    reported: list[Any] = []
    hook = sys.unraisablehook
    sys.unraisablehook = reported.append
    try:
        s = scheduler(backend, Broken())
        s.add_request(two_images())
        assert step(s)[0].num_scheduled_tokens == {"r": 30}
        assert step(s)[0].num_scheduled_tokens == {"r": 30}
        assert step(s)[1][0][2] == "length"
    finally:
        sys.unraisablehook = hook
    assert reported and all("is broken" in str(r.exc_value) for r in reported)
    assert s.num_free_blocks == 9999


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_connector_needs_a_shared_encoder_and_comes_first(backend: str) -> None:
    with pytest.raises(ValueError, match="ec_connector: the scheduler needs an encoder"):
        make(backend).set_ec_connector(Scripted(set()))
    s = make(backend, encoder_compute_budget=20, encoder_cache_size=200)
    s.add_request(req("r", [1, 2, 3]))
    with pytest.raises(ValueError, match="ec_connector: it must be set before the first request"):
        s.set_ec_connector(Scripted(set()))
