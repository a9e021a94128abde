"""The KV-cache manager's settings and their checks (docs/scheduling.md §2,
§2.1, §7.13): every field in range, the first bad one named, in the core's
``KvCacheConfig::validate`` order."""

from __future__ import annotations

from collections.abc import Sequence as Seq
from functools import reduce
from math import gcd, lcm

from ironbatch.reference.attention_group import (
    ChunkedLocal,
    CrossAttention,
    GroupSpec,
    Mamba,
    SlidingWindow,
)
from ironbatch.reference.limits import (
    MAX_BLOCK_SIZE,
    MAX_KV_CACHE_GROUPS,
    MAX_MODEL_LEN,
    MAX_NUM_BLOCKS,
    check_range,
)


def validate(
    num_blocks: int,
    block_size: int,
    max_model_len: int,
    num_lookahead_tokens: int,
    num_hash_lookahead_tokens: int,
    groups: Seq[GroupSpec],
    enable_prefix_caching: bool,
    drop_eagle_block: bool = False,
    *,
    sparse_retention: bool = True,
    retention_interval: int = 0,
    eagle_groups: Seq[int] | None = None,
) -> None:
    """Check every setting of a ``KvCacheManager``, naming the first bad one."""
    check_range("block_size", block_size, 1, MAX_BLOCK_SIZE)
    check_range("max_model_len", max_model_len, 1, MAX_MODEL_LEN)
    # Without a KV cache, vLLM's pool is the null block alone.
    check_range("num_blocks", num_blocks, 1 if not groups else 2, MAX_NUM_BLOCKS)
    check_range("num_lookahead_tokens", num_lookahead_tokens, 0, max_model_len)
    check_range("kv_cache_groups", len(groups), 0, MAX_KV_CACHE_GROUPS)
    validate_group_block_sizes(groups, block_size, drop_eagle_block, enable_prefix_caching)
    # A block's hash covers at most the next block.
    check_range(
        "num_hash_lookahead_tokens",
        num_hash_lookahead_tokens,
        0,
        hash_block_size(groups, block_size, enable_prefix_caching),
    )
    check_groups(
        groups,
        num_hash_lookahead_tokens,
        enable_prefix_caching,
        drop_eagle_block,
        sparse_retention=sparse_retention,
        retention_interval=retention_interval,
        block_size=block_size,
        eagle_groups=eagle_groups,
    )


def check_groups(
    groups: Seq[GroupSpec],
    num_hash_lookahead_tokens: int,
    enable_prefix_caching: bool,
    drop_eagle_block: bool = False,
    *,
    sparse_retention: bool = True,
    retention_interval: int = 0,
    block_size: int = 1,
    eagle_groups: Seq[int] | None = None,
) -> None:
    """The KV-cache groups' rules, after the cache's sizes (the core's
    ``KvCacheConfig::validate`` order): how many, each window and chunk in
    range, cross-attention and recurrent states without prefix caching,
    cross-attention after a decoder group, a retention interval on window
    groups' block boundaries, and EAGLE's last-block drop only without
    lookahead hashes, on one group."""
    check_range("kv_cache_groups", len(groups), 0, MAX_KV_CACHE_GROUPS)
    if not groups and enable_prefix_caching:
        # Nothing to cache; vLLM turns prefix caching off for such a model
        # (encoder-only attention, an encoder-only deployment).
        raise ValueError(
            "kv_cache_groups is empty (a model without a KV cache): enable_prefix_caching "
            "must be false"
        )
    for g in groups:
        if isinstance(g.kind, SlidingWindow):
            check_range("sliding_window", g.kind.window, 1, MAX_MODEL_LEN)
        elif isinstance(g.kind, ChunkedLocal):
            check_range("attention_chunk_size", g.kind.chunk, 1, MAX_MODEL_LEN)
        elif isinstance(g.kind, CrossAttention) and enable_prefix_caching:
            # vLLM turns prefix caching off for encoder-decoder models.
            raise ValueError(
                "enable_prefix_caching must be false with a cross-attention KV-cache group "
                "(an encoder-decoder model)"
            )
        elif isinstance(g.kind, Mamba):
            check_range("mamba_block_size", g.kind.block_size, 1, MAX_MODEL_LEN)
            check_range("speculative_blocks", g.kind.speculative_blocks, 0, MAX_NUM_BLOCKS)
            if g.kind.checkpoint_alignment is not None:
                check_range("checkpoint_alignment", g.kind.checkpoint_alignment, 1, MAX_MODEL_LEN)
            # Prefix caching over recurrent states is vLLM's cache mode
            # "align": a state per block boundary. A state block of more
            # than a hash block brings vLLM's hits inside a state block
            # (its partial hash hits), which are not modelled.
            unit = hash_block_size(groups, block_size, enable_prefix_caching)
            if enable_prefix_caching and g.kind.block_size != unit:
                sizes = group_block_sizes(groups, block_size)
                raise ValueError(
                    f"mamba_block_size ({g.kind.block_size}) must divide every other KV-cache "
                    f"group's block size ({sizes}) with prefix caching on (vLLM's "
                    "mamba_cache_mode 'align'): hits inside a state block are not modelled"
                )
    if retention_interval > 0:
        # vLLM's rule: checkpoints land on block boundaries, and only a
        # sliding window or a recurrent group keeps them.
        check_range("retention_interval", retention_interval, 1, MAX_MODEL_LEN)
        windowed = any(isinstance(g.kind, (SlidingWindow, Mamba)) for g in groups)
        unit = scheduler_block_size(groups, block_size, enable_prefix_caching)
        if retention_interval % unit or not sparse_retention or not windowed:
            raise ValueError(
                f"retention_interval ({retention_interval}) needs sparse_retention, a "
                "sliding-window or Mamba KV-cache group and a multiple of the scheduler "
                f"block size ({unit})"
            )
    alignments = {g.kind.prefill_checkpoint_alignment() for g in groups if g.kind.is_recurrent()}
    if len(alignments) > 1:
        # vLLM's scheduler splits by the first group's and checkpoints only
        # when every group can.
        raise ValueError(
            "kv_cache_groups: every Mamba group must have the same checkpoint_alignment"
        )
    if groups and groups[0].kind.is_cross():
        # A step's block ranges are read off the first group's table.
        raise ValueError(
            "kv_cache_groups[0] must be a decoder group: cross-attention groups follow the "
            "decoder's (as vLLM orders them)"
        )
    if drop_eagle_block and num_hash_lookahead_tokens > 0:
        # Lookahead hashes prove the token after a block: nothing to drop.
        raise ValueError("drop_eagle_block must be false with num_hash_lookahead_tokens above 0")
    for g in eagle_groups or ():
        if g >= len(groups):
            raise ValueError(
                f"eagle_groups: group {g} is not one of the {len(groups)} KV-cache groups"
            )


def group_block_sizes(groups: Seq[GroupSpec], block_size: int) -> list[int]:
    """Tokens per block of each group."""
    return [g.tokens_per_block(block_size) for g in groups]


def _hashed_block_sizes(
    groups: Seq[GroupSpec], block_size: int, enable_prefix_caching: bool
) -> list[int]:
    """The block sizes of the groups whose blocks are keyed by token hashes:
    attention over the decoder's tokens, and with prefix caching a recurrent
    group's states (vLLM's cache mode "align", where they are cached by the
    hash where their block ends); not cross-attention."""
    return [
        g.tokens_per_block(block_size)
        for g in groups
        if not g.kind.is_slotless() or (g.kind.is_recurrent() and enable_prefix_caching)
    ]


def hash_block_size(groups: Seq[GroupSpec], block_size: int, enable_prefix_caching: bool) -> int:
    """Tokens per block hash (vLLM's ``hash_block_size``): the greatest
    common divisor of the hashed groups' block sizes, so every group's block
    ends on a hash; the cache's block size when they are all alike or there
    are none."""
    sizes = _hashed_block_sizes(groups, block_size, enable_prefix_caching)
    return reduce(gcd, sizes, 0) or block_size


def scheduler_block_size(
    groups: Seq[GroupSpec], block_size: int, enable_prefix_caching: bool
) -> int:
    """The unit prefix hits and hash caching are aligned to (vLLM's
    ``scheduler_block_size``): the least common multiple of the hashed
    groups' block sizes, where every group's blocks end together."""
    sizes = _hashed_block_sizes(groups, block_size, enable_prefix_caching)
    return reduce(lcm, sizes) if sizes else block_size


def has_mixed_block_sizes(
    groups: Seq[GroupSpec], block_size: int, enable_prefix_caching: bool
) -> bool:
    """Whether the hashed groups' blocks hold different numbers of tokens."""
    return hash_block_size(groups, block_size, enable_prefix_caching) != scheduler_block_size(
        groups, block_size, enable_prefix_caching
    )


def validate_group_block_sizes(
    groups: Seq[GroupSpec], block_size: int, drop_eagle_block: bool, enable_prefix_caching: bool
) -> None:
    """A group's own block size: in range, on full attention or a sliding
    window only; where they differ, only what the twin models beside them
    (docs/scheduling.md §7.16)."""
    for i, g in enumerate(groups):
        if g.block_size is None:
            continue
        check_range(f"kv_cache_groups[{i}].block_size", g.block_size, 1, MAX_BLOCK_SIZE)
        if g.kind.is_recurrent():
            raise ValueError(
                f"kv_cache_groups[{i}].block_size: a Mamba group's block size is its size"
            )
    if not has_mixed_block_sizes(groups, block_size, enable_prefix_caching):
        return
    # (Recurrent groups count here only with prefix caching, and then their
    # states are cached as any group's blocks are.)
    sizes = group_block_sizes(groups, block_size)
    # A chunked-local hit ends on its own blocks; vLLM asserts that they are
    # the scheduler block's (its hits' unit) when it looks one up.
    unit = scheduler_block_size(groups, block_size, enable_prefix_caching)
    chunked_smaller = any(
        isinstance(g.kind, ChunkedLocal) and size != unit
        for g, size in zip(groups, sizes, strict=True)
    )
    if enable_prefix_caching and chunked_smaller:
        raise ValueError(
            f"kv_cache_groups of different block sizes ({sizes}): with prefix caching on, a "
            f"chunked-local-attention group's blocks must be the largest ({unit} tokens), as "
            "vLLM asserts"
        )
