"""KV-cache groups (the twin of ``rust/src/attention_group.rs``): a model
whose layers attend differently keeps one block table per group of alike
layers, all drawing on one block pool. Full attention keeps every block; a
sliding window (gpt-oss, Gemma) and chunked local attention (Llama 4) stop
reading old blocks, which then go back to the pool, and make prefix hits and
caching follow their own rules. A recurrent group (Mamba, linear attention)
keeps a state per block rather than a token's KV per slot. Each rule here is
vLLM 0.33's, per attention type."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ironbatch.reference.block import cdiv


class _Attention:
    """What every kind shares: blocks of the cache's size, one slot per
    token, nothing held past the tokens."""

    def tokens_per_block(self, cache_block_size: int) -> int:
        """Tokens per block of this group: the cache's ``block_size``."""
        return cache_block_size

    def extra_blocks(self) -> int:
        """Blocks held past those covering the tokens: none."""
        return 0

    def prefill_checkpoint_alignment(self) -> int | None:
        """The query offsets at which a recurrent group can write a prefill
        checkpoint from inside a chunk: none."""
        return None

    def is_full(self) -> bool:
        """Whether it is full attention."""
        return False

    def is_cross(self) -> bool:
        """Whether it is cross-attention."""
        return False

    def is_slotless(self) -> bool:
        """Whether its blocks hold no per-token slots."""
        return False

    def is_recurrent(self) -> bool:
        """Whether it is a recurrent state (Mamba, linear attention)."""
        return False


@dataclass(frozen=True)
class Full(_Attention):
    """Every earlier token."""

    def num_skipped_tokens(self, processed: int) -> int:
        """Leading tokens no later position reads once ``processed`` tokens
        are computed: none."""
        del processed
        return 0

    def is_full(self) -> bool:
        return True


@dataclass(frozen=True)
class SlidingWindow(_Attention):
    """The last ``window`` tokens (the token itself included)."""

    window: int

    def num_skipped_tokens(self, processed: int) -> int:
        """Everything before the window of the next position."""
        return max(processed + 1 - self.window, 0)


@dataclass(frozen=True)
class ChunkedLocal(_Attention):
    """The tokens of the current ``chunk``-sized chunk."""

    chunk: int

    def num_skipped_tokens(self, processed: int) -> int:
        """Every chunk before the one the next position is in."""
        return processed // self.chunk * self.chunk


@dataclass(frozen=True)
class CrossAttention(_Attention):
    """An encoder-decoder's decoder attending to the encoder's output
    (Whisper): blocks for the encoder tokens, taken once when the encoder
    input runs and held until the request frees, never prefix cached."""

    def num_skipped_tokens(self, processed: int) -> int:
        """None: the decoder reads the whole encoder output every step."""
        del processed
        return 0

    def is_cross(self) -> bool:
        """Its blocks follow the encoder's tokens, not the decoder's."""
        return True

    def is_slotless(self) -> bool:
        """Its slots are the encoder's tokens'."""
        return True


@dataclass(frozen=True)
class Mamba(_Attention):
    """A recurrent state (Mamba, linear attention: Qwen3-Next, Nemotron-H,
    Granite-4.0-H, Jamba; §7.15): one state block per ``block_size`` tokens
    (vLLM's ``mamba_block_size``), of which only the last computed token's
    is kept, plus ``speculative_blocks`` scratch states for a drafter's
    tokens. With prefix caching off (vLLM's cache mode "none") the block
    size is the model's length unless set, so one block; with it on ("align")
    it is the cache's block size or a divisor of every attention group's
    (§7.16), and the states at block boundaries are cached.
    ``checkpoint_alignment``: with prefix caching, the backend can also write
    the prompt's checkpoint from inside the chunk that passes it, at query
    offsets a multiple of this (vLLM's
    ``prefill_checkpoint_alignment`` beside ``num_prefill_checkpoint_blocks``:
    Mamba2's kernels); None when it cannot."""

    block_size: int
    speculative_blocks: int = 0
    checkpoint_alignment: int | None = None

    def num_skipped_tokens(self, processed: int) -> int:
        """All but the last computed token: only its state is read again."""
        return max(processed - 1, 0)

    def tokens_per_block(self, cache_block_size: int) -> int:
        """Its own block size."""
        del cache_block_size
        return self.block_size

    def extra_blocks(self) -> int:
        """Its drafts' scratch states."""
        return self.speculative_blocks

    def is_slotless(self) -> bool:
        """Its blocks hold states."""
        return True

    def is_recurrent(self) -> bool:
        return True

    def prefill_checkpoint_alignment(self) -> int | None:
        """Its ``checkpoint_alignment`` (the core's
        ``AttentionKind::checkpoint_alignment()``: a method here cannot share
        the field's name)."""
        return self.checkpoint_alignment


#: How a group's layers attend (the core's ``AttentionKind`` enum).
AttentionKind = Full | SlidingWindow | ChunkedLocal | CrossAttention | Mamba


@dataclass(frozen=True)
class GroupSpec:
    """One KV-cache group."""

    kind: AttentionKind
    #: The most blocks an admission's whole-prompt check counts for this
    #: group (vLLM's ``max_admission_blocks_per_request``, from the window
    #: and the tokens that can be in flight); None for full attention.
    admission_cap_blocks: int | None = None
    #: Tokens per block of an attention group whose blocks hold another
    #: number of tokens than the cache's ``block_size`` (vLLM's
    #: mixed-precision hybrids: a layer stored at another precision fits
    #: another number of tokens in the pool's page); None for the cache's.
    #: A recurrent group's size is its kind's.
    block_size: int | None = None

    def tokens_per_block(self, cache_block_size: int) -> int:
        """Tokens per block: its own, else its kind's (a recurrent
        state's), else the cache's ``cache_block_size``."""
        if self.block_size is not None:
            return self.block_size
        return self.kind.tokens_per_block(cache_block_size)


#: A full-attention group: what a model of one attention type has.
FULL = GroupSpec(Full())


def contiguous_blocks_for_hit(window: int, block_size: int) -> int:
    """Contiguous cached blocks a sliding-window hit must end with: the
    blocks the window reads back from the hit's end."""
    return cdiv(max(window - 1, 0), block_size)


# The core's mixing constant (any bijection per group would do: the twin's
# hashes are not the core's, only the decisions they lead to must match).
_MIX = 0x9E37_79B9_7F4A_7C15_F39C_C060_5CED_C835
_U128 = (1 << 128) - 1


def group_key(block_hash: int, group: int) -> int:
    """A block hash as group ``group`` caches it: groups share a request's
    hashes but not their blocks, so each group keys its cached blocks apart
    (vLLM's ``BlockHashWithGroupId``). Group 0's keys are the hashes
    themselves; the others are a bijection of them."""
    return block_hash ^ ((group * _MIX) & _U128)


def checkpoint_in_chunk(
    start: int, end: int, checkpoint: int, block_size: int, alignment: int
) -> bool:
    """Whether a chunk computing tokens ``start..end`` can write the state
    after ``checkpoint`` tokens from inside itself (vLLM's
    ``is_mamba_prefill_checkpoint_valid``, hashes of the block size): the
    checkpoint lies strictly inside the chunk, a block or more past its
    start, at a multiple of ``alignment`` from it, in a block before the one
    the chunk ends in and after the one it starts from."""
    initial = (start - 1) // block_size  # the initial state's block (-1: none)
    checkpoint_block = cdiv(end, block_size) - 2
    return (
        start % block_size == 0
        and checkpoint_block > initial
        and start + block_size <= checkpoint
        and start < checkpoint < end
        and (checkpoint - start) % alignment == 0
    )


def recurrent_mask(
    block_size: int,
    alignment: int,
    sparse: bool,
    num_prompt_tokens: int,
    shared_prefix_boundary: int,
    segment_tokens: int = 0,
    eagle: EagleReach | None = None,
) -> Callable[[int], bool]:
    """Which blocks a recurrent group caches in cache mode "align" (vLLM's
    Mamba ``reachable_block_mask``): every block with dense retention
    (``sparse`` false); else the state block that ends where a later request
    can resume — the prompt's last token (``num_prompt_tokens - 1``) and a
    shared prefix (``shared_prefix_boundary``, 0 for none), each rounded down
    to ``alignment`` (the scheduler block, where hits land) — since a hit
    needs that one state alone; with a retention interval (``segment_tokens``;
    0 for none) also the last block of every segment, and every block when a
    segment is one block or less. ``eagle`` moves the resume points as it
    moves a window's (vLLM's ``replay_boundaries``): a unit before a
    resend's and a longer sibling's, and, for a group that drops a block
    itself, a block below the shared prefix too; the state is the one block
    there (no drafter has recurrent layers, so no block past it)."""
    eagle = eagle or EagleReach()
    per_segment = segment_tokens // block_size
    dense = not sparse or (segment_tokens > 0 and per_segment <= 1)

    def ending_at(boundary: int) -> int | None:
        # The block ending at ``boundary`` rounded down; none below one block.
        k = boundary // alignment * alignment // block_size - 1
        return k if k >= 0 else None

    unit = alignment
    if eagle.any_group:
        resend = max(num_prompt_tokens - 1, 0) // unit * unit
        extension = num_prompt_tokens // unit * unit
        resume = {ending_at(max(resend - unit, 0)), ending_at(max(extension - unit, 0))}
    else:
        resume = {ending_at(max(num_prompt_tokens - 1, 0))}
    kept = resume
    if shared_prefix_boundary > 0:
        kept = kept | {ending_at(shared_prefix_boundary)}
        if eagle.this_group:
            kept = kept | {ending_at(max(shared_prefix_boundary - block_size, 0))}
    kept.discard(None)
    return lambda i: dense or (per_segment > 1 and (i + 1) % per_segment == 0) or i in kept


@dataclass(frozen=True)
class EagleReach:
    """How an EAGLE-style drafter's dropped block moves what a window
    caches: ``any_group`` — some group's hits drop a block (the resume points
    are then a block before each of vLLM's two: a resend's and a longer
    sibling's); ``this_group`` — this window's own hits do (it keeps one
    block more, up to the block past each resume point, which it matches and
    drops)."""

    any_group: bool = False
    this_group: bool = False


def sparse_mask(
    start: int,
    end: int,
    block_size: int,
    alignment: int,
    window: int,
    num_prompt_tokens: int,
    shared_prefix_boundary: int,
    segment_tokens: int = 0,
    eagle: EagleReach = EagleReach(),
) -> Callable[[int], bool]:
    """Which of blocks ``start..end`` a sliding-window group caches under
    sparse retention (vLLM's ``prefix_cache_retention_interval`` 0, its
    default, or above): the ``need`` blocks that end at a position a later
    request can resume at — the prompt's last token (``num_prompt_tokens -
    1``) and a shared prefix another request was found to have
    (``shared_prefix_boundary``, 0 for none) — since a hit there is all a
    window needs; with a retention interval (``segment_tokens``, a multiple
    of the block size; 0 for none) also the last ``need`` blocks of every
    segment of that many tokens, and every block when a segment is no longer
    than ``need`` blocks. ``eagle`` moves them (vLLM's ``replay_boundaries``
    and ``reachable_block_mask``). Resume points are rounded down to
    ``alignment`` (the scheduler block: where hits land; the block size when
    the groups' blocks are alike)."""
    assert start <= end
    bs, unit = block_size, alignment
    shift = int(eagle.this_group)
    need = contiguous_blocks_for_hit(window, block_size) + shift

    def tail(boundary: int) -> range:
        end_block = boundary // alignment * alignment // block_size + shift
        return range(max(end_block - need, 0), end_block)

    if eagle.any_group:
        # A resend hits up to its last whole unit but one, a longer sibling
        # up to the prompt's last whole unit but one.
        resend = max(num_prompt_tokens - 1, 0) // unit * unit
        extension = num_prompt_tokens // unit * unit
        resume = [tail(max(resend - unit, 0)), tail(max(extension - unit, 0))]
    else:
        resume = [tail(max(num_prompt_tokens - 1, 0))]
    shared = [tail(shared_prefix_boundary)] if shared_prefix_boundary > 0 else []
    if shared_prefix_boundary > 0 and eagle.this_group:
        # A window that drops a block is also kept for a sibling that parts
        # right after the shared prefix: its hit lands a block lower.
        shared.append(tail(max(shared_prefix_boundary - bs, 0)))
    per_segment = segment_tokens // block_size
    dense = per_segment > 0 and need >= per_segment
    return lambda i: (
        dense
        or (per_segment > 0 and i >= shift and (i - shift) % per_segment >= per_segment - need)
        or any(i in r for r in resume)
        or any(i in r for r in shared)
    )


def dense_window_mask(
    block_size: int, alignment: int, window: int, drops_eagle: bool
) -> Callable[[int], bool] | None:
    """Which blocks a sliding-window group caches with dense retention
    (vLLM's ``prefix_cache_retention_interval`` None) when the scheduler
    block (``alignment``) spans more of its blocks than a hit needs: the
    ``need`` blocks before each multiple of it, where hits land (for a
    group that drops an EAGLE block, one more, shifted a block on: its hit
    looks one block past the multiple); None when that is every block
    (always, when the groups' blocks are alike)."""
    shift = int(drops_eagle)
    need = contiguous_blocks_for_hit(window, block_size) + shift
    per_segment = alignment // block_size
    if need >= per_segment:
        return None
    return lambda i: i >= shift and (i - shift) % per_segment >= per_segment - need
