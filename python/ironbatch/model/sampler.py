"""The sampler: one token per sampling row, from the step's logits.

Per row, in order: penalties (repetition on prompt + output, presence and
frequency on output), ``min_tokens`` (EOS and stop tokens masked until
enough tokens exist, as vLLM's sampler does), then greedy, or temperature,
top-k, top-p and min-p followed by a draw. A seeded request draws from its
own generator, so its samples do not depend on who else is in the batch."""

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
    if row.output.numel() < row.params.min_tokens:
        banned = list(row.params.stop_token_ids)
        if not row.params.ignore_eos:
            banned += list(row.eos_token_ids)
        if banned:
            logits[torch.tensor(banned, dtype=torch.long)] = float("-inf")
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


def sample_rows(
    logits: torch.Tensor, rows: list[RowParams], generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens [R] and the log-softmax of the raw logits [R, V] (for logprobs)."""
    logprobs = logits.log_softmax(-1)
    tokens = torch.empty(len(rows), dtype=torch.long)
    for i, row in enumerate(rows):
        x = mask_min_tokens(apply_penalties(logits[i].clone(), row), row)
        p = row.params
        if p.greedy:
            tokens[i] = x.argmax()
            continue
        x = filter_top_k_top_p_min_p(x / p.temperature, p.top_k, p.top_p, p.min_p)
        probs = x.softmax(-1)
        tokens[i] = torch.multinomial(probs, 1, generator=row.generator or generator)[0]
    return tokens, logprobs
