"""Hash caching (docs/scheduling.md §7.7, §7.13): a table's full blocks
enter the prefix-cache map as its tokens fill them, group by group, and how
many tokens a request holds in cached blocks."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ironbatch.reference.attention_group import (
    EagleReach,
    SlidingWindow,
    dense_window_mask,
    group_key,
    recurrent_mask,
    sparse_mask,
)
from ironbatch.reference.block import NULL_BLOCK, Block
from ironbatch.reference.block_table import BlockTable
from ironbatch.reference.kv_events import Evicted
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
    if m._single_full:
        return tables[0].num_cached * m._hash_block_size  # one group

    def cached_end(g: int, table: BlockTable) -> int:
        bs = m.group_block_size(g)
        held = table.blocks[: min(table.num_cached, len(table))]
        ends = [
            (i + 1) * bs
            for i, b in enumerate(held)
            if b.block_id != NULL_BLOCK and b.hash is not None
        ]
        return ends[-1] if ends else 0

    return min((cached_end(g, t) for g, t in enumerate(tables)), default=0)


def cache_blocks(m: KvCacheManager, g: int, table: BlockTable, seq: Sequence, upto: int) -> None:
    """Hash-cache group ``g``'s full blocks up to token ``upto``
    (docs/scheduling.md §7.7, §7.13, §7.15): every one, except null
    positions and, for a window or recurrent group under sparse retention,
    those no later request could resume from."""
    # Only tokens whose KV is final: multi-module MTP may prefill the last
    # few again. (vLLM's hybrid coordinator, for several groups, caches
    # them anyway, but in a group that drops an EAGLE block: a window keeps
    # their blocks instead, skipped_blocks.) That coordinator caches up to
    # a multiple of the scheduler block, where every group's blocks end (a
    # hit lands there; alike groups' blocks are that unit), and a group
    # that drops an EAGLE block one block of its own past it, the block its
    # hit matches and drops (vLLM's get_num_cacheable_tokens). Its unitary
    # one hands a single group the tokens as they are.
    finalized = max(upto - m._reprefillable, 0)
    unit = m._scheduler_block_size
    if len(m._groups) == 1:
        upto = finalized
    elif m._drops_eagle[g] and upto >= unit:
        upto = min(finalized, finalized // unit * unit + m.group_block_size(g))
    else:
        upto = upto // unit * unit
    if upto >= (table.num_cached + 1) * m.group_block_size(g):
        cache_new_full_blocks(m, g, table, seq, upto)
    if m._align and m._groups[g].kind.is_recurrent():
        cache_prompt_state(m, g, table, seq, upto)


def cache_new_full_blocks(
    m: KvCacheManager, g: int, table: BlockTable, seq: Sequence, upto: int
) -> None:
    """``cache_blocks`` once a block has filled since the last call."""
    bs = m.group_block_size(g)
    hashes = seq.block_hashes
    full = min(min(upto, len(hashes) * m._hash_block_size) // bs, len(table))
    start = table.num_cached
    kind = m._groups[g].kind
    keep = None
    if start < full and isinstance(kind, SlidingWindow) and m._sparse_retention:
        keep = sparse_mask(
            start,
            full,
            bs,
            m._scheduler_block_size,
            kind.window,
            seq.num_prompt_tokens,
            seq.shared_prefix_boundary,
            m._retention_interval,
            EagleReach(any_group=m._drop_eagle_block, this_group=m._drops_eagle[g]),
        )
    elif isinstance(kind, SlidingWindow):
        keep = dense_window_mask(bs, m._scheduler_block_size, kind.window)
    recurrent = kind.is_recurrent()
    if recurrent:
        keep = recurrent_mask(
            bs,
            m._sparse_retention,
            seq.num_prompt_tokens,
            seq.shared_prefix_boundary,
            m._retention_interval,
        )
    for k in range(start, full):
        block = table.blocks[k]
        if block.block_id == NULL_BLOCK or (keep is not None and not keep(k)):
            continue
        block_hash = m.group_block_hash(hashes, g, k)
        assert block_hash is not None  # k < full: hashed
        key = group_key(block_hash, g)
        m._pool.cache_block(block, key)
        if recurrent:
            # Its state is this step's to write (§7.15).
            m._states_cached_this_step.add(key)
    table.num_cached = max(table.num_cached, full)


def cache_prompt_state(
    m: KvCacheManager, g: int, table: BlockTable, seq: Sequence, upto: int
) -> None:
    """Cache the state where a later request with this prompt resumes, if a
    block holds it unhashed (vLLM's Mamba ``_cache_partial_tail_block``):
    sparse retention passed it by when the prompt was shorter (a session's
    next turn)."""
    if m._step_checkpoint is not None:
        cache_checkpoint_state(m, g, table, seq, m._step_checkpoint)
        return
    bs = m._hash_block_size  # a recurrent group's, alike
    # What vLLM's hybrid coordinator hands its groups: whole blocks.
    num_tokens = upto // bs * bs if len(m._groups) > 1 else upto
    idx = num_tokens // bs
    if num_tokens == 0 or num_tokens % bs or idx > len(table) or idx > len(seq.block_hashes):
        return
    if num_tokens != m.state_checkpoint(seq.num_prompt_tokens):
        return
    cache_state(m, g, table, seq, idx - 1)


def cache_checkpoint_state(
    m: KvCacheManager, g: int, table: BlockTable, seq: Sequence, position: int
) -> None:
    """Key the block a prefill checkpoint was written to in this step
    (vLLM's checkpoint branch of ``_cache_partial_tail_block``), when a later
    request could resume there: the prompt's checkpoint, a state the
    retention keeps, or a shared prefix's end. Otherwise the block's state is
    only passing through, and any key it has goes."""
    bs = m._hash_block_size  # a recurrent group's, alike
    idx = position // bs - 1
    per_segment = m._retention_interval // bs
    retained = not m._sparse_retention or (
        m._retention_interval > 0 and (per_segment <= 1 or (idx + 1) % per_segment == 0)
    )
    reachable = (
        position == m.state_checkpoint(seq.num_prompt_tokens)
        or retained
        or position == seq.shared_prefix_boundary
    )
    if not reachable:
        block_id = table.blocks[idx].block_id
        if block_id != NULL_BLOCK:
            m._pool.events.push(Evicted(block_id))
        m._pool.uncache([block_id])
        return
    cache_state(m, g, table, seq, idx)


def cache_state(m: KvCacheManager, g: int, table: BlockTable, seq: Sequence, idx: int) -> None:
    """Hash-cache the state in group ``g``'s block ``idx`` out of turn,
    unless it is null or keyed already."""
    block = table.blocks[idx]
    if block.block_id == NULL_BLOCK or block.hash is not None:
        return
    if idx >= len(seq.block_hashes):
        # A decode step verifying at least a block of drafts can pass for a
        # checkpoint past the hashed tokens: vLLM asserts there; nothing to
        # key.
        return
    key = group_key(seq.block_hashes[idx], g)
    m._pool.cache_block(block, key)
    m._states_cached_this_step.add(key)
    if m._pool.events.enabled:
        m._prompt_states_stored.append((g, idx, block.block_id))
