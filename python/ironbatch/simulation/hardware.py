"""Accelerator presets for the roofline step model: each device's HBM
bandwidth and dense bf16 peak from its vendor's data sheet, and the share of
each a serving engine achieves (the roofline's two efficiencies; the
project's own paged-attention kernel reached 82% of the H200's bandwidth,
benches/RESULTS.md). These are assumptions to override (``roofline:h100,
bandwidth_efficiency=0.7``), not measurements of any one engine."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Device:
    name: str
    #: HBM (or GDDR) bandwidth, bytes per second.
    memory_bandwidth: float
    #: Dense bf16 tensor-core peak, FLOPs per second.
    peak_flops: float
    memory_bytes: float


DEVICES = {
    "h100": Device("H100 SXM5 80GB", 3.35e12, 989e12, 80e9),
    "h200": Device("H200 SXM 141GB", 4.8e12, 989e12, 141e9),
    "a100": Device("A100 SXM4 80GB", 2.039e12, 312e12, 80e9),
    "l4": Device("L4 24GB", 300e9, 121e12, 24e9),
}

# What an engine typically achieves of the peaks, and per-layer launch cost
# (a handful of kernels a layer at a few microseconds each; CUDA graphs
# shrink it).
BANDWIDTH_EFFICIENCY = 0.8
FLOPS_EFFICIENCY = 0.6
LAUNCH_S_PER_LAYER = 15e-6


def device_named(name: str) -> Device:
    try:
        return DEVICES[name.lower()]
    except KeyError:
        raise ValueError(
            f"roofline: unknown device {name!r}; the presets are {sorted(DEVICES)}"
        ) from None
