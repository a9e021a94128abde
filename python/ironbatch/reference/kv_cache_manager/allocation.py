"""Slot allocation (docs/scheduling.md §7.6, §7.11, §7.13): the admission
gate summed over the groups (window caps included), window blocks given
back, prefix hits taken, the same new blocks per group, and the hash caching
the step's tokens allow. ``allocate_slots`` checks every argument before
anything changes, so a refusal leaves the pool, the map and the tables as
they were."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ironbatch.reference.attention_group import checkpoint_in_chunk
from ironbatch.reference.block import NULL_BLOCK, Block, cdiv
from ironbatch.reference.block_table import BlockTable
from ironbatch.reference.kv_cache_manager.caching import cache_blocks
from ironbatch.reference.kv_cache_manager.prefill_checkpoints import StateCheckpoint
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
    #: The request's slot, named in the KV-cache events of the blocks the
    #: allocation hash-caches (None: no store is logged).
    owner: int | None = None
    #: The groups (bit ``g``: group ``g``) whose blocks for the external
    #: tokens an asynchronous load writes: not listed for zeroing, which
    #: would race it (vLLM's ``skip_zeroing_group_ids``).
    loaded_groups: int = 0


@dataclass(frozen=True)
class Span:
    """The tokens an allocation covers, as the groups count them."""

    #: Slots: the tokens, a drafter's lookahead included.
    slots: int
    #: The model's own tokens: those computed and the new ones.
    main: int
    #: Tokens computed before the step, hits included.
    computed: int
    #: Where the request's prefill ends: its prompt, or for a resumed
    #: request its tokens but the last.
    prefill_end: int


def blocks_needed(
    m: KvCacheManager, g: int, table: BlockTable, span: Span, hits: list[Block], capped: bool
) -> int:
    """Blocks group ``g`` must take to cover ``span`` after its ``hits``:
    positions not held yet (and a recurrent group's scratch states), plus
    hits that sit in the free queue (taking them shrinks the free count
    too). ``capped``: the admission check, which counts a window group's
    blocks only up to its cap. A recurrent group caching its states counts
    them by the model's tokens and may come out negative (§7.15)."""
    kind = m._groups[g].kind

    def evictable(blocks: list[Block]) -> int:
        return sum(1 for b in blocks if b.block_id != NULL_BLOCK and b.ref_cnt == 0)

    if m._align and kind.is_recurrent():
        return states_needed(m, g, table, span, len(hits)) + evictable(hits)
    required = cdiv(span.slots, m.group_block_size(g)) + kind.extra_blocks()
    cap = m._groups[g].admission_cap_blocks
    if capped and cap is not None:
        required = min(required, cap)
    if len(table):
        return max(required - len(table) - len(hits), 0) + evictable(hits)
    # A new table starts with nulls for the blocks a window no longer reads
    # after the computed tokens, which an external hit (a KV connector's)
    # may put past the local hits; the hits there are not taken (vLLM's
    # ``get_num_blocks_to_allocate``).
    skipped = m.skipped_blocks(g, span.computed)
    return max(required - max(skipped, len(hits)), 0) + evictable(hits[skipped:])


def states_needed(m: KvCacheManager, g: int, table: BlockTable, span: Span, hits: int) -> int:
    """New state blocks recurrent group ``g`` takes for the step in cache
    mode "align" (vLLM's ``MambaManager.get_num_blocks_to_allocate``): the
    positions not held yet, at most one state per step (and one for a
    prefill checkpoint) once the scratch states are taken; negative when
    drafts left it more than it needs."""
    extra = m._groups[g].kind.extra_blocks()
    required = cdiv(span.main, m.group_block_size(g)) + extra
    new = required - hits - len(table)
    if new <= 0:
        return new
    checkpoint = int(checkpoint_in_step(m, g, table, span) is not None)
    return min(new, 1 + checkpoint + (0 if table.states.allocated else extra))


def checkpoint_in_step(
    m: KvCacheManager, g: int, table: BlockTable, span: Span
) -> StateCheckpoint | None:
    """Where recurrent group ``g`` writes the prompt's checkpoint from inside
    the step (vLLM's ``_needs_internal_checkpoint``): the step ends the
    prefill (any step, unless retention is sparse without an interval), its
    backend can write a state inside a chunk, the checkpoint
    lies inside the chunk, and the block for it is still free to take (a
    null or beyond the table, or a scratch state)."""
    kind = m._groups[g].kind
    alignment = kind.prefill_checkpoint_alignment()
    bs = m.group_block_size(g)
    block = cdiv(span.main, bs) - 2
    if alignment is None or block < 0:
        return None
    # (Where a hit lands: vLLM's ``cache_hit_alignment_tokens``.)
    position = m.state_checkpoint(span.main, m._scheduler_block_size)
    free_slot = (
        block >= len(table)
        or table.blocks[block].block_id == NULL_BLOCK
        or (table.states.allocated and block + kind.extra_blocks() >= len(table))
    )
    # Under sparse retention only the chunk that ends the prefill keeps its
    # checkpoint; otherwise every chunk's is kept (vLLM's coordinator passes
    # no prefill end then).
    every_chunk = not m._sparse_retention or m._retention_interval > 0
    inside = (every_chunk or span.main >= span.prefill_end) and checkpoint_in_chunk(
        span.computed, span.main, position, bs, alignment
    )
    if inside and free_slot and position > 0:
        return StateCheckpoint(position=position, block=block)
    return None


def blocks_needed_all(
    m: KvCacheManager,
    tables: list[BlockTable],
    span: Span,
    encoder_tokens: int,
    hits: list[list[Block]],
    capped: bool,
) -> int:
    """Blocks all groups must take (``hits``: one list per group, or none):
    ``span``'s slots in the decoder's groups, ``encoder_tokens`` in the
    cross-attention ones."""
    return sum(
        blocks_needed(
            m,
            g,
            table,
            replace(span, slots=slots_of(m, g, span.slots, encoder_tokens)),
            hits[g] if hits else [],
            capped,
        )
        for g, table in enumerate(tables)
    )


def hits_a_state_in_flight(m: KvCacheManager, hits: list[list[Block]]) -> bool:
    """Whether a recurrent group's hit ends on a state cached this step,
    which the step's forward pass has yet to write: the request waits a step
    (vLLM's ``MambaManager`` answers "more blocks than the pool")."""
    return m._align and any(
        m._groups[g].kind.is_recurrent()
        and bool(h)
        and h[-1].hash is not None
        and h[-1].hash in m._states_cached_this_step
        for g, h in enumerate(hits)
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
    bs, max_len = m._hash_block_size, m._max_model_len  # (the fast path's one group)
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
                cache_blocks(m, 0, table, seq, upto, admission.owner)
            return 0
    computed = min(
        seq.num_computed_tokens + num_new_computed_tokens + admission.external_tokens, max_len
    )
    if hits_a_state_in_flight(m, hits):
        return None
    prefill_end = max(seq.num_prompt_tokens, seq.num_tokens - 1)
    if full_sequence_must_fit:
        full = min(seq.num_tokens, max_len)
        span = Span(full, full, computed, prefill_end)
        need = blocks_needed_all(m, tables, span, admission.encoder_tokens, hits, True)
        if need + watermark > m._pool.num_free_blocks:
            return None
    # The lookahead slots come on top; the admission gate above ignores
    # them, as vLLM's does.
    lookahead = 0 if admission.load_async else m._lookahead
    main_tokens = computed + num_new_tokens
    slots = min(main_tokens + lookahead, max_len)
    if not m._single_full:
        # What the steps computed for sure (not what is still in flight)
        # is all a window can have left behind.
        processed = max(computed - in_flight, 0)
        for g, table in enumerate(tables):
            remove_skipped_blocks(m, g, table, processed)
    encoder_tokens = admission.encoder_tokens
    span = Span(slots, main_tokens, computed, prefill_end)
    needed = blocks_needed_all(m, tables, span, encoder_tokens, hits, False)
    # A prefill checkpoint is decided on the tables before their hits, as
    # vLLM decides it; every recurrent group's table has the same shape.
    # vLLM's MambaManager records it (or forgets the last) per request as it
    # counts, before it knows the blocks are free, and its caching reads it
    # until the request's next count: an output's caching between steps too.
    recurrent = [g for g, spec in enumerate(m._groups) if m._align and spec.kind.is_recurrent()]
    checkpoint = (
        checkpoint_in_step(m, recurrent[0], tables[recurrent[0]], span) if recurrent else None
    )
    if admission.owner is not None and m._align:
        m._state_checkpoints.set(admission.owner, checkpoint)
    if needed + watermark + admission.reserved_blocks > m._pool.num_free_blocks:
        return None
    # Enough is free: from here on nothing can fail.
    m._step_checkpoint = checkpoint
    # Hits and an external hit (a KV connector's) are taken by a request
    # that holds no blocks yet; one that does (a load that failed in part,
    # asked again) grows its tables as a running one does.
    fresh = all(not t.blocks for t in tables)
    if fresh and admission.external_tokens and m._align:
        beyond = state_blocks_beyond_count(m, tables, span, hits, admission.external_tokens)
        if needed + beyond > m._pool.num_free_blocks:
            # vLLM counts a cached state group's growth, not the block an
            # external hit gives it first, and its pool then runs dry
            # mid-allocation (its get_new_blocks raises): the request waits
            # instead.
            m._step_checkpoint = None
            return None
    if hits or (fresh and admission.external_tokens):
        for g, table in enumerate(tables):
            take_hits(m, g, table, hits[g] if hits else [], computed)
    if fresh and admission.external_tokens:
        # The external tokens' blocks, every group's, before any group's new
        # ones (vLLM allocates them in two passes).
        for g, table in enumerate(tables):
            if min(computed - m.skipped_tokens(g, computed), admission.external_tokens) > 0:
                grow = max(cdiv(computed, m.group_block_size(g)) - len(table), 0)
                table.blocks.extend(m._pool.take_free_blocks(grow))
                loaded = admission.loaded_groups & (1 << g) != 0
                if m._blocks_to_zero is not None and not loaded:
                    if not m._groups[g].kind.is_recurrent():
                        new = table.blocks[len(table) - grow :]
                        m._blocks_to_zero[g].extend(b.block_id for b in new)
    # Group by group, in order (as vLLM's coordinator takes them); each
    # table records its growth for the step's new block ids.
    for g, table in enumerate(tables):
        kind = m._groups[g].kind
        if m._align and kind.is_recurrent():
            grow_states(m, g, table, main_tokens, m._step_checkpoint is not None)
            continue
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
            cache_blocks(m, g, table, seq, upto, admission.owner)
    m._step_checkpoint = None
    return k


def state_blocks_beyond_count(
    m: KvCacheManager, tables: list[BlockTable], span: Span, hits: list[list[Block]], external: int
) -> int:
    """The blocks cached recurrent-state groups take for an external hit (a
    fresh request's) beyond what they count: the hit's block and the step's
    growth past it, less the growth counted (vLLM's
    ``get_num_blocks_to_allocate``, which leaves the hit's block out)."""
    checkpoint = int(m._step_checkpoint is not None)
    beyond = 0
    for g, table in enumerate(tables):
        if not m._groups[g].kind.is_recurrent():
            continue
        h = hits[g] if hits else []
        bs = m.group_block_size(g)
        computed = span.computed
        # take_hits, then the external pass, then grow_states (fresh).
        hit_len = max(m.skipped_blocks(g, computed), len(h))
        in_window = computed - m.skipped_tokens(g, computed)
        taken = max(cdiv(computed, bs) - hit_len, 0) if min(in_window, external) > 0 else 0
        length = hit_len + taken
        extra = m._groups[g].kind.extra_blocks()
        required = cdiv(span.main, bs) + extra
        if required <= length and not checkpoint:
            grown = 0
        else:
            ends_in = required - extra - 1
            base = max(ends_in - checkpoint, length) if length < ends_in else length
            grown = max(required - base, 0)
        counted = max(blocks_needed(m, g, table, span, h, False), 0)
        beyond += max(taken + grown - counted, 0)
    return beyond


def grow_states(
    m: KvCacheManager, g: int, table: BlockTable, main_tokens: int, checkpoint: bool
) -> None:
    """Grow recurrent group ``g``'s table to ``main_tokens`` in cache mode
    "align" (vLLM's ``MambaManager.allocate_new_blocks``, §7.15): nulls up to
    the position of the state the step ends in (or, with a prefill
    ``checkpoint``, the block before it, which holds the checkpoint), the
    scratch states moved past them, and a new block at each (with the
    scratch states, the first time). The step's new block ids are the
    table's tail from where it stood, nulls and moved blocks included, as
    vLLM sends them."""
    extra = m._groups[g].kind.extra_blocks()
    required = cdiv(main_tokens, m.group_block_size(g)) + extra
    before = len(table)
    table.grown = 0
    states = table.states
    if required <= before and not checkpoint:
        states.allocated = True
        return
    # The state this step starts from: the running one past the first
    # allocation, else a hit's.
    if states.allocated:
        states.previous = before - 1 - extra
    elif before > 0:
        states.previous = before - 1
    ends_in = required - extra - 1
    # The first position that keeps a block: the checkpoint's, else the
    # state the step ends in.
    kept = ends_in - int(checkpoint)
    null = null_block(m)
    if before < ends_in:
        table.blocks.extend([null] * (kept - before))
    if states.allocated:
        # Scratch states the step passed move to the end, in order.
        for i in range(before - extra, before):
            if i >= kept:
                break
            table.blocks.append(table.blocks[i])
            table.blocks[i] = null
    grow = max(required - len(table), 0)
    table.blocks.extend(m._pool.take_free_blocks(grow))
    states.allocated = True
    table.grown = len(table) - before


def take_hits(
    m: KvCacheManager, g: int, table: BlockTable, hits: list[Block], computed: int
) -> None:
    """Adopt group ``g``'s prefix hits: the blocks a window no longer
    reads (before ``computed``'s window) stay null, the rest are taken."""
    # An external hit (a KV connector's) may skip past the local hits.
    skipped = m.skipped_blocks(g, computed)
    taken = hits[skipped:]
    m._pool.add_refs([b for b in taken if b.block_id != NULL_BLOCK])
    null = null_block(m)
    del table.blocks[skipped:]
    table.blocks.extend([null] * (skipped - len(table.blocks)))
    table.blocks.extend(taken)
    table.num_cached = len(table.blocks)


def blocks_to_hold(m: KvCacheManager, tables: list[BlockTable], slots: int, seq: Sequence) -> int:
    """Blocks a running request's ``tables`` still take to hold ``slots``
    tokens, each window group's counted up to its admission cap (vLLM's
    ``get_num_blocks_to_allocate`` as its scheduler asks it for an in-flight
    prefill's reservation)."""
    span = Span(
        slots,
        min(seq.num_tokens, m._max_model_len),
        seq.num_computed_tokens,
        max(seq.num_prompt_tokens, seq.num_tokens - 1),
    )
    return max(blocks_needed_all(m, tables, span, 0, [], True), 0)


def draft_step_blocks(m: KvCacheManager, tokens: int) -> int:
    """The blocks one step of ``tokens`` drafted tokens takes in each group
    with per-token slots (vLLM's ``_spec_decode_step_blocks``)."""
    return sum(
        cdiv(tokens, m.group_block_size(g))
        for g, spec in enumerate(m._groups)
        if not spec.kind.is_recurrent()
    )


def remove_blocks_out_of_window(
    m: KvCacheManager, tables: list[BlockTable], processed: int
) -> None:
    """Give back every window group's blocks that no position after
    ``processed`` tokens reads (what vLLM's scheduler does before it hands
    a finished request's blocks to a KV connector)."""
    if m._single_full:
        return
    for g, table in enumerate(tables):
        remove_skipped_blocks(m, g, table, processed)


def remove_skipped_blocks(m: KvCacheManager, g: int, table: BlockTable, processed: int) -> None:
    """Give back group ``g``'s blocks that no position after
    ``processed`` tokens reads (a window's past), last first, leaving
    nulls; stops at the first position already null."""
    if m._align and m._groups[g].kind.is_recurrent():
        remove_past_states(m, g, table, processed)
        return
    skipped = m.skipped_blocks(g, processed)
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


def remove_past_states(m: KvCacheManager, g: int, table: BlockTable, processed: int) -> None:
    """Give back recurrent group ``g``'s states before the last processed
    token's block in cache mode "align" (vLLM's ``MambaManager``), last
    first, past the nulls between them; then the state the previous step
    started from, once the table has moved past it."""
    bs = m.group_block_size(g)
    skipped = min(max(processed - 1, 0) // bs, len(table))
    states = table.states
    if states.retired < skipped:
        freed = []
        for i in range(skipped - 1, states.retired - 1, -1):
            if table.blocks[i].block_id != NULL_BLOCK:
                freed.append(table.blocks[i])
                table.blocks[i] = null_block(m)
        if freed:
            m._pool.release(freed)
        states.retired = skipped
    p = states.previous
    if p is not None and p + 1 < cdiv(processed, bs) and table.blocks[p].block_id != NULL_BLOCK:
        m._pool.release([table.blocks[p]])
        table.blocks[p] = null_block(m)


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
    bs = m.group_block_size(0)
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
    hits = []
    for k, block_id in enumerate(hit_ids):
        block = m._pool.block(block_id) if block_id != NULL_BLOCK else None
        block_hash = m.group_block_hash(seq.block_hashes, 0, k)
        if block is None or block_hash is None or block.hash != block_hash:
            raise ValueError(
                f"allocate_slots: new_computed_blocks[{k}] = {block_id} is not a cached "
                f"copy of the request's block {k}"
            )
        hits.append(block)
    return hits
