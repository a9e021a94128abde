"""Slot allocation (docs/scheduling.md §7.6, §7.11, §7.13): the admission
gate summed over the groups (window caps included), window blocks given
back, prefix hits taken, the same new blocks per group, and the hash caching
the step's tokens allow. ``allocate_slots`` checks every argument before
anything changes, so a refusal leaves the pool, the map and the tables as
they were."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ironbatch.reference.block import NULL_BLOCK, Block, cdiv
from ironbatch.reference.block_table import BlockTable
from ironbatch.reference.kv_cache_manager.caching import cache_blocks
from ironbatch.reference.sequence import Sequence

if TYPE_CHECKING:
    from ironbatch.reference.kv_cache_manager import KvCacheManager


@dataclass(frozen=True)
class Admission:
    """What an admission's allocation checks besides the step's own blocks."""

    #: The whole known sequence must fit too (the admission gate, Q13).
    full_sequence_must_fit: bool = False
    #: Blocks that must stay free beyond what is taken (vLLM's watermark).
    watermark: int = 0
    #: Encoder tokens whose cross-attention slots the step needs: those of
    #: the encoder inputs it runs (an encoder-decoder's admission), else 0.
    encoder_tokens: int = 0
    #: Tokens past the hits a KV connector supplies (§4.19): counted as
    #: computed, in fresh blocks.
    external_tokens: int = 0
    #: Blocks kept free for others on top of the watermark: what in-flight
    #: prefills still need, when an async load is admitted (§4.19).
    reserved_blocks: int = 0
    #: The external tokens arrive later: no lookahead slots yet, and nothing
    #: hash-cached until the load is reported.
    load_async: bool = False


def blocks_needed(
    m: KvCacheManager, g: int, table: BlockTable, tokens: int, hits: list[Block], capped: bool
) -> int:
    """Blocks group ``g`` must take to cover ``tokens`` after its
    ``hits``: positions not held yet (and a recurrent group's scratch
    states), plus hits that sit in the free queue (taking them shrinks the
    free count too). ``capped``: the
    admission check, which counts a window group's blocks only up to its
    cap."""
    kind = m._groups[g].kind
    required = cdiv(tokens, m.group_block_size(g)) + kind.extra_blocks()
    cap = m._groups[g].admission_cap_blocks
    if capped and cap is not None:
        required = min(required, cap)
    have = len(table) + len(hits)
    evictable_hits = sum(1 for b in hits if b.block_id != NULL_BLOCK and b.ref_cnt == 0)
    return max(required - have, 0) + evictable_hits


def blocks_needed_all(
    m: KvCacheManager,
    tables: list[BlockTable],
    tokens: int,
    encoder_tokens: int,
    hits: list[list[Block]],
    capped: bool,
) -> int:
    """Blocks all groups must take (``hits``: one list per group, or none):
    ``tokens`` slots in the decoder's groups, ``encoder_tokens`` in the
    cross-attention ones."""
    return sum(
        blocks_needed(
            m, g, table, slots_of(m, g, tokens, encoder_tokens), hits[g] if hits else [], capped
        )
        for g, table in enumerate(tables)
    )


def slots_of(m: KvCacheManager, g: int, tokens: int, encoder_tokens: int) -> int:
    """The slots group ``g`` covers: the encoder's tokens for cross-attention."""
    return encoder_tokens if m._groups[g].kind.is_cross() else tokens


def allocate_slots(
    m: KvCacheManager,
    table: BlockTable,
    seq: Sequence,
    num_new_tokens: int,
    num_new_computed_tokens: int,
    new_computed_blocks: list[int],
    full_sequence_must_fit: bool,
) -> int | None:
    """``KvCacheManager.allocate_slots`` (one full-attention group, every
    argument checked first): the new blocks, or None."""
    if not m._single_full:
        raise ValueError(
            "allocate_slots: a cache of several KV-cache groups allocates through the scheduler"
        )
    hits = check_allocation(
        m, table, seq, num_new_tokens, num_new_computed_tokens, new_computed_blocks
    )
    return allocate(
        m,
        [table],
        seq,
        num_new_tokens,
        num_new_computed_tokens,
        [hits] if hits else [],
        Admission(full_sequence_must_fit=full_sequence_must_fit),
        0,
    )


def allocate(
    m: KvCacheManager,
    tables: list[BlockTable],
    seq: Sequence,
    num_new_tokens: int,
    num_new_computed_tokens: int,
    hits: list[list[Block]],
    admission: Admission,
    in_flight: int,
) -> int | None:
    """``KvCacheManager.allocate``: the fast path of most decode steps, then
    the admission gate, window blocks given back, hits taken, new blocks
    and hash caching."""
    bs, max_len = m._block_size, m._max_model_len
    full_sequence_must_fit, watermark = admission.full_sequence_must_fit, admission.watermark
    if (
        m._single_full
        and not hits
        and not full_sequence_must_fit
        and watermark == 0
        and admission.external_tokens == 0
    ):
        # Fast path (most decode steps): the table already covers the new
        # tokens, so nothing can be refused or allocated.
        table = tables[0]
        table.grown = 0
        computed = min(seq.num_computed_tokens, max_len)
        if min(computed + num_new_tokens + m._lookahead, max_len) <= len(table) * bs:
            if m._enable_caching:
                upto = min(computed + num_new_tokens, seq.num_tokens)
                cache_blocks(m, 0, table, seq, upto)
            return 0
    computed = min(
        seq.num_computed_tokens + num_new_computed_tokens + admission.external_tokens, max_len
    )
    if full_sequence_must_fit:
        full = min(seq.num_tokens, max_len)
        need = blocks_needed_all(m, tables, full, admission.encoder_tokens, hits, True)
        if need + watermark > m._pool.num_free_blocks:
            return None
    # The lookahead slots come on top; the admission gate above ignores
    # them, as vLLM's does.
    lookahead = 0 if admission.load_async else m._lookahead
    slots = min(computed + num_new_tokens + lookahead, max_len)
    if not m._single_full:
        # What the steps computed for sure (not what is still in flight)
        # is all a window can have left behind.
        processed = max(computed - in_flight, 0)
        for g, table in enumerate(tables):
            remove_skipped_blocks(m, g, table, processed)
    encoder_tokens = admission.encoder_tokens
    needed = blocks_needed_all(m, tables, slots, encoder_tokens, hits, False)
    if needed + watermark + admission.reserved_blocks > m._pool.num_free_blocks:
        return None
    # Enough is free: from here on nothing can fail.
    if hits:
        for g, table in enumerate(tables):
            take_hits(m, g, table, hits[g], computed)
    # Group by group, in order (as vLLM's coordinator takes them); each
    # table records its growth for the step's new block ids.
    for g, table in enumerate(tables):
        kind = m._groups[g].kind
        required = cdiv(slots_of(m, g, slots, encoder_tokens), m.group_block_size(g))
        grow = max(required + kind.extra_blocks() - len(table), 0)
        table.blocks.extend(m._pool.take_free_blocks(grow))
        table.grown = grow
        if m._blocks_to_zero is not None and not kind.is_recurrent():
            m._blocks_to_zero[g].extend(b.block_id for b in table.blocks[len(table) - grow :])
    k = tables[0].grown if tables else 0
    # A load still on its way is cached once it is reported.
    if m._enable_caching and not admission.load_async:
        upto = min(computed + num_new_tokens, seq.num_tokens)
        for g, table in enumerate(tables):
            cache_blocks(m, g, table, seq, upto)
    return k


def take_hits(
    m: KvCacheManager, g: int, table: BlockTable, hits: list[Block], computed: int
) -> None:
    """Adopt group ``g``'s prefix hits: the blocks a window no longer
    reads (before ``computed``'s window) stay null, the rest are taken."""
    skipped = m._groups[g].kind.num_skipped_tokens(computed) // m.group_block_size(g)
    skipped = min(skipped, len(hits))
    taken = hits[skipped:]
    m._pool.add_refs([b for b in taken if b.block_id != NULL_BLOCK])
    null = null_block(m)
    del table.blocks[skipped:]
    table.blocks.extend([null] * (skipped - len(table.blocks)))
    table.blocks.extend(taken)
    table.num_cached = len(table.blocks)


def remove_skipped_blocks(m: KvCacheManager, g: int, table: BlockTable, processed: int) -> None:
    """Give back group ``g``'s blocks that no position after
    ``processed`` tokens reads (a window's past), last first, leaving
    nulls; stops at the first position already null."""
    skipped = m._groups[g].kind.num_skipped_tokens(processed) // m.group_block_size(g)
    k = min(skipped, len(table))
    if k == 0 or table.blocks[k - 1].block_id == NULL_BLOCK:
        return  # nothing newly out of the window: most steps
    freed: list[Block] = []
    for i in range(k - 1, -1, -1):
        if table.blocks[i].block_id == NULL_BLOCK:
            break
        freed.append(table.blocks[i])
        table.blocks[i] = null_block(m)
    if freed:
        m._pool.release(freed)


def null_block(m: KvCacheManager) -> Block:
    """The pool's null block, which a window's skipped positions hold."""
    null = m._pool.block(NULL_BLOCK)
    assert null is not None
    return null


def check_allocation(
    m: KvCacheManager,
    table: BlockTable,
    seq: Sequence,
    num_new_tokens: int,
    num_new_computed_tokens: int,
    hit_ids: list[int],
) -> list[Block]:
    """The checks of ``allocate_slots``; returns the hit blocks."""
    bs = m._block_size
    if num_new_tokens == 0 and num_new_computed_tokens == 0:
        raise ValueError("allocate_slots: num_new_tokens and num_new_computed_tokens are both 0")
    if num_new_computed_tokens != len(hit_ids) * bs:
        raise ValueError(
            f"allocate_slots: num_new_computed_tokens = {num_new_computed_tokens} must be "
            f"len(new_computed_blocks) * block_size = {len(hit_ids) * bs}"
        )
    if not hit_ids:
        return []
    if not table.is_empty() or seq.num_computed_tokens != 0:
        raise ValueError(
            "allocate_slots: new_computed_blocks are only taken by a request with an empty "
            "table and no computed tokens"
        )
    if len(hit_ids) * bs >= seq.num_tokens:
        raise ValueError(
            f"allocate_slots: {num_new_computed_tokens} hit tokens leave none of the "
            f"request's {seq.num_tokens} tokens to compute"
        )
    # A hit must be the cached block of the same position, so it holds
    # exactly this request's tokens (chained hashes imply the prefix). A
    # hit past the request's last full block has no hash to match.
    hashes = seq.block_hashes
    hits = []
    for k, block_id in enumerate(hit_ids):
        block = m._pool.block(block_id) if block_id != NULL_BLOCK else None
        if block is None or k >= len(hashes) or block.hash != hashes[k]:
            raise ValueError(
                f"allocate_slots: new_computed_blocks[{k}] = {block_id} is not a cached "
                f"copy of the request's block {k}"
            )
        hits.append(block)
    return hits
