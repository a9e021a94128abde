"""The KV-cache manager's settings and their checks (docs/scheduling.md §2,
§2.1, §7.13): every field in range, the first bad one named, in the core's
``KvCacheConfig::validate`` order."""

from __future__ import annotations

from collections.abc import Sequence as Seq

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
    # A block's hash covers at most the next block.
    check_range("num_hash_lookahead_tokens", num_hash_lookahead_tokens, 0, block_size)
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
            # "align": states at the cache's block boundaries. vLLM's finer
            # hash units and prefill checkpoints are not modelled, so
            # neither are lookahead hashes past one token (they move the
            # prompt's checkpoint off the block boundary) nor a state block
            # of another size.
            if enable_prefix_caching and g.kind.block_size != block_size:
                raise ValueError(
                    f"mamba_block_size ({g.kind.block_size}) must equal block_size "
                    f"({block_size}) with prefix caching on (vLLM's mamba_cache_mode 'align')"
                )
            if enable_prefix_caching and drop_eagle_block:
                raise ValueError(
                    "drop_eagle_block must be false with a Mamba KV-cache group and prefix "
                    "caching on"
                )
            if enable_prefix_caching and num_hash_lookahead_tokens > 1:
                raise ValueError(
                    f"num_hash_lookahead_tokens ({num_hash_lookahead_tokens}) must be at most 1 "
                    "with a Mamba KV-cache group and prefix caching on"
                )
    if retention_interval > 0:
        # vLLM's rule: checkpoints land on block boundaries, and only a
        # sliding window or a recurrent group keeps them.
        check_range("retention_interval", retention_interval, 1, MAX_MODEL_LEN)
        windowed = any(isinstance(g.kind, (SlidingWindow, Mamba)) for g in groups)
        if retention_interval % block_size or not sparse_retention or not windowed:
            raise ValueError(
                f"retention_interval ({retention_interval}) needs sparse_retention, a "
                "sliding-window or Mamba KV-cache group and a multiple of block_size "
                f"({block_size})"
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
