"""``ironbatch profile``: fit a step-time model of the real engine on this
device. The engine (``LLMEngine``, this machine's model runner) runs a grid
of batch shapes — decode batches of several sizes and context lengths,
whole prompts, and prompt chunks beside decodes — and every step is timed:
the model runner's ``execute`` (the forward and sampling) and the whole
``step()`` (the scheduler and output processing besides). Least squares
with non-negative coefficients, weighted to fit relative error, gives the
linear model of the forward (``per_prefill_token_s``, ``per_context_token_s``,
...) and of the CPU overhead (per step and per request); the JSON keeps the
fit's quality and every sample with its residual."""

from __future__ import annotations

import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ironbatch.simulation.batch_shape import FEATURES, BatchShape, batch_shape
from ironbatch.simulation.step_model import LINEAR_KEYS, StepModel

# The linear model's coefficient for each shape feature (the intercept is
# the constant column).
FEATURE_COEFFICIENTS = dict(zip(FEATURES, LINEAR_KEYS[1:], strict=True))


@dataclass(frozen=True)
class Sample:
    """One timed step: the forward's and the whole step's seconds, on the
    wall clock and in this thread's CPU time."""

    shape: BatchShape
    forward_s: float
    step_s: float
    forward_cpu_s: float
    step_cpu_s: float


def nnls(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient >= 0: drop the most negative
    one and solve again until none is (an active-set shortcut, enough for a
    handful of features)."""
    active = list(range(a.shape[1]))
    x = np.zeros(a.shape[1])
    while active:
        sol, *_ = np.linalg.lstsq(a[:, active], y, rcond=None)
        if (sol >= 0).all():
            x[active] = sol
            break
        active.pop(int(np.argmin(sol)))
    return x


def fit_linear(features: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Coefficients (intercept first) minimising relative error."""
    a = np.column_stack([np.ones(len(y)), features]) / y[:, None]
    return nnls(a, np.ones(len(y)))


class _TimedRunner:
    """The engine's runner, its ``execute`` timed and the step's shape noted."""

    def __init__(self, runner: Any) -> None:
        self.runner = runner
        self.last: tuple[BatchShape, float, float] | None = None

    def execute(self, out: Any, eos_token_ids: Any) -> Any:
        shape = batch_shape(out.num_scheduled, out.num_computed_tokens, out.samples)
        t0, c0 = time.perf_counter(), time.thread_time()
        result = self.runner.execute(out, eos_token_ids)
        self.last = (shape, time.perf_counter() - t0, time.thread_time() - c0)
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self.runner, name)


@dataclass(frozen=True)
class ProfileGrid:
    """The batch shapes timed: decode batches of each size at each context
    length (their prompts timed too, as whole-prompt steps), and prompts of
    each length, in one request or split among ``new_requests``, alone and
    beside ``mixed_batches`` decoders."""

    decode_batches: tuple[int, ...] = (1, 4, 16, 64, 128)
    contexts: tuple[int, ...] = (64, 512, 2048)
    prefills: tuple[int, ...] = (128, 512, 2048)
    mixed_batches: tuple[int, ...] = (4, 16)
    new_requests: tuple[int, ...] = (1, 4)

    def points(self, max_len: int) -> list[dict[str, int]]:
        """(decoders, context, prefill, new) points that fit ``max_len``."""
        pts = [
            {"decoders": b, "context": c, "prefill": 0, "new": 0}
            for b in self.decode_batches
            for c in self.contexts
        ]
        pts += [
            {"decoders": b, "context": 32, "prefill": p, "new": k}
            for b in (0, *self.mixed_batches)
            for p in self.prefills
            for k in self.new_requests
            if p >= k
        ]
        return [p for p in pts if p["context"] + 64 < max_len and p["prefill"] + 64 < max_len]


FULL_GRID = ProfileGrid()
QUICK_GRID = ProfileGrid(
    decode_batches=(1, 4, 16, 32), contexts=(32, 256), prefills=(32, 256), mixed_batches=(4, 16)
)


def collect(engine: Any, *, grid: ProfileGrid, repeats: int, seed: int) -> list[Sample]:
    """Time the engine on the grid; every step is a sample."""
    from ironbatch.sampling_params import SamplingParams

    timed = _TimedRunner(engine.runner)
    engine.runner = timed
    rng = np.random.default_rng(seed)
    vocab = engine.model_config.vocab_size
    samples: list[Sample] = []
    ids = iter(range(1 << 30))

    def prompt(n: int) -> dict[str, list[int]]:
        return {"prompt_token_ids": rng.integers(3, vocab, n).tolist()}

    def step(record: bool) -> None:
        t0, c0 = time.perf_counter(), time.thread_time()
        engine.step()  # streaming outputs, as a server steps
        total, cpu = time.perf_counter() - t0, time.thread_time() - c0
        if record and timed.last is not None:
            shape, forward, forward_cpu = timed.last
            samples.append(Sample(shape, forward, total, forward_cpu, cpu))
        timed.last = None

    def drain(record: bool) -> None:
        while engine.has_unfinished_requests():
            step(record)

    # Warm up (allocator, kernels' first calls), unrecorded.
    for _ in range(4):
        warm = SamplingParams(max_tokens=4, ignore_eos=True)
        engine.add_request(str(next(ids)), prompt(64), warm)
    drain(False)
    for point in grid.points(engine.max_model_len):
        b, c, p, k = point["decoders"], point["context"], point["prefill"], point["new"]
        for _ in range(b):
            engine.add_request(
                str(next(ids)), prompt(c), SamplingParams(max_tokens=repeats + 2, ignore_eos=True)
            )
        if p:
            if b:
                step(True)  # the decoders' prompts; the next step decodes them
            once = SamplingParams(max_tokens=2, ignore_eos=True)
            for _ in range(k):
                engine.add_request(str(next(ids)), prompt(p // k), once)
        drain(True)
    engine.runner = timed.runner
    return samples


def _quality(predicted: np.ndarray, measured: np.ndarray) -> dict[str, float]:
    rel = np.abs(predicted - measured) / measured
    ss_res = float(((predicted - measured) ** 2).sum())
    ss_tot = float(((measured - measured.mean()) ** 2).sum()) or 1.0
    return {
        "r2": 1 - ss_res / ss_tot,
        "median_abs_rel_error": float(np.median(rel)),
        "p90_abs_rel_error": float(np.percentile(rel, 90)),
    }


def fit_robust(features: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``fit_linear`` after setting aside the samples the first fit misses
    by more than three times its median relative error: steps another
    process on a shared machine slowed down, not the engine's cost."""
    coef = fit_linear(features, y)
    predicted = np.column_stack([np.ones(len(y)), features]) @ coef
    rel = np.abs(predicted - y) / y
    keep = rel <= max(3 * float(np.median(rel)), 0.05)
    if keep.sum() >= features.shape[1] + 2 and not keep.all():
        coef = fit_linear(features[keep], y[keep])
    return coef


CLOCKS = ("wall", "cpu")


def fit_samples(samples: list[Sample], description: str, clock: str = "wall") -> StepModel:
    """The linear step model (and overhead) of ``samples``, with the fit:
    of wall-clock seconds, or (``clock="cpu"``) of this thread's CPU
    seconds, which other processes on a shared machine do not inflate."""
    if clock not in CLOCKS:
        raise ValueError(f"clock must be one of {CLOCKS}, got {clock!r}")
    if len(samples) < len(FEATURES) + 2:
        raise ValueError(f"profile: {len(samples)} samples are too few to fit")
    x = np.array([[getattr(s.shape, f) for f in FEATURES] for s in samples], dtype=np.float64)
    cpu = clock == "cpu"
    forward = np.array([s.forward_cpu_s if cpu else s.forward_s for s in samples])
    step = np.array([s.step_cpu_s if cpu else s.step_s for s in samples])
    overhead = np.maximum(step - forward, 1e-7)
    coef = fit_robust(x, forward)
    oc = fit_robust(x[:, :1], overhead)  # per step, per request
    predicted = np.column_stack([np.ones(len(x)), x]) @ coef
    predicted_step = predicted + oc[0] + oc[1] * x[:, 0]
    fit = {
        "clock": clock,
        "samples": len(samples),
        # Above 1: other processes took the core during the profile.
        "wall_over_cpu": sum(s.step_s for s in samples) / sum(s.step_cpu_s for s in samples),
        "forward": _quality(predicted, forward),
        "step": _quality(predicted_step, forward + overhead),
        "rows": [
            {**s.shape.as_dict(), "forward_s": s.forward_s, "step_s": s.step_s,
             "forward_cpu_s": s.forward_cpu_s, "step_cpu_s": s.step_cpu_s,
             "predicted_step_s": float(p), "residual_s": float(m - p)}
            for s, p, m in zip(samples, predicted_step, step, strict=True)
        ],
    }  # fmt: skip
    fit.update(fit["step"])
    coefficients = {"intercept_s": float(coef[0])}
    for f, v in zip(FEATURES, coef[1:], strict=True):
        coefficients[FEATURE_COEFFICIENTS[f]] = float(v)
    return StepModel(
        kind="linear",
        coefficients=coefficients,
        overhead_per_step_s=float(oc[0]),
        overhead_per_request_s=float(oc[1]),
        description=description,
        fit=fit,
    )


# A fit worse than either is not a model of this engine: the simulator would
# charge steps times they did not take.
MIN_R2 = 0.9
MAX_MEDIAN_ERROR = 0.15
# Wall time over CPU time inside the steps above which other processes were
# taking the CPU.
BUSY_MACHINE = 1.2


def fit_problems(fit: dict[str, Any]) -> list[str]:
    """Why the fit ``fit_samples`` recorded is too poor to simulate with
    (empty when it is good enough): what is off, and the likely cause."""
    problems = []
    if fit["r2"] < MIN_R2:
        problems.append(f"R^2 is {fit['r2']:.2f} (at least {MIN_R2} is a usable fit): the batch "
                        "shape explains little of how step times vary")  # fmt: skip
    if fit["median_abs_rel_error"] > MAX_MEDIAN_ERROR:
        problems.append(f"the median error is {fit['median_abs_rel_error']:.1%} (at most "
                        f"{MAX_MEDIAN_ERROR:.0%} is usable)")  # fmt: skip
    if not problems:
        return []
    busy = fit.get("wall_over_cpu", 1.0)
    if fit.get("clock") == "wall" and busy > BUSY_MACHINE:
        problems.append(
            f"likely cause: other processes took the CPU during the profile (wall time was "
            f"{busy:.1f}x the CPU time); profile on a quiet machine, or pass --clock cpu "
            "--threads 1"
        )
    elif fit["samples"] < 60:
        problems.append(f"likely cause: only {fit['samples']} timed steps; raise --repeats "
                        "or drop --quick")  # fmt: skip
    else:
        problems.append("likely cause: noisy step times (a shared or throttled device); "
                        "profile on a quiet machine, raise --repeats, or on a CPU pass "
                        "--clock cpu --threads 1")  # fmt: skip
    return problems


def profile_engine(
    model: str | None,
    *,
    device: str | None = None,
    dtype: str = "auto",
    quick: bool = False,
    grid: ProfileGrid | None = None,
    repeats: int = 3,
    seed: int = 0,
    clock: str = "wall",
    engine_args: dict[str, Any] | None = None,
    log: Callable[[str], None] = lambda s: None,
) -> StepModel:
    """Fit a step model of ``LLMEngine`` on ``model`` (default: the demo's
    random-weight Llama) on this device; ``engine_args`` are EngineArgs
    fields (the deployment's, so the engine profiled is the one simulated)."""
    import tempfile

    from ironbatch.engine import EngineArgs, LLMEngine
    from ironbatch.model.random_model import write_random_llama

    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    tmp = None
    if model is None:
        tmp = tempfile.TemporaryDirectory(prefix="ironbatch-profile-")
        model = str(write_random_llama(tmp.name, seed=seed))
        dtype = "float32" if dtype == "auto" else dtype
    args = {"max_num_seqs": 256, "max_num_batched_tokens": 4096, "enable_prefix_caching": False}
    args |= engine_args or {}
    engine = LLMEngine(EngineArgs(model=model, dtype=dtype, device=device, seed=seed, **args))
    log(f"profile: {model} on {engine.device} ({'quick ' if quick else ''}grid)")
    grid = grid or (QUICK_GRID if quick else FULL_GRID)
    name = model if tmp is None else "demo model"
    result = profile(engine, name, grid=grid, repeats=repeats, seed=seed, clock=clock)
    if tmp is not None:
        tmp.cleanup()
    return result


def profile(
    engine: Any,
    name: str,
    *,
    grid: ProfileGrid = FULL_GRID,
    repeats: int = 3,
    seed: int = 0,
    clock: str = "wall",
) -> StepModel:
    """Fit a step model of an engine already built (it is left idle, its
    requests done): what ``profile_engine`` does once it has one."""
    samples = collect(engine, grid=grid, repeats=repeats, seed=seed)
    where = engine.device.type
    if where == "cpu":
        where += f" ({platform.processor() or platform.machine()})"
    return fit_samples(samples, f"fitted ({clock} clock): {name} on {where}", clock)
