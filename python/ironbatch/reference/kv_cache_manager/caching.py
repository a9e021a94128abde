"""Hash caching (docs/scheduling.md §7.7, §7.13): a table's full blocks
enter the prefix-cache map as its tokens fill them, group by group, and how
many tokens a request holds in cached blocks."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ironbatch.reference.attention_group import SlidingWindow, group_key, sparse_mask
from ironbatch.reference.block import NULL_BLOCK, Block
from ironbatch.reference.block_table import BlockTable
from ironbatch.reference.sequence import Sequence

if TYPE_CHECKING:
    from ironbatch.reference.kv_cache_manager import KvCacheManager


def cache_full_blocks(
    m: KvCacheManager, tables: list[BlockTable], seq: Sequence, upto: int
) -> None:
    """``KvCacheManager.cache_full_blocks``: every group's full blocks up to
    token ``upto``, when prefix caching is on."""
    if m._enable_caching:
        for g, table in enumerate(tables):
            cache_blocks(m, g, table, seq, upto)


def stored_block_ids(blocks: list[Block]) -> list[int]:
    """``KvCacheManager.stored_block_ids``: each block's id, or the null
    block where the table holds none or sparse retention kept the block out
    of the cache (it has no hash)."""
    return [
        b.block_id if b.block_id != NULL_BLOCK and b.hash is not None else NULL_BLOCK
        for b in blocks
    ]


def num_cached_tokens(m: KvCacheManager, tables: list[BlockTable]) -> int:
    """``KvCacheManager.num_cached_tokens``: per group, where its last held
    cached block ends; the least over the groups."""
    if not m._enable_caching:
        return 0
    bs = m._block_size
    if m._single_full:
        return tables[0].num_cached * bs

    def cached_end(table: BlockTable) -> int:
        held = table.blocks[: min(table.num_cached, len(table))]
        ends = [
            (i + 1) * bs
            for i, b in enumerate(held)
            if b.block_id != NULL_BLOCK and b.hash is not None
        ]
        return ends[-1] if ends else 0

    return min((cached_end(t) for t in tables), default=0)


def cache_blocks(m: KvCacheManager, g: int, table: BlockTable, seq: Sequence, upto: int) -> None:
    """Hash-cache group ``g``'s full blocks up to token ``upto``
    (docs/scheduling.md §7.7): every one, except null positions and, for
    a window group under sparse retention, those no later request could
    resume from."""
    bs = m._block_size
    # Only tokens whose KV is final: multi-module MTP may prefill the last
    # few again.
    upto = max(upto - m._reprefillable, 0)
    if upto < (table.num_cached + 1) * bs:
        return  # no new full block: the common case
    hashes = seq.block_hashes
    full = min(min(upto, len(hashes) * bs) // bs, len(table))
    start = table.num_cached
    kind = m._groups[g].kind
    keep = None
    if start < full and isinstance(kind, SlidingWindow) and m._sparse_retention:
        keep = sparse_mask(
            start,
            full,
            bs,
            kind.window,
            seq.num_prompt_tokens,
            seq.shared_prefix_boundary,
            m._retention_interval,
        )
    for k in range(start, full):
        block = table.blocks[k]
        if block.block_id == NULL_BLOCK or (keep is not None and not keep(k)):
            continue
        m._pool.cache_block(block, group_key(hashes[k], g))
    table.num_cached = max(table.num_cached, full)
