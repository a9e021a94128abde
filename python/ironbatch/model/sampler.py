"""The sampler: one token per sampling row, from the step's logits.

Per row, in order: penalties (repetition on prompt + output, presence and
frequency on output), ``min_tokens`` (EOS and stop tokens masked until
enough tokens exist, whatever ``ignore_eos`` says, as vLLM 0.33's sampler
does), then greedy, or temperature, top-k, top-p and min-p followed by a
draw. A seeded request draws from its own generator, so its samples do not
depend on who else is in the batch.

Rows fail alone: logits that leave no finite choice (NaN everywhere, every
token masked) end that row with an error, never the batch; NaN never wins
and +inf logits share the probability, so nothing non-finite reaches the
draw.

The filters and the draw work on a batch of rows at once (``sample_batch``),
with per-row parameters as device tensors and no host sync: a token is a
draw ``argmax(p / E)`` with ``E ~ Exp(1)`` (distributed as ``p``), a failed
row comes back as -1. Rows with penalties, a pending ``min_tokens`` or a
seed of their own go through ``sample_row`` one at a time
(``model/step_sampler.py`` decides which)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ironbatch.sampling_params import SAMPLING_EPS, SamplingParams


@dataclass
class RowParams:
    """What the sampler needs of one sampling row."""

    params: SamplingParams
    prompt: torch.Tensor  # int64 [P]
    output: torch.Tensor  # int64 [O]: the output tokens so far
    eos_token_ids: tuple[int, ...]
    generator: torch.Generator | None = field(default=None, repr=False)


def apply_penalties(logits: torch.Tensor, row: RowParams) -> torch.Tensor:
    p = row.params
    if p.repetition_penalty != 1.0:
        seen = torch.cat([row.prompt, row.output]).unique()
        vals = logits[seen]
        logits[seen] = torch.where(
            vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty
        )
    if (p.presence_penalty or p.frequency_penalty) and row.output.numel():
        counts = torch.bincount(row.output, minlength=logits.shape[0])[: logits.shape[0]]
        logits -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0)
    return logits


def mask_min_tokens(logits: torch.Tensor, row: RowParams) -> torch.Tensor:
    """Until ``min_tokens`` outputs exist, no stop token and no EOS may be
    drawn; ``ignore_eos`` does not lift the EOS mask (vLLM's
    ``all_stop_token_ids`` always hold the model's EOS)."""
    if row.output.numel() < row.params.min_tokens:
        vocab = logits.shape[0]
        banned = [t for t in (*row.params.stop_token_ids, *row.eos_token_ids) if t < vocab]
        if banned:
            logits[torch.tensor(banned, dtype=torch.long)] = float("-inf")
    return logits


class SamplingError(ValueError):
    """A row whose logits leave nothing to choose."""


NO_CHOICE = "no token has a finite logit (all masked, NaN or -inf)"


def finite_rows(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row of ``[R, V]`` logits, logits every choice of which is well
    defined (NaN never wins; if any entry is +inf, the +inf entries share all
    the probability), and whether the row has anything left to choose. No
    host sync."""
    logits = logits.masked_fill(torch.isnan(logits), float("-inf"))
    top = torch.isposinf(logits)
    shared = torch.zeros_like(logits).masked_fill(~top, float("-inf"))
    logits = torch.where(top.any(-1, keepdim=True), shared, logits)
    return logits, ~torch.isneginf(logits).all(-1)


def finite_choices(logits: torch.Tensor) -> torch.Tensor:
    """``finite_rows`` for one row ``[V]``; ``SamplingError`` if nothing is
    left."""
    rows, ok = finite_rows(logits[None])
    if not bool(ok[0]):
        raise SamplingError(NO_CHOICE)
    return rows[0]


def filter_rows(
    logits: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    *,
    use_top_k: bool = True,
    use_top_p: bool = True,
    use_min_p: bool = True,
) -> torch.Tensor:
    """Per row of ``[R, V]`` logits: keep the top ``top_k`` tokens (int64
    ``[R]``, 0 or >= V: all), the smallest set whose probability reaches
    ``top_p`` (``[R]``, 1.0: all), and tokens with at least ``min_p`` times
    the top probability (``[R]``); the rest become -inf. The ``use_*`` flags
    (known on the host) skip a filter no row uses; none of it syncs."""
    vocab = logits.shape[-1]
    neg_inf = float("-inf")
    if use_top_k or use_top_p:
        sorted_logits, order = logits.sort(-1, descending=True)
        if use_top_k:
            k = torch.where((top_k <= 0) | (top_k >= vocab), vocab, top_k)
            kth = sorted_logits.gather(-1, (k - 1)[:, None])
            logits = logits.masked_fill(logits < kth, neg_inf)
            sorted_logits = sorted_logits.masked_fill(sorted_logits < kth, neg_inf)
        if use_top_p:
            probs = sorted_logits.softmax(-1)
            # Drop a token if the tokens before it already reach top_p; a row
            # at 1.0 keeps everything (its sum may round to 1 early).
            threshold = torch.where(top_p < 1.0, top_p, float("inf"))[:, None]
            drop = probs.cumsum(-1) - probs >= threshold
            drop[:, 0] = False
            logits = logits.masked_fill(torch.zeros_like(drop).scatter(-1, order, drop), neg_inf)
    if use_min_p:
        probs = logits.softmax(-1)
        floor = min_p[:, None] * probs.max(-1, keepdim=True).values
        logits = logits.masked_fill(probs < floor, neg_inf)
    return logits


def filter_top_k_top_p_min_p(
    logits: torch.Tensor, top_k: int, top_p: float, min_p: float
) -> torch.Tensor:
    """``filter_rows`` for one row ``[V]`` with its parameters."""
    dev = logits.device
    return filter_rows(
        logits[None],
        torch.tensor([top_k], device=dev),
        torch.tensor([top_p], device=dev),
        torch.tensor([min_p], device=dev),
        use_top_k=0 < top_k < logits.shape[0],
        use_top_p=top_p < 1.0,
        use_min_p=min_p > 0.0,
    )[0]


def draw_from_logits(logits: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One token per row of ``logits`` ``[R, V]`` (float, no NaN, no +inf;
    best shifted so that the largest is 0: noise is lost against huge ones),
    token ``i`` with probability ``softmax(logits[r])[i]``: the argmax of
    ``logits - log E``, ``E`` i.i.d. Exp(1) (the Gumbel-max trick: equally,
    the smallest of independent exponentials of rates ``p_i`` is ``i``'s
    with probability ``p_i``). No softmax, no host sync, unlike a
    multinomial. ``E`` is kept above 0, where ``log`` would win outright."""
    noise = torch.empty_like(logits).exponential_(generator=generator)
    noise.clamp_min_(torch.finfo(logits.dtype).tiny).log_()
    return (logits - noise).argmax(-1)


def draw(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """``draw_from_logits`` given probabilities ``[R, V]`` (zeros never drawn)."""
    return draw_from_logits(probs.log(), generator)


@dataclass
class BatchParams:
    """The sampling parameters of rows drawn together: device tensors, and
    what the host knows without looking at them."""

    temperature: torch.Tensor  # fp32 [R]; 0 on greedy rows
    top_k: torch.Tensor  # int64 [R]; 0: off
    top_p: torch.Tensor  # fp32 [R]; 1.0: off
    min_p: torch.Tensor  # fp32 [R]; 0: off
    all_greedy: bool
    any_greedy: bool
    use_top_k: bool
    use_top_p: bool
    use_min_p: bool


def sample_batch(
    logits: torch.Tensor, params: BatchParams, generator: torch.Generator
) -> torch.Tensor:
    """One token per row (int64 on the logits' device), -1 where the row has
    no finite choice; greedy rows take their argmax. As ``sample_row`` but in
    few passes over the ``[R, V]`` logits (the vocabulary makes them large):
    NaN becomes -inf and +inf the largest finite value, so +inf entries tie
    at the row's maximum; each row is shifted by its maximum (the tied
    entries to 0, where the noise splits the draw among them, and no noise
    is lost to rounding against large logits); a greedy argmax takes the
    first of them. No host sync."""
    neg_inf = float("-inf")
    x = torch.nan_to_num(logits, nan=neg_inf, posinf=torch.finfo(logits.dtype).max, neginf=neg_inf)
    top = x.amax(-1, keepdim=True)
    ok = top[:, 0] > neg_inf
    tokens = x.argmax(-1) if params.any_greedy else None
    if not params.all_greedy:
        greedy = params.temperature < SAMPLING_EPS
        scaled = (x - top).div_(torch.where(greedy, 1.0, params.temperature)[:, None])
        filtered = filter_rows(
            scaled,
            params.top_k,
            params.top_p,
            params.min_p,
            use_top_k=params.use_top_k,
            use_top_p=params.use_top_p,
            use_min_p=params.use_min_p,
        )
        drawn = draw_from_logits(filtered, generator)
        tokens = drawn if tokens is None else torch.where(greedy, tokens, drawn)
    assert tokens is not None
    return torch.where(ok, tokens, -1)


@dataclass
class Sampled:
    """Draws, one token per row (-1 where the row failed), and each failed
    row's reason."""

    tokens: np.ndarray  # int64 [R]
    errors: dict[int, str]


def processed_logits(logits: torch.Tensor, row: RowParams) -> torch.Tensor:
    """A row's logits after penalties and the ``min_tokens`` mask, with a
    well-defined choice (``logits`` is changed): greedy takes their argmax."""
    return finite_choices(mask_min_tokens(apply_penalties(logits, row), row))


def sampling_probs(x: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution a non-greedy row draws from, given its processed
    logits: temperature, then top-k, top-p and min-p."""
    p = params
    x = finite_choices(filter_top_k_top_p_min_p(x / p.temperature, p.top_k, p.top_p, p.min_p))
    return x.softmax(-1)


def sample_row(logits: torch.Tensor, row: RowParams, generator: torch.Generator) -> int:
    """One row's token (``logits`` is that row's, and is changed)."""
    x = processed_logits(logits, row)
    if row.params.greedy:
        return int(x.argmax())
    probs = sampling_probs(x, row.params)
    return int(draw(probs[None], row.generator or generator)[0])


def sample_rows(logits: torch.Tensor, rows: list[RowParams], generator: torch.Generator) -> Sampled:
    """Draw every row, one at a time; a row that fails is reported, the
    others are drawn."""
    tokens = np.full(len(rows), -1, dtype=np.int64)
    errors: dict[int, str] = {}
    for i, row in enumerate(rows):
        try:
            tokens[i] = sample_row(logits[i].clone(), row, generator)
        except Exception as e:  # noqa: BLE001 - any failure ends this row only
            errors[i] = failure(e)
    return Sampled(tokens, errors)


def failure(e: BaseException) -> str:
    """A failed row's reason."""
    return f"sampling failed: {type(e).__name__}: {e}"
