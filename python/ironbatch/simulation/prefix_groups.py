"""Shared prompt prefixes for traces that record lengths only (Azure,
BurstGPT): a share of the requests open with one of a few group prefixes
(system prompts, few-shot preambles), chosen uniformly and deterministically
by seed, cut to leave each prompt one token of its own. The prompts keep
their lengths; only where their tokens come from changes."""

from __future__ import annotations

import random

import numpy as np

from ironbatch.simulation.workload import PREFIX_GROUP_KEYS, Workload, from_segments


def choose_prefixes(
    rng: random.Random, prompt_tokens: list[int], *, groups: int, tokens: int, share: float
) -> list[tuple[int, int] | None]:
    """Per prompt: its ``(group key, shared tokens)``, or None."""
    out: list[tuple[int, int] | None] = []
    for length in prompt_tokens:
        if groups and length > 1 and rng.random() < share:
            out.append((PREFIX_GROUP_KEYS + rng.randrange(groups), min(tokens, length - 1)))
        else:
            out.append(None)
    return out


def with_prefix_groups(
    w: Workload, *, groups: int, tokens: int, share: float = 0.75, seed: int = 0
) -> Workload:
    """``w`` with shared prefixes; every request must be one segment of its
    own (a length-only trace)."""
    if groups < 1:
        raise ValueError(f"prefix groups must be >= 1, got {groups}")
    if tokens < 1:
        raise ValueError(f"prefix tokens must be >= 1, got {tokens}")
    if not 0 <= share <= 1:
        raise ValueError(f"prefix share must be in [0, 1], got {share}")
    one_each = (np.diff(w.segment_offsets) == 1).all() and len(w.literal_tokens) == 0
    if not one_each:
        raise ValueError(
            f"workload {w.name}: prefix groups apply to traces that record lengths only "
            "(this one already says which prompts share tokens)"
        )
    lengths = w.segment_lengths.tolist()
    chosen = choose_prefixes(random.Random(seed), lengths, groups=groups, tokens=tokens,
                             share=share)  # fmt: skip
    segments = []
    for key, length, prefix in zip(w.segment_keys.tolist(), lengths, chosen, strict=True):
        if prefix is None:
            segments.append([(key, length)])
        else:
            segments.append([prefix, (key, length - prefix[1])])
    return from_segments(
        f"{w.name} + {groups} prefix groups",
        arrival_s=w.arrival_s,
        output_tokens=w.output_tokens,
        segments=segments,
        ids=w.ids,
        vocab_size=w.vocab_size,
        skipped=w.skipped,
    )
