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
from ironbatch.reference.kv_cache_manager.boundary_states import BoundaryState
from ironbatch.reference.kv_cache_manager.prefill_checkpoints import StateCheckpoint
from ironbatch.reference.kv_events import Evicted, Stored, StoredKey
from ironbatch.reference.sequence import Sequence

if TYPE_CHECKING:
    from ironbatch.reference.kv_cache_manager import KvCacheManager


def cache_full_blocks(
    m: KvCacheManager, tables: list[BlockTable], seq: Sequence, upto: int, owner: int
) -> None:
    """``KvCacheManager.cache_full_blocks``: every group's full blocks up to
    token ``upto``, when prefix caching is on; the stores' events name
    ``owner``, the request's slot."""
    if m._enable_caching:
        for g, table in enumerate(tables):
            cache_blocks(m, g, table, seq, upto, owner)


def num_cached_tokens(m: KvCacheManager, tables: list[BlockTable]) -> int:
    """``KvCacheManager.num_cached_tokens``: per group, where its last held
    cached block ends (a recurrent group's: the most tokens a keyed state
    covers); the least over the groups."""
    if not m._enable_caching:
        return 0
    if m._single_full:
        return tables[0].num_cached * m._hash_block_size  # one group

    def cached_end(g: int, table: BlockTable) -> int:
        bs = m.group_block_size(g)
        if m._groups[g].kind.is_recurrent():
            # Up to the table's end: a prefill checkpoint's block lies past
            # the hash-cached blocks.
            return max(
                (
                    keyed_tokens(b, i, bs)
                    for i, b in enumerate(table.blocks)
                    if b.block_id != NULL_BLOCK and b.hash is not None
                ),
                default=0,
            )
        held = table.blocks[: min(table.num_cached, len(table))]
        ends = [
            (i + 1) * bs
            for i, b in enumerate(held)
            if b.block_id != NULL_BLOCK and b.hash is not None
        ]
        end = ends[-1] if ends else 0
        # A prompt tail keyed past the full blocks (§7.16): among the few
        # blocks its tokens have not filled.
        for i in range(len(held), len(table)):
            b = table.blocks[i]
            if b.block_id != NULL_BLOCK and b.hash is not None:
                end = max(end, keyed_tokens(b, i, bs))
        return end

    return min((cached_end(g, t) for g, t in enumerate(tables)), default=0)


def cache_blocks(
    m: KvCacheManager, g: int, table: BlockTable, seq: Sequence, upto: int, owner: int | None
) -> None:
    """Hash-cache group ``g``'s full blocks up to token ``upto``
    (docs/scheduling.md §7.7, §7.13, §7.15): every one, except null
    positions and, for a window or recurrent group under sparse retention,
    those no later request could resume from. With events on, each key's
    events are logged as vLLM's manager makes them: the full blocks' (a key
    they replace removed first), then a key inside a block (§7.15–7.16),
    for the request in ``owner``."""
    offered_by = owner if m._boundary_states.enabled else None
    # The request's planned prefill checkpoint: the allocation's own, or for
    # its output's caching the latest allocation's.
    checkpoint = m._step_checkpoint
    if owner is not None and m._align:
        checkpoint = m._state_checkpoints.get(owner)
    if not m._pool.events.enabled:
        owner = None
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
    first = table.num_cached
    # Each block from ``first`` on as this call stored it (the null block
    # where it stored none), for the event.
    block_ids: list[int] = []
    if upto >= (table.num_cached + 1) * m.group_block_size(g):
        stored = block_ids if owner is not None else None
        cache_new_full_blocks(m, g, table, seq, upto, stored)
    if owner is not None and table.num_cached > first:
        block_ids += [NULL_BLOCK] * (table.num_cached - first - len(block_ids))
        m._pool.events.push(Stored(owner, g, first, block_ids))
    if m._align and m._groups[g].kind.is_recurrent():
        cached = table.num_cached
        cache_prompt_state(m, g, table, seq, upto, checkpoint, owner)
        if offered_by is not None:
            offer_states(m, g, table, range(first, cached), offered_by)
    if m._groups[g].kind.is_full() and m.group_block_size(g) != m._hash_block_size:
        cache_prompt_tail(m, g, table, seq, upto, owner)


def cache_prompt_tail(
    m: KvCacheManager, g: int, table: BlockTable, seq: Sequence, upto: int, owner: int | None
) -> None:
    """Key the full-attention block the prompt's last hash-block boundary
    falls inside by the hash there (vLLM's full-attention
    ``_cache_partial_tail_block``, beside groups of different block sizes,
    §7.16): a later request could resume there once vLLM looks up hits
    inside blocks; until its tokens fill it, the block counts as cached
    (freed to the queue's tail, its tokens in the cached-token estimate).
    The tail is the prompt less its last token (all of it for a group that
    drops an EAGLE block), within the hashed tokens."""
    bs, unit = m.group_block_size(g), m._hash_block_size
    prompt = seq.num_prompt_tokens
    limit = prompt if m._drops_eagle[g] else max(prompt - 1, 0)
    boundary = min(limit // unit, len(seq.block_hashes)) * unit
    idx = boundary // bs
    if boundary == 0 or boundary > upto or boundary % bs == 0 or idx >= len(table):
        return
    block = table.blocks[idx]
    if block.block_id == NULL_BLOCK:
        return
    num_hash_blocks = boundary // unit
    key = group_key(seq.block_hashes[num_hash_blocks - 1], g)
    if block.hash is not None:
        # A tail keyed before more hashes were known moves on; a key that
        # covers as much or more stays, the tail's beside it (for events
        # only: no lookup asks for it).
        if block.partial_tokens == 0 or block.partial_tokens >= boundary:
            if owner is not None and m._pool.add_second_key(block, key):
                log_stored_key(m, owner, g, num_hash_blocks, block)
            return
        m._pool.uncache([block.block_id])
    m._pool.cache_partial_block(block, key, boundary)
    log_stored_key(m, owner, g, num_hash_blocks, block)


def log_stored_key(
    m: KvCacheManager, owner: int | None, g: int, num_hash_blocks: int, block: Block
) -> None:
    """Log that group ``g``'s ``block`` was keyed by the hash at
    ``num_hash_blocks`` hash blocks, when events are on (``owner``)."""
    if owner is not None:
        m._pool.events.push(StoredKey(owner, g, num_hash_blocks, block.block_id))


def keyed_tokens(block: Block, position: int, bs: int) -> int:
    """The tokens the key of ``block``, at ``position`` in a table of ``bs``
    blocks, covers: where the block ends, unless the key is partial."""
    return block.partial_tokens or (position + 1) * bs


def cache_new_full_blocks(
    m: KvCacheManager,
    g: int,
    table: BlockTable,
    seq: Sequence,
    upto: int,
    stored: list[int] | None,
) -> None:
    """``cache_blocks`` once a block has filled since the last call; each
    block from the first uncached one on as it stored it (the null block
    where it stored none) appended to ``stored``, when given."""
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
        keep = dense_window_mask(bs, m._scheduler_block_size, kind.window, m._drops_eagle[g])
    recurrent = kind.is_recurrent()
    if recurrent:
        keep = recurrent_mask(
            bs,
            m._scheduler_block_size,
            m._sparse_retention,
            seq.num_prompt_tokens,
            seq.shared_prefix_boundary,
            m._retention_interval,
            EagleReach(any_group=m._drop_eagle_block, this_group=m._drops_eagle[g]),
        )
    for k in range(start, full):
        block = table.blocks[k]
        if block.block_id == NULL_BLOCK or (keep is not None and not keep(k)):
            if stored is not None:
                stored.append(NULL_BLOCK)
            continue
        block_hash = m.group_block_hash(hashes, g, k)
        assert block_hash is not None  # k < full: hashed
        key = group_key(block_hash, g)
        if block.hash == key:
            if stored is not None:
                stored.append(NULL_BLOCK)
            continue
        if block.hash is not None:
            # A partial key (a prompt tail's) gives way to the block's own.
            m._pool.uncache([block.block_id])
        m._pool.cache_block(block, key)
        if stored is not None:
            stored.append(block.block_id)
        if recurrent:
            # Its state is this step's to write (§7.15).
            m._states_cached_this_step.add(key)
    table.num_cached = max(table.num_cached, full)


def offer_states(m: KvCacheManager, g: int, table: BlockTable, blocks: range, owner: int) -> None:
    """Offer a KV connector each state block ``blocks`` of group ``g``'s
    table that this call cached and that still holds a key (a checkpoint's
    may have gone again, or been re-keyed where it ends), with the tokens
    that key covers (vLLM's Mamba ``cache_blocks``)."""
    bs = m.group_block_size(g)
    for i in blocks:
        b = table.blocks[i]
        if b.block_id != NULL_BLOCK and b.hash is not None:
            m._boundary_states.offer(BoundaryState(owner, g, b.block_id, keyed_tokens(b, i, bs)))


def cache_prompt_state(
    m: KvCacheManager,
    g: int,
    table: BlockTable,
    seq: Sequence,
    upto: int,
    checkpoint: StateCheckpoint | None,
    owner: int | None,
) -> None:
    """Cache the state where a later request with this prompt resumes, if a
    block holds it unhashed (vLLM's Mamba ``_cache_partial_tail_block``):
    sparse retention passed it by when the prompt was shorter (a session's
    next turn)."""
    if checkpoint is not None:
        cache_checkpoint_state(m, g, table, seq, checkpoint, owner)
        return
    bs = m.group_block_size(g)  # the hash block (validated)
    # The tokens as the coordinator hands them: a group that drops an EAGLE
    # block beside multi-module MTP gets a count inside a block, and keys
    # no state then.
    num_tokens = upto
    idx = num_tokens // bs
    if num_tokens == 0 or num_tokens % bs or idx > len(table) or idx > len(seq.block_hashes):
        return
    # The prompt's last hash-block boundary (vLLM's
    # ``latest_prompt_hash_boundary``).
    if num_tokens != m.state_checkpoint(seq.num_prompt_tokens, m._hash_block_size):
        return
    cache_state(m, g, table, seq, idx - 1, num_tokens, owner)


def cache_checkpoint_state(
    m: KvCacheManager,
    g: int,
    table: BlockTable,
    seq: Sequence,
    checkpoint: StateCheckpoint,
    owner: int | None,
) -> None:
    """Key the block a prefill checkpoint was written to in this step
    (vLLM's checkpoint branch of ``_cache_partial_tail_block``), when a later
    request could resume there: the prompt's checkpoint, a state the
    retention keeps, or a shared prefix's end. Otherwise the block's state is
    only passing through, and any key it has goes."""
    bs = m.group_block_size(g)
    position, idx = checkpoint.position, checkpoint.block
    # Whether the retention keeps the state after ``position`` (the one that
    # block would hold where it ends there).
    per_segment = m._retention_interval // bs
    ends_segment = per_segment <= 1 or (position // bs) % per_segment == 0
    retained = not m._sparse_retention or (m._retention_interval > 0 and ends_segment)
    prompt_checkpoint = m.state_checkpoint(seq.num_prompt_tokens, m._scheduler_block_size)
    reachable = position == prompt_checkpoint or retained or position == seq.shared_prefix_boundary
    if not reachable:
        block_id = table.blocks[idx].block_id
        if block_id != NULL_BLOCK:
            m._pool.events.push(Evicted(block_id))
        m._pool.uncache([block_id])
        return
    cache_state(m, g, table, seq, idx, position, owner)


def cache_state(
    m: KvCacheManager,
    g: int,
    table: BlockTable,
    seq: Sequence,
    idx: int,
    position: int,
    owner: int | None,
) -> None:
    """Hash-cache the state in group ``g``'s block ``idx`` out of turn as the
    state after ``position`` tokens (keyed by the hash there), unless it is
    null or keyed so already; a key it has for another position goes (vLLM's
    ``cache_partial_block``, which replaces it). The block ends at
    ``position`` unless it holds a prefill checkpoint of groups whose block
    sizes differ (§7.16)."""
    block = table.blocks[idx]
    if block.block_id == NULL_BLOCK:
        return
    hash_index = position // m._hash_block_size - 1
    if hash_index >= len(seq.block_hashes):
        # A decode step verifying at least a block of drafts can pass for a
        # checkpoint past the hashed tokens: vLLM asserts there; nothing to
        # key.
        return
    key = group_key(seq.block_hashes[hash_index], g)
    if block.hash == key:
        return
    if block.hash is not None:
        m._pool.uncache([block.block_id])
    m._pool.cache_partial_block(block, key, position)
    m._states_cached_this_step.add(key)
    log_stored_key(m, owner, g, hash_index + 1, block)
