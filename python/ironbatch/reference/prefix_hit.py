"""The longest prefix-cache hit valid for every KV-cache group, as vLLM
0.33's hybrid coordinator finds it (the twin of ``rust/src/prefix_hit.rs``).

Each attention type looks for its own kind of hit, at most a candidate length
long: full attention the leading run of cached blocks; a sliding window the
rightmost run of ``cdiv(window - 1, bs)`` cached blocks (what its window
reads back from the hit's end; the blocks before it are not needed); chunked
local attention the cached blocks of the candidate's last chunk. Groups of
one kind and size are asked together (a block must be cached in each). Full
attention goes first; each answer becomes the next candidate, until a pass
changes nothing (one pass when there are two kinds, or one group: vLLM's
unitary coordinator asks its group once). Full attention's answer is kept only
up to the final hit.

An EAGLE-style drafter's groups without lookahead hashes (§7.4) give up the
last block of their hit: full attention drops its last block, a window asks
one block more and drops it. Beside other groups such a kind first looks a
block past the candidate, so that after the drop it lands on it, and does so
once per candidate (vLLM's ``eagle_verified``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ironbatch.reference.attention_group import (
    AttentionKind,
    ChunkedLocal,
    CrossAttention,
    Full,
    Mamba,
    SlidingWindow,
    contiguous_blocks_for_hit,
    group_key,
)
from ironbatch.reference.block import NULL_BLOCK, Block, cdiv
from ironbatch.reference.block_pool import BlockPool


@dataclass
class LookupGroup:
    """Groups asked together: one attention kind and block size, the group
    ids that have them, and whether their hit gives up its last block (any of
    them holds an EAGLE-style drafter's layers)."""

    kind: AttentionKind
    block_size: int
    group_ids: list[int]
    drops_eagle_block: bool = False


def lookup_groups(
    kinds: list[AttentionKind], block_sizes: list[int], eagle: list[bool] | None = None
) -> list[LookupGroup]:
    """The lookup order for groups of these kinds and block sizes
    (``eagle[g]``: group ``g`` drops an EAGLE block): alike groups together,
    in order of first appearance, full attention first (a stable sort)."""
    out: list[LookupGroup] = []
    for g, (kind, block_size) in enumerate(zip(kinds, block_sizes, strict=True)):
        drops = bool(eagle[g]) if eagle and g < len(eagle) else False
        same = next((lg for lg in out if lg.kind == kind and lg.block_size == block_size), None)
        if same is None:
            out.append(LookupGroup(kind, block_size, [g], drops))
        else:
            same.group_ids.append(g)
            same.drops_eagle_block |= drops
    out.sort(key=lambda lg: not lg.kind.is_full())
    return out


@dataclass
class PrefixHit:
    """A hit: ``tokens`` long, with each group's blocks."""

    tokens: int = 0
    #: The longest hit one group alone had, when longer than ``tokens``: a
    #: prefix other requests share that a sparse group has not cached yet
    #: (vLLM's ``shared_prefix_boundary``, pinned so that group caches it);
    #: 0 otherwise.
    shared_prefix_boundary: int = 0
    #: ``blocks[g]``: group ``g``'s hit blocks (the null block where the
    #: group needs none), ``tokens / bs`` of them for its block size ``bs``
    #: (the core writes them into
    #: the caller's scratch lists instead).
    blocks: list[list[Block]] = field(default_factory=list)


@dataclass(frozen=True)
class HitQuery:
    """One prefix lookup: a request's ``hashes`` (one per
    ``hash_block_size`` tokens), the most tokens its hit may cover
    (``max_len``), and the unit each kind's hit ends on (``alignment``: the
    scheduler block; the block size when the groups' are alike)."""

    hashes: list[int]
    max_len: int
    hash_block_size: int
    alignment: int


def find_longest_hit(
    pool: BlockPool, groups: list[LookupGroup], query: HitQuery, num_groups: int
) -> PrefixHit:
    """Find the hit ``query`` asks for, over ``num_groups`` groups."""
    hashes, max_len = query.hashes, query.max_len
    hash_block_size, alignment = query.hash_block_size, query.alignment
    blocks: list[list[Block]] = [[] for _ in range(num_groups)]
    looked_up = [False] * num_groups
    hit_by_group = [0] * num_groups
    hit = max_len
    longest = 0
    # vLLM's hybrid coordinator stops after one pass for full attention beside
    # one other kind; its unitary one (a single group) asks once.
    one_pass = (len(groups) == 2 and groups[0].kind.is_full()) or num_groups == 1
    # A kind that drops an EAGLE block does so once per candidate length.
    eagle_verified = [False] * len(groups)
    hashed = len(hashes) * hash_block_size
    while True:
        candidate = hit
        for idx, lg in enumerate(groups):
            first = lg.group_ids[0]
            if lg.kind.is_full() and looked_up[first]:
                # Full attention is downward-closed: its first answer holds.
                candidate = min(candidate, hit_by_group[first])
                continue
            drop = lg.drops_eagle_block and not eagle_verified[idx]
            reach = _reach_for(lg, candidate, drop, num_groups, hashed)
            view = HashView(hashes, lg.block_size // hash_block_size)
            found = _find_for(pool, lg, view, reach, alignment, blocks, drop)
            if drop:
                eagle_verified[idx] = True
            elif found < candidate:
                eagle_verified = [False] * len(groups)
            candidate = found
            for g in lg.group_ids:
                looked_up[g] = True
                hit_by_group[g] = found
            longest = max(longest, candidate)
        if candidate >= hit:
            break
        hit = candidate
        if one_pass:
            break
    for lg in groups:
        if lg.kind.is_full():
            keep = cdiv(hit, lg.block_size)
            for g in lg.group_ids:
                del blocks[g][keep:]
    return PrefixHit(hit, longest if longest > hit else 0, blocks)


def _reach_for(lg: LookupGroup, candidate: int, drop: bool, num_groups: int, hashed: int) -> int:
    """How far kind ``lg`` looks for a hit of at most ``candidate`` tokens:
    beside other groups, a kind that drops an EAGLE block looks a block past
    it, so that after the drop it lands on it (vLLM's hybrid coordinator; its
    unitary one asks for the candidate). Not a recurrent state: its finder
    never drops."""
    if drop and num_groups > 1 and not lg.kind.is_recurrent():
        return min(candidate + lg.block_size, hashed)
    return candidate


@dataclass
class GroupHits:
    """Per-group hits told to a KV connector (§4.19.2): full attention's,
    which the request takes, and whether another group's fell short of it
    (its state then comes from the connector, or the hit is found again)."""

    tokens: int
    diverged: bool
    #: ``blocks[g]``: group ``g``'s own hit blocks (the core writes them into
    #: the caller's scratch lists instead).
    blocks: list[list[Block]] = field(default_factory=list)


def find_hit_per_group(
    pool: BlockPool, groups: list[LookupGroup], query: HitQuery, blocks: list[list[Block]]
) -> list[int]:
    """Each group's own hit for ``query``, every kind asked alone (vLLM's
    ``find_longest_cache_hit_per_group``, which a KV connector that
    completes divergent hybrid hits is told of, §4.19.2), into ``blocks``
    (one list per group, its own hit's length); returns each group's hit in
    tokens."""
    hashes, max_len = query.hashes, query.max_len
    hash_block_size, alignment = query.hash_block_size, query.alignment
    num_groups = len(blocks)
    hit_by_group = [0] * num_groups
    hashed = len(hashes) * hash_block_size
    for lg in groups:
        drop = lg.drops_eagle_block
        reach = _reach_for(lg, max_len, drop, num_groups, hashed)
        view = HashView(hashes, lg.block_size // hash_block_size)
        found = _find_for(pool, lg, view, reach, alignment, blocks, drop)
        for g in lg.group_ids:
            hit_by_group[g] = found
    return hit_by_group


def _cached_in_all(pool: BlockPool, lg: LookupGroup, block_hash: int) -> list[Block] | None:
    """The blocks cached under ``block_hash`` in every group of ``lg`` (None
    when one group has none)."""
    row = []
    for g in lg.group_ids:
        block = pool.get_cached_block(group_key(block_hash, g))
        if block is None:
            return None
        row.append(block)
    return row


@dataclass(frozen=True)
class HashView:
    """A request's hashes as a group of ``per_block`` hash blocks a block
    sees them: block ``i``'s is the chain's hash where it ends (vLLM's
    ``BlockHashListWithBlockSize``)."""

    hashes: list[int]
    per_block: int

    def __len__(self) -> int:
        return len(self.hashes) // self.per_block

    def get(self, i: int) -> int:
        return self.hashes[(i + 1) * self.per_block - 1]


def _find_for(
    pool: BlockPool,
    lg: LookupGroup,
    hashes: HashView,
    max_len: int,
    alignment: int,
    blocks: list[list[Block]],
    drop: bool = False,
) -> int:
    """One kind's hit of at most ``max_len`` tokens, written into ``blocks``
    for its groups, its last block given up when ``drop`` (full attention and
    windows; a window then asks one contiguous block more); returns its
    length in tokens. It ends on a multiple of ``alignment`` (for chunked
    local attention, whose blocks are the alignment's, trivially)."""
    block_size = lg.block_size
    num_blocks = min(max_len // block_size, len(hashes))
    null = pool.block(NULL_BLOCK)
    assert null is not None
    out: list[list[Block]] = [[] for _ in lg.group_ids]  # per group of lg
    kind = lg.kind
    if isinstance(kind, Full):
        for i in range(num_blocks):
            row = _cached_in_all(pool, lg, hashes.get(i))
            if row is None:
                break
            for column, block in zip(out, row, strict=True):
                column.append(block)
        if drop:
            for column in out:
                del column[-1:]
        # Down to the alignment (blocks smaller than the scheduler block:
        # vLLM's full-attention finder rounds its hit so).
        keep = len(out[0])
        while keep * block_size % alignment:
            keep -= 1
        for column in out:
            del column[keep:]
    elif isinstance(kind, SlidingWindow):
        # Right to left: the first run long enough ends the hit there.
        need = contiguous_blocks_for_hit(kind.window, block_size) + int(drop)
        out = [[null] * num_blocks for _ in lg.group_ids]
        run = 0
        found = False
        for i in range(num_blocks - 1, -1, -1):
            row = _cached_in_all(pool, lg, hashes.get(i))
            if row is None:
                run = 0
                continue
            # A run must end where a hit can: on the alignment.
            end = i if drop else i + 1
            if run == 0 and block_size != alignment and end * block_size % alignment:
                continue
            for column, block in zip(out, row, strict=True):
                column[i] = block
            run += 1
            if run >= need:
                for column in out:
                    del column[i + run :]
                found = True
                break
        if not found:
            # A shorter run counts only from the first block, and up to the
            # alignment.
            keep = run
            while keep * block_size % alignment:
                keep -= 1
            for column in out:
                del column[keep:]
        if drop:
            for column in out:
                del column[-1:]
            keep = len(out[0])
            while keep * block_size % alignment:
                keep -= 1
            for column in out:
                del column[keep:]
    elif isinstance(kind, Mamba):
        # One state is all a hit needs: the rightmost cached one, after
        # nulls (cache mode "align", §7.15), ending where a hit can, on the
        # alignment (states smaller than the attention blocks, §7.16).
        for i in range(num_blocks - 1, -1, -1):
            if block_size != alignment and (i + 1) * block_size % alignment:
                continue
            row = _cached_in_all(pool, lg, hashes.get(i))
            if row is not None:
                out = [[null] * i + [block] for block in row]
                break
    elif isinstance(kind, CrossAttention):
        pass  # never cached (prefix caching is off beside it): no hit
    else:
        assert isinstance(kind, ChunkedLocal)
        # Blocks before the candidate's last chunk need nothing cached.
        start = max_len // kind.chunk * kind.chunk // block_size
        out = [[null] * start for _ in lg.group_ids]
        for i in range(start, num_blocks):
            row = _cached_in_all(pool, lg, hashes.get(i))
            if row is None:
                break
            for column, block in zip(out, row, strict=True):
                column.append(block)
    for g, column in zip(lg.group_ids, out, strict=True):
        blocks[g] = column
    return len(out[0]) * block_size
