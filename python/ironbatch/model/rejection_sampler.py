"""Draft verification (speculative decoding): from the logits at a request's
``1 + d`` verified positions, the drafts it keeps and the token after them.

Position ``j`` holds the logits that predict draft ``j`` (the last one
predicts the bonus token). Drafts are deterministic guesses (n-gram lookup),
so the draft distribution is one-hot and vLLM's rejection sampling becomes:

- greedy: accept drafts while each equals the argmax at its position; emit
  the argmax at the first mismatch, or the bonus argmax after all of them;
- random: accept draft ``t`` with probability ``p(t)`` (a float64 uniform
  ``u`` with ``p(t) >= u``, as vLLM draws it); on rejection draw from ``p``
  with ``t`` removed, renormalised; after every draft is accepted, draw the
  bonus token as the sampler draws any token.

``p`` at position ``j`` is the sampler's target distribution for the token
after the request's known tokens and drafts ``0..j-1``: penalties,
``min_tokens`` and the temperature/top-k/top-p/min-p filters see exactly the
tokens the request would have had, had it decoded them one by one. Seeded
requests draw from their own generator. A placeholder draft (negative: the
scheduler's padding) is always rejected."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import torch

from ironbatch.model.sampler import (
    RowParams,
    failure,
    processed_logits,
    sample_row,
    sampling_probs,
)


@dataclass
class Verified:
    """One step's verification, over its sampling rows."""

    #: Flattened: each row's accepted drafts and the token after them.
    tokens: np.ndarray
    #: Tokens each row emits (accepted drafts + 1); 0 where the row failed.
    counts: np.ndarray
    #: Rows (indices into the sampling rows) that failed, with the reason.
    errors: dict[int, str] = field(default_factory=dict)


def accept_greedy(targets: np.ndarray, drafts: np.ndarray, num_drafts: np.ndarray) -> Verified:
    """Plain greedy rows, vectorized: ``targets`` are the argmaxes at every
    verified position (``1 + num_drafts[i]`` per row, flattened), ``drafts``
    the drafts (``num_drafts[i]`` per row, flattened)."""
    m = num_drafts + 1
    row_start = np.zeros(len(m), dtype=np.int64)
    np.cumsum(m[:-1], out=row_start[1:])
    draft_start = row_start - np.arange(len(m))  # the drafts lack each row's bonus position
    local = np.arange(len(drafts)) - np.repeat(draft_start, num_drafts)
    draft_row = np.repeat(np.arange(len(m)), num_drafts)
    mismatch = drafts != targets[row_start[draft_row] + local]
    accepted = num_drafts.astype(np.int64)
    np.minimum.at(accepted, draft_row[mismatch], local[mismatch])
    counts = accepted + 1
    keep = np.arange(len(targets)) - np.repeat(row_start, m) < np.repeat(counts, m)
    return Verified(targets[keep], counts)


def verify_row(
    logits: torch.Tensor, row: RowParams, drafts: list[int], generator: torch.Generator
) -> list[int]:
    """One row's emitted tokens; ``logits`` is ``[len(drafts) + 1, V]`` and
    ``row.output`` the outputs before this step."""
    emitted: list[int] = []
    params, vocab = row.params, logits.shape[-1]
    gen = row.generator or generator
    for j, draft in enumerate(drafts):
        at = _after(row, emitted)
        x = processed_logits(logits[j].clone(), at)
        if params.greedy:
            token = int(x.argmax())
            emitted.append(token)
            if token != draft:
                return emitted
            continue
        probs = sampling_probs(x, params)
        if 0 <= draft < vocab:
            u = torch.rand((), dtype=torch.float64, generator=gen, device=probs.device)
            rest = probs.clone()
            rest[draft] = 0.0
            # All the mass on the draft (up to rounding): nothing else to draw.
            if float(probs[draft]) >= float(u) or not bool(rest.sum() > 0):
                emitted.append(draft)
                continue
            probs = rest
        emitted.append(int(torch.multinomial(probs, 1, generator=gen)[0]))
        return emitted
    emitted.append(sample_row(logits[len(drafts)].clone(), _after(row, emitted), generator))
    return emitted


def _after(row: RowParams, accepted: list[int]) -> RowParams:
    """The row as it stands after ``accepted`` more outputs."""
    if not accepted:
        return row
    more = torch.tensor(accepted, dtype=row.output.dtype, device=row.output.device)
    return replace(row, output=torch.cat([row.output, more]))


def verify_rows(
    logits: torch.Tensor,
    rows: list[RowParams],
    drafts: list[list[int]],
    generator: torch.Generator,
) -> Verified:
    """Every row through the full sampler; ``logits`` holds each row's
    ``len(drafts[i]) + 1`` positions in order. A row that fails emits
    nothing and is reported; the others go on."""
    tokens: list[int] = []
    counts = np.zeros(len(rows), dtype=np.int64)
    errors: dict[int, str] = {}
    start = 0
    for i, (row, row_drafts) in enumerate(zip(rows, drafts, strict=True)):
        m = len(row_drafts) + 1
        try:
            got = verify_row(logits[start : start + m], row, row_drafts, generator)
        except Exception as e:  # noqa: BLE001 - any failure ends this row only
            errors[i] = failure(e)
        else:
            tokens += got
            counts[i] = len(got)
        start += m
    return Verified(np.array(tokens, dtype=np.int64), counts, errors)
