"""``ironbatch profile``'s fit: known coefficients are recovered from
samples, a step another process slowed is set aside, and the JSON keeps the
fit and every sample's residual."""

from __future__ import annotations

import numpy as np

from ironbatch.simulation import load_step_model
from ironbatch.simulation.batch_shape import batch_shape
from ironbatch.simulation.profile import Sample, fit_samples, nnls


def samples(slow_one: bool = False) -> list[Sample]:
    rng = np.random.default_rng(0)
    out = []
    for k in range(60):
        rows = int(rng.integers(1, 32))
        prefill = int(rng.integers(0, 3))
        tokens = [int(rng.integers(16, 400)) for _ in range(prefill)] + [1] * rows
        computed = [0] * prefill + rng.integers(10, 900, rows).tolist()
        shape = batch_shape(tokens, computed, [True] * len(tokens))
        forward = 0.004 + 2e-5 * shape.num_prefill_tokens + 1e-4 * shape.num_decode_tokens
        forward += 1e-7 * shape.context_tokens
        step = forward + 3e-4 + 2e-6 * shape.num_requests
        if slow_one and k == 7:
            forward, step = forward * 5, step * 5  # a neighbour took the core
        out.append(Sample(shape, forward, step, forward, step))
    return out


def test_known_coefficients_are_recovered() -> None:
    m = fit_samples(samples(), "synthetic")
    c = m.coefficients
    assert abs(c["intercept_s"] - 0.004) < 2e-4
    assert abs(c["per_prefill_token_s"] - 2e-5) < 1e-6
    assert abs(c["per_decode_token_s"] + c["per_sampled_s"] + c["per_request_s"] - 1e-4) < 5e-6
    assert abs(m.overhead_per_step_s - 3e-4) < 3e-5
    assert m.fit["median_abs_rel_error"] < 0.01
    assert all(v >= 0 for v in c.values())


def test_a_step_slowed_by_a_neighbour_is_set_aside() -> None:
    m = fit_samples(samples(slow_one=True), "synthetic")
    assert abs(m.coefficients["intercept_s"] - 0.004) < 3e-4
    rows = m.fit["rows"]
    assert len(rows) == 60 and max(abs(r["residual_s"]) for r in rows) == abs(rows[7]["residual_s"])


def test_the_fitted_model_round_trips(tmp_path) -> None:  # type: ignore[no-untyped-def]
    m = fit_samples(samples(), "synthetic")
    m.save(tmp_path / "m.json")
    again = load_step_model(tmp_path / "m.json")
    assert again.coefficients == m.coefficients and again.fit["samples"] == 60


def test_nnls_keeps_coefficients_non_negative() -> None:
    a = np.array([[1.0, 1.0], [1.0, 2.0], [1.0, 3.0]])
    y = np.array([3.0, 2.0, 1.0])  # a negative slope: clipped to 0
    x = nnls(a, y)
    assert (x >= 0).all() and abs(x[0] - 2.0) < 1e-9 and x[1] == 0
