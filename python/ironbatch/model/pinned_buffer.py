"""A device buffer filled from the host without a host sync."""

from __future__ import annotations

import numpy as np
import torch


class PinnedBuffer:
    """A flat device buffer and its host twin. On CUDA the twin is pinned
    memory, so ``upload`` is an asynchronous copy that never waits for the
    device; on the CPU the twin is the buffer itself and ``upload`` copies
    nothing."""

    def __init__(self, numel: int, dtype: torch.dtype, device: torch.device) -> None:
        self.device_tensor = torch.zeros(numel, dtype=dtype, device=device)
        self.staged = device.type == "cuda"
        if self.staged:
            self.host_tensor = torch.zeros(numel, dtype=dtype, pin_memory=True)
            # Recorded after each upload: the twin is rewritten only once that
            # copy ran (always so by then, unless the step since never waited
            # for the device).
            self.uploaded = torch.cuda.Event()
        else:
            self.host_tensor = self.device_tensor
        self._host = self.host_tensor.numpy()

    def host(self) -> np.ndarray:
        """The host twin, safe to write."""
        if self.staged:
            self.uploaded.synchronize()
        return self._host

    def upload(self, numel: int) -> None:
        """Start copying the twin's first ``numel`` elements to the device."""
        if self.staged:
            self.device_tensor[:numel].copy_(self.host_tensor[:numel], non_blocking=True)
            self.uploaded.record()
