"""A step's sampling: which rows draw together, their parameters on the
device, and the one copy of the tokens back to the host.

Per request slot the sampler keeps what decides a row's path, so a step
decides with NumPy, not per request:

- plain rows (greedy, no penalties, no logprobs, ``min_tokens`` reached):
  when every row is plain, the step is one argmax;
- batched rows (no penalties, no seed of their own, ``min_tokens``
  reached): one ``sample_batch`` over all of them, parameters uploaded in
  one asynchronous copy, no host sync until the tokens come back;
- the rest (penalties need the request's tokens, a pending ``min_tokens``
  masks stop tokens, a seeded request draws from its own generator): one
  ``sampler.sample_row`` each.

Logprobs (the log-softmax of the raw logits) are computed only for rows
whose request asked for them."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from ironbatch.model import sampler
from ironbatch.model.pinned_buffer import PinnedBuffer
from ironbatch.sampling_params import SAMPLING_EPS, SamplingParams


@dataclass
class StepDraws:
    """A step's tokens, one per sampling row (-1 where the row failed), the
    failed rows' reasons, and the logprobs asked for: the rows (indices into
    the sampling rows) and their log-softmax."""

    tokens: np.ndarray
    errors: dict[int, str]
    logprobs: tuple[np.ndarray, torch.Tensor] | None = None


class StepSampler:
    #: The per-slot arrays, grown together.
    ARRAYS = ("plain", "batched", "wants_logprobs", "min_tokens", "settings")

    def __init__(self, device: torch.device, *, max_rows: int, seed: int) -> None:
        self.device = device
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self.plain = np.zeros(0, dtype=np.bool_)
        self.batched = np.zeros(0, dtype=np.bool_)
        self.wants_logprobs = np.zeros(0, dtype=np.bool_)
        self.min_tokens = np.zeros(0, dtype=np.int32)
        # temperature (0: greedy), top_k (0: off), top_p, min_p
        self.settings = np.zeros((0, 4), dtype=np.float32)
        self.params: dict[int, tuple[SamplingParams, torch.Generator | None]] = {}
        self.upload = PinnedBuffer(4 * max_rows, torch.float32, device)
        #: Seconds spent waiting for the tokens to reach the host, summed:
        #: with nothing else waiting for the device, the step's device time
        #: that its host work did not hide.
        self.wait_seconds = 0.0

    def grow(self, n: int) -> None:
        """Room for slots below ``n``."""
        for name in self.ARRAYS:
            old = getattr(self, name)
            new = np.zeros((n, *old.shape[1:]), dtype=old.dtype)
            new[: len(old)] = old
            setattr(self, name, new)

    def begin_request(self, slot: int, params: SamplingParams) -> None:
        """A request's parameters in its slot; its generator, if seeded,
        is made last (if that fails, the rest is in place)."""
        penalties = (
            params.repetition_penalty != 1.0
            or bool(params.presence_penalty)
            or bool(params.frequency_penalty)
        )
        self.min_tokens[slot] = params.min_tokens
        self.wants_logprobs[slot] = params.logprobs is not None
        self.plain[slot] = params.greedy and not penalties and params.logprobs is None
        self.batched[slot] = not penalties and (params.seed is None or params.greedy)
        self.settings[slot] = (params.temperature, params.top_k, params.top_p, params.min_p)
        self.params[slot] = (params, None)
        if params.seed is not None:
            gen = torch.Generator(device=self.device).manual_seed(params.seed)
            self.params[slot] = (params, gen)

    def all_plain(self, slots: np.ndarray, num_outputs: np.ndarray) -> bool:
        """Whether every row is greedy argmax: plain, ``min_tokens`` reached."""
        return bool(self.plain[slots].all() and (num_outputs >= self.min_tokens[slots]).all())

    def sample(
        self,
        logits: torch.Tensor,
        slots: np.ndarray,
        num_outputs: np.ndarray,
        row_params: Callable[[int], sampler.RowParams],
    ) -> StepDraws:
        """Tokens for the sampling rows (``logits[j]`` is row ``j``'s, of the
        request in ``slots[j]`` with ``num_outputs[j]`` outputs so far);
        ``row_params(j)`` describes row ``j`` for the one-at-a-time path."""
        if self.all_plain(slots, num_outputs):
            return StepDraws(self._to_host(logits.argmax(-1)), {})
        batched = self.batched[slots] & (num_outputs >= self.min_tokens[slots])
        together = np.flatnonzero(batched)
        tokens_dev = None
        if len(together):
            rows = logits if len(together) == len(slots) else logits[self._index(together)]
            tokens_dev = sampler.sample_batch(rows, self._params(slots[together]), self.generator)
        errors: dict[int, str] = {}
        alone = np.flatnonzero(~batched)
        alone_tokens = []
        for j in alone.tolist():
            try:
                token = sampler.sample_row(logits[j].clone(), row_params(j), self.generator)
            except Exception as e:  # noqa: BLE001 - any failure ends this row only
                token = -1
                errors[j] = sampler.failure(e)
            alone_tokens.append(token)
        tokens = np.full(len(slots), -1, dtype=np.int64)
        if tokens_dev is not None:
            tokens[together] = self._to_host(tokens_dev)  # the step's one wait for the device
            for j in together[tokens[together] < 0].tolist():
                errors[j] = sampler.failure(sampler.SamplingError(sampler.NO_CHOICE))
        tokens[alone] = alone_tokens
        draws = StepDraws(tokens, dict(sorted(errors.items())))
        asked = np.flatnonzero(self.wants_logprobs[slots])
        if len(asked):
            rows = logits if len(asked) == len(slots) else logits[self._index(asked)]
            draws.logprobs = (asked, rows.log_softmax(-1))
        return draws

    def _to_host(self, tokens: torch.Tensor) -> np.ndarray:
        start = time.perf_counter()
        host = tokens.cpu().numpy()
        self.wait_seconds += time.perf_counter() - start
        return host

    def _index(self, rows: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(rows).to(self.device)

    def _params(self, slots: np.ndarray) -> sampler.BatchParams:
        """The rows' parameters, uploaded in one copy."""
        n = len(slots)
        settings = self.settings[slots]
        if 4 * n <= self.upload.device_tensor.numel():
            host = self.upload.host()
            host[: 4 * n] = settings.T.reshape(-1)
            self.upload.upload(4 * n)
            dev = self.upload.device_tensor[: 4 * n].view(4, n)
        else:  # more rows than max_num_seqs: not from this engine's runner
            dev = torch.from_numpy(np.ascontiguousarray(settings.T)).to(self.device)
        temperature, top_k, top_p, min_p = settings.T
        greedy = temperature < SAMPLING_EPS
        return sampler.BatchParams(
            temperature=dev[0],
            top_k=dev[1].long(),
            top_p=dev[2],
            min_p=dev[3],
            all_greedy=bool(greedy.all()),
            any_greedy=bool(greedy.any()),
            use_top_k=bool((top_k > 0).any()),
            use_top_p=bool((top_p < 1.0).any()),
            use_min_p=bool((min_p > 0.0).any()),
        )
