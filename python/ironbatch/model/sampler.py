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
draw."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ironbatch.sampling_params import SamplingParams


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


def finite_choices(logits: torch.Tensor) -> torch.Tensor:
    """Logits every choice of which is well defined: NaN never wins, the
    +inf entries (if any) share all the probability, and at least one entry
    is left; else ``SamplingError``."""
    logits = logits.masked_fill(torch.isnan(logits), float("-inf"))
    top = torch.isposinf(logits)
    if top.any():
        logits = torch.zeros_like(logits).masked_fill(~top, float("-inf"))
    if torch.isneginf(logits).all():
        raise SamplingError("no token has a finite logit (all masked, NaN or -inf)")
    return logits


def filter_top_k_top_p_min_p(
    logits: torch.Tensor, top_k: int, top_p: float, min_p: float
) -> torch.Tensor:
    """Keep the top ``top_k`` tokens, the smallest set whose probability
    reaches ``top_p``, and tokens with at least ``min_p`` times the top
    probability; the rest become -inf."""
    if 0 < top_k < logits.shape[0]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = logits.sort(descending=True)
        probs = sorted_logits.softmax(-1)
        # Drop a token if the tokens before it already reach top_p.
        drop = probs.cumsum(-1) - probs >= top_p
        drop[0] = False
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
    if min_p > 0.0:
        probs = logits.softmax(-1)
        logits = logits.masked_fill(probs < min_p * probs.max(), float("-inf"))
    return logits


@dataclass
class Sampled:
    """One step's draws: a token per row (-1 where the row failed), the
    log-softmax of the raw logits (for logprobs), and each failed row's
    reason."""

    tokens: torch.Tensor  # int64 [R]
    logprobs: torch.Tensor  # [R, V]
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
    return int(torch.multinomial(probs, 1, generator=row.generator or generator)[0])


def sample_rows(logits: torch.Tensor, rows: list[RowParams], generator: torch.Generator) -> Sampled:
    """Draw every row; a row that fails is reported, the others are drawn."""
    logprobs = logits.log_softmax(-1)
    tokens = torch.full((len(rows),), -1, dtype=torch.long)
    errors: dict[int, str] = {}
    for i, row in enumerate(rows):
        try:
            tokens[i] = sample_row(logits[i].clone(), row, generator)
        except Exception as e:  # noqa: BLE001 - any failure ends this row only
            errors[i] = f"sampling failed: {type(e).__name__}: {e}"
    return Sampled(tokens, logprobs, errors)
