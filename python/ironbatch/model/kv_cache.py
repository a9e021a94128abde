"""The paged KV-cache tensors, sized from a memory budget."""

from __future__ import annotations

import torch

from ironbatch.model.config import ModelConfig


def bytes_per_block(config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    """K and V of one block, over all layers."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    return 2 * config.num_layers * block_size * config.num_kv_heads * config.head_dim * itemsize


def num_blocks_for(
    budget_bytes: int, config: ModelConfig, block_size: int, dtype: torch.dtype
) -> int:
    """Blocks (the reserved null block included) that fit ``budget_bytes``."""
    return budget_bytes // bytes_per_block(config, block_size, dtype)


def allocate(
    config: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype, device: torch.device
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    shape = (num_blocks, block_size, config.num_kv_heads, config.head_dim)
    k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_layers)]
    v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_layers)]
    return k, v
