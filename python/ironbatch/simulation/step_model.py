"""Step-time models: what the simulation's clock charges for a step.

Three ways to name one (``--step-model``):

- ``roofline:DEVICE[,key=value...]``: a device preset (``h100``, ``h200``,
  ``a100``, ``l4``) and a model (``model=`` a preset such as
  ``llama-3.1-8b`` or a model directory's config.json; ``tp=`` tensor
  parallel ranks); ``bandwidth_efficiency``, ``flops_efficiency``,
  ``launch_us_per_layer``, ``overhead_ms`` and ``overhead_per_request_us``
  override the assumptions; ``gpu_memory_utilization`` (vLLM's, 0.9) sizes
  the KV cache from what the weights leave of the device's memory.
- ``linear:key=value,...``: the linear model's coefficients by hand
  (``intercept_s``, ``per_decode_token_s``, ... and ``overhead_per_step_s``,
  ``overhead_per_request_s``).
- a JSON file of format ``ironbatch-step-model/1``, as ``ironbatch profile``
  writes it (the fit and its residuals beside the coefficients)."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ironbatch import _core
from ironbatch.simulation.hardware import (
    BANDWIDTH_EFFICIENCY,
    FLOPS_EFFICIENCY,
    LAUNCH_S_PER_LAYER,
    device_named,
)
from ironbatch.simulation.model_shape import model_shape

FORMAT = "ironbatch-step-model/1"
LINEAR_KEYS = (
    "intercept_s",
    "per_request_s",
    "per_prefill_request_s",
    "per_prefill_token_s",
    "per_decode_token_s",
    "per_sampled_s",
    "per_context_token_s",
    "per_attention_pair_s",
)
ROOFLINE_KEYS = (
    "weight_bytes",
    "kv_bytes_per_token",
    "flops_per_token",
    "flops_per_attention_pair",
    "flops_per_sampled",
    "bytes_per_s",
    "flops_per_s",
    "fixed_s",
)
KINDS = {"linear": LINEAR_KEYS, "roofline": ROOFLINE_KEYS}
DEFAULT = "roofline:h100,model=llama-3.1-8b"
# The roofline's CPU overhead per step unless told: vLLM's scheduler and
# input preparation, about a millisecond plus a little per request.
ROOFLINE_OVERHEAD_S = 1e-3
ROOFLINE_OVERHEAD_PER_REQUEST_S = 5e-6
# vLLM's default share of device memory for weights, activations and KV.
GPU_MEMORY_UTILIZATION = 0.9
# The most any linear coefficient or overhead may charge (an hour a token,
# a step or a request): far beyond any engine, and small enough that no run
# of int32-sized batches can overflow the clock.
MAX_SECONDS = 3600.0


@dataclass(frozen=True)
class StepModel:
    """A step-time model: its kind, coefficients, the engine's CPU overhead
    per step, and (where known) the model's KV bytes per token, which turn
    ``kv_cache_gib`` into blocks."""

    kind: str
    coefficients: dict[str, float]
    overhead_per_step_s: float = 0.0
    overhead_per_request_s: float = 0.0
    description: str = ""
    kv_bytes_per_token: float | None = None
    #: The device memory left for the KV cache (a roofline: the device's
    #: memory at vLLM's gpu_memory_utilization, less the weights), which
    #: sizes the cache when neither num_blocks nor kv_cache_gib is given.
    kv_cache_bytes: float | None = None
    fit: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"step model kind must be one of {sorted(KINDS)}, got {self.kind!r}")
        unknown = sorted(set(self.coefficients) - set(KINDS[self.kind]))
        if unknown:
            raise ValueError(
                f"{self.kind} step model: unknown coefficients {unknown}; "
                f"the coefficients are {list(KINDS[self.kind])}"
            )
        if self.kind == "roofline":
            missing = sorted(set(ROOFLINE_KEYS) - set(self.coefficients))
            if missing:
                raise ValueError(f"roofline step model: missing {missing}")
        for k, v in self.coefficients.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise TypeError(f"step model coefficient {k} must be a number, got {v!r}")
        seconds = dict(self.coefficients) if self.kind == "linear" else {}
        seconds |= {"overhead_per_step_s": self.overhead_per_step_s,
                    "overhead_per_request_s": self.overhead_per_request_s}  # fmt: skip
        for k, v in seconds.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise TypeError(f"{self.kind} step model: {k} must be a number, got {v!r}")
            if not (math.isfinite(v) and 0 <= v <= MAX_SECONDS):
                raise ValueError(
                    f"{self.kind} step model: {k} must be a number of seconds in "
                    f"[0, {MAX_SECONDS:g}], got {v!r}"
                )
        if self.kind == "linear" and not any(seconds.values()):
            raise ValueError(
                "linear step model: every coefficient is 0 (or none was given), so every step "
                "would take no time; give at least one, e.g. "
                "linear:intercept_s=0.005,per_decode_token_s=1e-4"
            )
        for k in ("kv_bytes_per_token", "kv_cache_bytes"):
            v = getattr(self, k)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                                  or not (math.isfinite(v) and v > 0)):  # fmt: skip
                raise ValueError(f"step model {k} must be a finite number > 0, got {v!r}")
        self.to_core()  # every value checked where the clock reads it

    def to_core(self) -> _core.StepTimeModel:
        overhead = {
            "overhead_per_step_s": float(self.overhead_per_step_s),
            "overhead_per_request_s": float(self.overhead_per_request_s),
        }
        values = {k: float(v) for k, v in self.coefficients.items()}
        if self.kind == "linear":
            return _core.StepTimeModel.linear(**values, **overhead)
        return _core.StepTimeModel.roofline(**values, **overhead)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "format": FORMAT,
            "kind": self.kind,
            "description": self.description,
            "coefficients": dict(self.coefficients),
            "overhead": {
                "per_step_s": self.overhead_per_step_s,
                "per_request_s": self.overhead_per_request_s,
            },
        }
        if self.kv_bytes_per_token is not None:
            out["kv_bytes_per_token"] = self.kv_bytes_per_token
        if self.kv_cache_bytes is not None:
            out["kv_cache_bytes"] = self.kv_cache_bytes
        if self.fit:
            out["fit"] = self.fit
        return out

    def save(self, path: str | os.PathLike[str]) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1) + "\n")


def _key_values(body: str, what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in body.split(","))):
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"{what}: expected key=value, got {item!r}")
        out[key.strip()] = value.strip()
    return out


def _number(what: str, key: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{what}: {key} must be a number, got {text!r}") from None
    if not math.isfinite(value):
        raise ValueError(f"{what}: {key} must be a finite number, got {text!r}")
    return value


# Shares of a peak, in (0, 1]; and the other options' largest values (a
# second a layer's launches, an hour a step or a request).
SHARES = ("gpu_memory_utilization", "bandwidth_efficiency", "flops_efficiency")
ROOFLINE_MAX = {"launch_us_per_layer": 1e6, "overhead_ms": 3.6e6, "overhead_per_request_us": 3.6e9}
MAX_TP = 4096
ROOFLINE_OPTIONS = (
    "model",
    "tp",
    "gpu_memory_utilization",
    "bandwidth_efficiency",
    "flops_efficiency",
    "launch_us_per_layer",
    "overhead_ms",
    "overhead_per_request_us",
)


def roofline(spec: str) -> StepModel:
    """``roofline:DEVICE[,key=value...]`` as a step model."""
    body = spec.removeprefix("roofline:")
    device_name, _, rest = body.partition(",")
    device = device_named(device_name.strip())
    options = _key_values(rest, "roofline")
    unknown = sorted(set(options) - set(ROOFLINE_OPTIONS))
    if unknown:
        raise ValueError(f"roofline: unknown keys {unknown}; the keys are {list(ROOFLINE_OPTIONS)}")
    shape = model_shape(options.get("model", "llama-3.1-8b"))
    tp_text = options.get("tp", "1")
    if not (tp_text.isascii() and tp_text.isdigit()) or not 1 <= int(tp_text) <= MAX_TP:
        raise ValueError(f"roofline: tp must be an integer in [1, {MAX_TP}], got {tp_text!r}")
    tp = int(tp_text)

    def option(key: str, default: float) -> float:
        v = _number("roofline", key, options[key]) if key in options else default
        share = key in SHARES
        lo, hi = ("(0", "1]") if share else ("[0", f"{ROOFLINE_MAX[key]:g}]")
        if not ((0 < v <= 1) if share else (0 <= v <= ROOFLINE_MAX[key])):
            raise ValueError(f"roofline: {key} must be in {lo}, {hi}, got {options[key]}")
        return v

    utilization = option("gpu_memory_utilization", GPU_MEMORY_UTILIZATION)
    room = device.memory_bytes * utilization - shape.weight_bytes / tp
    if room <= 0:
        raise ValueError(
            f"roofline: {shape.name}'s weights ({shape.weight_bytes / tp / 1e9:.1f} GB a rank) "
            f"do not fit {device.name} at gpu_memory_utilization {utilization}; add tp="
        )
    bw = option("bandwidth_efficiency", BANDWIDTH_EFFICIENCY)
    fl = option("flops_efficiency", FLOPS_EFFICIENCY)
    launch = option("launch_us_per_layer", LAUNCH_S_PER_LAYER * 1e6) * 1e-6
    # Each rank holds 1/tp of the weights and KV heads and does 1/tp of the
    # FLOPs; the all-reduces are left out.
    coefficients = {
        "weight_bytes": shape.weight_bytes / tp,
        "kv_bytes_per_token": shape.kv_bytes_per_token / tp,
        "flops_per_token": shape.flops_per_token / tp,
        "flops_per_attention_pair": shape.flops_per_attention_pair / tp,
        "flops_per_sampled": shape.flops_per_sampled / tp,
        "bytes_per_s": device.memory_bandwidth * bw,
        "flops_per_s": device.peak_flops * fl,
        "fixed_s": shape.num_layers * launch,
    }
    return StepModel(
        kind="roofline",
        coefficients=coefficients,
        overhead_per_step_s=option("overhead_ms", ROOFLINE_OVERHEAD_S * 1e3) * 1e-3,
        overhead_per_request_s=option(
            "overhead_per_request_us", ROOFLINE_OVERHEAD_PER_REQUEST_S * 1e6
        )
        * 1e-6,
        description=f"roofline: {shape.name} on {device.name}" + (f", tp={tp}" if tp > 1 else ""),
        kv_bytes_per_token=shape.kv_bytes_per_token / tp,
        kv_cache_bytes=room,
    )


def linear(spec: str) -> StepModel:
    """``linear:key=value,...`` as a step model."""
    options = _key_values(spec.removeprefix("linear:"), "linear")
    overhead_keys = ("overhead_per_step_s", "overhead_per_request_s")
    unknown = sorted(set(options) - set(LINEAR_KEYS) - set(overhead_keys))
    if unknown:
        raise ValueError(
            f"linear: unknown keys {unknown}; the keys are {list(LINEAR_KEYS + overhead_keys)}"
        )
    values = {k: _number("linear", k, v) for k, v in options.items()}
    return StepModel(
        kind="linear",
        coefficients={k: v for k, v in values.items() if k in LINEAR_KEYS},
        overhead_per_step_s=values.get("overhead_per_step_s", 0.0),
        overhead_per_request_s=values.get("overhead_per_request_s", 0.0),
        description=spec,
    )


def _field(data: dict[str, Any], key: str, kinds: tuple[type, ...], default: Any,
           source: str, what: str) -> Any:  # fmt: skip
    v = data.get(key, default)
    if v is not default and (isinstance(v, bool) or not isinstance(v, kinds)):
        raise ValueError(f"{source}: {key} must be {what}, got {json.dumps(v)[:60]}")
    return v


def from_json(data: dict[str, Any], source: str = "<json>") -> StepModel:
    """A step model from its JSON form (``StepModel.to_json``); a field of
    the wrong shape is a ValueError naming ``source`` and the field."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        found = data.get("format") if isinstance(data, dict) else None
        raise ValueError(f"{source}: not an {FORMAT} file (format = {found!r})")
    number = (int, float)
    kind = _field(data, "kind", (str,), "", source, f"one of {sorted(KINDS)}")
    coefficients = _field(data, "coefficients", (dict,), {}, source, "an object of numbers")
    overhead = _field(data, "overhead", (dict,), {}, source, "an object of per_step_s, "
                      "per_request_s")  # fmt: skip
    try:
        return StepModel(
            kind=kind,
            coefficients=dict(coefficients),
            overhead_per_step_s=_field(
                overhead, "per_step_s", number, 0.0, source, "a number (overhead.per_step_s)"
            ),  # fmt: skip
            overhead_per_request_s=_field(
                overhead, "per_request_s", number, 0.0, source, "a number (overhead.per_request_s)"
            ),  # fmt: skip
            description=_field(data, "description", (str,), "", source, "a string") or source,
            kv_bytes_per_token=_field(
                data, "kv_bytes_per_token", number, None, source, "a number"
            ),  # fmt: skip
            kv_cache_bytes=_field(data, "kv_cache_bytes", number, None, source, "a number"),
            fit=dict(_field(data, "fit", (dict,), {}, source, "an object")),
        )
    except (ValueError, TypeError) as e:
        message = str(e)
        raise ValueError(message if message.startswith(source) else f"{source}: {e}") from None


def load_step_model(spec: str | os.PathLike[str] | StepModel | None) -> StepModel:
    """The step model ``spec`` names (see the module's text); None is
    DEFAULT."""
    if isinstance(spec, StepModel):
        return spec
    if spec is not None and not isinstance(spec, (str, os.PathLike)):
        raise TypeError(
            "step_model must be a StepModel, 'roofline:DEVICE,...', 'linear:...' or a JSON "
            f"file's path, got {type(spec).__name__}"
        )
    text = DEFAULT if spec is None else os.fspath(spec)
    if text.startswith("roofline:"):
        return roofline(text)
    if text.startswith("linear:"):
        return linear(text)
    path = Path(text)
    if not path.is_file():
        raise ValueError(
            f"step model {text!r}: neither roofline:DEVICE,..., linear:... nor a JSON file"
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{text}: line {e.lineno}, column {e.colno}: not JSON ({e.msg})") from None
    except UnicodeDecodeError:
        raise ValueError(
            f"{text}: not a UTF-8 JSON file (a step model from ironbatch profile)"
        ) from None
    except OSError as e:
        raise ValueError(f"{text}: cannot read the file ({e.strerror or e})") from None
    return from_json(data, text)
