//! KV-cache groups (docs/scheduling.md §7.13): a model whose layers attend
//! differently keeps one block table per group of alike layers, all drawing
//! on one block pool. Full attention keeps every block; a sliding window
//! (gpt-oss, Gemma) and chunked local attention (Llama 4) stop reading old
//! blocks, which then go back to the pool, and make prefix hits and caching
//! follow their own rules. A recurrent group (Mamba, linear attention) keeps
//! a state per block rather than a token's KV per slot. Each rule here is
//! vLLM 0.33's, per attention type.

use crate::block::cdiv;
use crate::block_hash::BlockHash;

/// How a group's layers attend.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum AttentionKind {
    /// Every earlier token.
    Full,
    /// The last `window` tokens (the token itself included).
    SlidingWindow { window: usize },
    /// The tokens of the current `chunk`-sized chunk.
    ChunkedLocal { chunk: usize },
    /// An encoder-decoder's decoder attending to the encoder's output
    /// (Whisper): blocks for the encoder tokens, taken once when the encoder
    /// input runs and held until the request frees, never prefix cached.
    CrossAttention,
    /// A recurrent state (Mamba, linear attention: Qwen3-Next, Nemotron-H,
    /// Granite-4.0-H, Jamba; §7.15): one state block per `block_size`
    /// tokens (vLLM's `mamba_block_size`), of which only the last computed
    /// token's is kept, plus `speculative_blocks` scratch states for a
    /// drafter's tokens. With prefix caching off (vLLM's cache mode "none")
    /// the block size is the model's length unless set, so one block; with
    /// it on (cache mode "align") it is the cache's block size or a divisor
    /// of every attention group's (§7.16), and the states at block
    /// boundaries are cached (`recurrent_table`).
    Mamba {
        block_size: usize,
        speculative_blocks: usize,
        /// With prefix caching, the backend can also write the state at
        /// the prompt's checkpoint from inside the chunk that passes it,
        /// into a block of its own, at query offsets a multiple of this
        /// (vLLM's `prefill_checkpoint_alignment` beside
        /// `num_prefill_checkpoint_blocks`: Mamba2's kernels); `None` when
        /// it cannot.
        checkpoint_alignment: Option<usize>,
    },
}

/// One KV-cache group.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct GroupSpec {
    pub kind: AttentionKind,
    /// The most blocks an admission's whole-prompt check counts for this
    /// group (vLLM's `max_admission_blocks_per_request`, from the window and
    /// the tokens that can be in flight); `None` for full attention.
    pub admission_cap_blocks: Option<usize>,
    /// Tokens per block of an attention group whose blocks hold another
    /// number of tokens than the cache's `block_size` (vLLM's
    /// mixed-precision hybrids: a layer stored at another precision fits
    /// another number of tokens in the pool's page); `None` for the cache's.
    /// A recurrent group's size is its kind's.
    pub block_size: Option<usize>,
}

impl GroupSpec {
    /// A full-attention group.
    pub const FULL: GroupSpec = GroupSpec {
        kind: AttentionKind::Full,
        admission_cap_blocks: None,
        block_size: None,
    };

    /// Tokens per block: its own, else its kind's (a recurrent state's),
    /// else the cache's `cache_block_size`.
    pub fn tokens_per_block(self, cache_block_size: usize) -> usize {
        self.block_size
            .unwrap_or_else(|| self.kind.tokens_per_block(cache_block_size))
    }
}

impl AttentionKind {
    /// Leading tokens no later position reads once `processed` tokens are
    /// computed: their blocks can go back to the pool.
    pub fn num_skipped_tokens(self, processed: usize) -> usize {
        match self {
            AttentionKind::Full => 0,
            AttentionKind::SlidingWindow { window } => (processed + 1).saturating_sub(window),
            AttentionKind::ChunkedLocal { chunk } => processed / chunk * chunk,
            AttentionKind::CrossAttention => 0,
            // Only the last computed token's state is read again.
            AttentionKind::Mamba { .. } => processed.saturating_sub(1),
        }
    }

    /// Tokens per block of this group: its own for a recurrent state, else
    /// the cache's `block_size`.
    pub fn tokens_per_block(self, cache_block_size: usize) -> usize {
        match self {
            AttentionKind::Mamba { block_size, .. } => block_size,
            _ => cache_block_size,
        }
    }

    /// Blocks held past those covering the tokens: a recurrent group's
    /// scratch states for drafts.
    pub fn extra_blocks(self) -> usize {
        match self {
            AttentionKind::Mamba {
                speculative_blocks, ..
            } => speculative_blocks,
            _ => 0,
        }
    }

    /// The query offsets at which a recurrent group can write a prefill
    /// checkpoint from inside a chunk, if it can.
    pub fn checkpoint_alignment(self) -> Option<usize> {
        match self {
            AttentionKind::Mamba {
                checkpoint_alignment,
                ..
            } => checkpoint_alignment,
            _ => None,
        }
    }

    /// Whether it is a recurrent state (Mamba, linear attention).
    pub fn is_recurrent(self) -> bool {
        matches!(self, AttentionKind::Mamba { .. })
    }

    /// Whether its blocks hold no per-token slots (cross-attention's follow
    /// the encoder, a recurrent group's hold states).
    pub fn is_slotless(self) -> bool {
        matches!(
            self,
            AttentionKind::CrossAttention | AttentionKind::Mamba { .. }
        )
    }

    /// Whether it is full attention.
    pub fn is_full(self) -> bool {
        self == AttentionKind::Full
    }

    /// Whether it is cross-attention (its blocks follow the encoder's tokens,
    /// not the decoder's).
    pub fn is_cross(self) -> bool {
        self == AttentionKind::CrossAttention
    }
}

/// Contiguous cached blocks a sliding-window hit must end with: the blocks
/// the window reads back from the hit's end.
pub fn contiguous_blocks_for_hit(window: usize, block_size: usize) -> usize {
    cdiv(window.saturating_sub(1), block_size)
}

/// A block hash as group `group` caches it: groups share a request's hashes
/// but not their blocks, so each group keys its cached blocks apart (vLLM's
/// `BlockHashWithGroupId`). Group 0's keys are the hashes themselves; the
/// others are a bijection of them, as unpredictable as the hashes.
pub fn group_key(hash: BlockHash, group: usize) -> BlockHash {
    const MIX: u128 = 0x9E37_79B9_7F4A_7C15_F39C_C060_5CED_C835;
    BlockHash(hash.0 ^ (group as u128).wrapping_mul(MIX))
}

/// Whether a chunk computing tokens `start..end` can write the state after
/// `checkpoint` tokens from inside itself (vLLM's
/// `is_mamba_prefill_checkpoint_valid`, hashes of the block size): the
/// checkpoint lies strictly inside the chunk, a block or more past its
/// start, at a multiple of `alignment` from it, in a block before the one
/// the chunk ends in and after the one it starts from.
pub fn checkpoint_in_chunk(
    start: usize,
    end: usize,
    checkpoint: usize,
    block_size: usize,
    alignment: usize,
) -> bool {
    // The block the chunk's initial state is in (none before token 0).
    let initial = (start as isize - 1).div_euclid(block_size as isize);
    let checkpoint_block = cdiv(end, block_size) as isize - 2;
    start % block_size == 0
        && checkpoint_block > initial
        && start + block_size <= checkpoint
        && start < checkpoint
        && checkpoint < end
        && (checkpoint - start) % alignment == 0
}

/// Which blocks a recurrent group caches in cache mode
/// "align" (vLLM's Mamba `reachable_block_mask`): every block with dense
/// retention (`sparse` false); else the state block that ends where a later
/// request can resume — the prompt's last token (`num_prompt_tokens − 1`)
/// and a shared prefix (`shared_prefix_boundary`, 0 for none), each rounded
/// down to `alignment` (the scheduler block, where hits land) — since a hit
/// needs that one state alone; with a retention interval (`segment_tokens`;
/// 0 for none) also the last block of every segment, and every block when
/// a segment is one block or less. `eagle` moves the resume points as it
/// moves a window's (vLLM's `replay_boundaries`): a unit before a resend's
/// and a longer sibling's, and, for a group that drops a block itself, a
/// block below the shared prefix too; the state is the one block there
/// (no drafter has recurrent layers, so no block past it).
#[allow(clippy::too_many_arguments)]
pub fn recurrent_mask(
    block_size: usize,
    alignment: usize,
    sparse: bool,
    num_prompt_tokens: usize,
    shared_prefix_boundary: usize,
    segment_tokens: usize,
    eagle: EagleReach,
) -> impl Fn(usize) -> bool {
    let per_segment = segment_tokens / block_size;
    let dense = !sparse || (segment_tokens > 0 && per_segment <= 1);
    // The block ending at `boundary` rounded down; none below one block.
    let ending_at =
        |boundary: usize| (boundary / alignment * alignment / block_size).checked_sub(1);
    let unit = alignment;
    let resume = if eagle.any_group {
        let resend = num_prompt_tokens.saturating_sub(1) / unit * unit;
        let extension = num_prompt_tokens / unit * unit;
        [
            ending_at(resend.saturating_sub(unit)),
            ending_at(extension.saturating_sub(unit)),
        ]
    } else {
        [ending_at(num_prompt_tokens.saturating_sub(1)), None]
    };
    let shared = (shared_prefix_boundary > 0)
        .then(|| ending_at(shared_prefix_boundary))
        .flatten();
    let shared_below = (shared_prefix_boundary > 0 && eagle.this_group)
        .then(|| ending_at(shared_prefix_boundary.saturating_sub(block_size)))
        .flatten();
    move |i| {
        dense
            || (per_segment > 1 && (i + 1) % per_segment == 0)
            || resume.contains(&Some(i))
            || shared == Some(i)
            || shared_below == Some(i)
    }
}

/// How an EAGLE-style drafter's dropped block moves what a window caches:
/// `any_group` — some group's hits drop a block (the resume points are then
/// a block before each of vLLM's two: a resend's and a longer sibling's);
/// `this_group` — this window's own hits do (it keeps one block more, up to
/// the block past each resume point, which it matches and drops).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EagleReach {
    pub any_group: bool,
    pub this_group: bool,
}

/// Which of blocks `start..end` a sliding-window group caches under sparse
/// retention (vLLM's `prefix_cache_retention_interval` 0, its default, or
/// above): the `need` blocks that end at a position a later request can
/// resume at — the prompt's last token (`num_prompt_tokens − 1`) and a
/// shared prefix another request was found to have
/// (`shared_prefix_boundary`, 0 for none) — since a hit there is all a
/// window needs; with a retention interval (`segment_tokens`, a multiple of
/// the block size; 0 for none) also the last `need` blocks of every
/// segment of that many tokens, and every block when a segment is no
/// longer than `need` blocks. `eagle` moves them (vLLM's
/// `replay_boundaries` and `reachable_block_mask`). Resume points are
/// rounded down to `alignment` (the scheduler block: where hits land; the
/// block size when the groups' blocks are alike).
#[allow(clippy::too_many_arguments)]
pub fn sparse_mask(
    start: usize,
    end: usize,
    block_size: usize,
    alignment: usize,
    window: usize,
    num_prompt_tokens: usize,
    shared_prefix_boundary: usize,
    segment_tokens: usize,
    eagle: EagleReach,
) -> impl Fn(usize) -> bool {
    let shift = usize::from(eagle.this_group);
    let need = contiguous_blocks_for_hit(window, block_size) + shift;
    let tail = |boundary: usize| {
        let end_block = boundary / alignment * alignment / block_size + shift;
        end_block.saturating_sub(need)..end_block
    };
    let (bs, unit) = (block_size, alignment);
    let resume = if eagle.any_group {
        // A resend hits up to its last whole unit but one, a longer
        // sibling up to the prompt's last whole unit but one.
        let resend = num_prompt_tokens.saturating_sub(1) / unit * unit;
        let extension = num_prompt_tokens / unit * unit;
        [
            Some(tail(resend.saturating_sub(unit))),
            Some(tail(extension.saturating_sub(unit))),
        ]
    } else {
        [Some(tail(num_prompt_tokens.saturating_sub(1))), None]
    };
    let shared = (shared_prefix_boundary > 0).then(|| tail(shared_prefix_boundary));
    // A window that drops a block is also kept for a sibling that parts
    // right after the shared prefix: its hit lands a block lower.
    let shared_below = (shared_prefix_boundary > 0 && eagle.this_group)
        .then(|| tail(shared_prefix_boundary.saturating_sub(bs)));
    let per_segment = segment_tokens / block_size;
    let dense = per_segment > 0 && need >= per_segment;
    debug_assert!(start <= end);
    move |i| {
        let in_tail =
            |r: &Option<std::ops::Range<usize>>| r.as_ref().is_some_and(|r| r.contains(&i));
        dense
            || (per_segment > 0 && i >= shift && (i - shift) % per_segment >= per_segment - need)
            || resume.iter().any(in_tail)
            || in_tail(&shared)
            || in_tail(&shared_below)
    }
}

/// Which blocks a sliding-window group caches with dense retention (vLLM's
/// `prefix_cache_retention_interval` None) when the scheduler block
/// (`alignment`) spans more of its blocks than a hit needs: the `need`
/// blocks before each multiple of it, where hits land (for a group that
/// drops an EAGLE block, one more, shifted a block on: its hit looks one
/// block past the multiple); `None` when that is every block (always, when
/// the groups' blocks are alike).
pub fn dense_window_mask(
    block_size: usize,
    alignment: usize,
    window: usize,
    drops_eagle: bool,
) -> Option<impl Fn(usize) -> bool> {
    let shift = usize::from(drops_eagle);
    let need = contiguous_blocks_for_hit(window, block_size) + shift;
    let per_segment = alignment / block_size;
    (need < per_segment)
        .then_some(move |i: usize| i >= shift && (i - shift) % per_segment >= per_segment - need)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_skip_what_no_later_token_reads() {
        let swa = AttentionKind::SlidingWindow { window: 128 };
        assert_eq!(swa.num_skipped_tokens(127), 0);
        assert_eq!(swa.num_skipped_tokens(300), 173);
        let chunked = AttentionKind::ChunkedLocal { chunk: 64 };
        assert_eq!(chunked.num_skipped_tokens(63), 0);
        assert_eq!(chunked.num_skipped_tokens(130), 128);
        assert_eq!(AttentionKind::Full.num_skipped_tokens(10_000), 0);
        let mamba = AttentionKind::Mamba {
            block_size: 64,
            speculative_blocks: 2,
            checkpoint_alignment: None,
        };
        assert_eq!(mamba.num_skipped_tokens(0), 0);
        assert_eq!(mamba.num_skipped_tokens(130), 129);
        assert_eq!((mamba.tokens_per_block(16), mamba.extra_blocks()), (64, 2));
        assert_eq!(
            (
                AttentionKind::Full.tokens_per_block(16),
                AttentionKind::Full.extra_blocks()
            ),
            (16, 0)
        );
    }

    #[test]
    fn sparse_retention_keeps_the_tails_at_resume_points() {
        // vLLM's example: a 300-token prompt, blocks of 16, window 128: the
        // eight blocks before position 299's block (indices 10..17).
        let keep = sparse_mask(0, 19, 16, 16, 128, 300, 0, 0, EagleReach::default());
        let kept: Vec<usize> = (0..19).filter(|&i| keep(i)).collect();
        assert_eq!(kept, (10..18).collect::<Vec<_>>());
        let keep = sparse_mask(0, 19, 16, 16, 128, 300, 192, 0, EagleReach::default());
        assert!(keep(4) && keep(11) && !keep(3) && !keep(18));
    }

    #[test]
    fn a_retention_interval_keeps_a_tail_per_segment_too() {
        // Window 33 needs two blocks of 16; segments of 64 tokens (four
        // blocks) keep their last two, besides the prompt's tail (15..17).
        let keep = sparse_mask(0, 19, 16, 16, 33, 280, 0, 64, EagleReach::default());
        let kept: Vec<usize> = (0..19).filter(|&i| keep(i)).collect();
        assert_eq!(kept, vec![2, 3, 6, 7, 10, 11, 14, 15, 16, 18]);
        // Segments of two blocks: every block is a segment's tail.
        let keep = sparse_mask(0, 19, 16, 16, 33, 280, 0, 32, EagleReach::default());
        assert!((0..19).all(keep));
    }

    #[test]
    fn a_recurrent_group_keeps_the_states_at_resume_points() {
        let kept = |keep: &dyn Fn(usize) -> bool| (0..8).filter(|&i| keep(i)).collect::<Vec<_>>();
        // Blocks of 16, hits on `unit`; (prompt, shared prefix, segment).
        let sparse = |unit, prompt, shared, segment| {
            kept(&recurrent_mask(
                16,
                unit,
                true,
                prompt,
                shared,
                segment,
                EagleReach::default(),
            ))
        };
        // A 100-token prompt: the state after 96 tokens (block 5), the one
        // a resend of the prompt resumes from.
        assert_eq!(sparse(16, 100, 0, 0), vec![5]);
        // A prompt of 96 resumes at 95: the state after 80 (block 4).
        assert_eq!(sparse(16, 96, 0, 0), vec![4]);
        // A shared prefix of 40 tokens: the state after 32 too.
        assert_eq!(sparse(16, 100, 40, 0), vec![1, 5]);
        // Segments of 64 tokens keep their last state each.
        assert_eq!(sparse(16, 100, 0, 64), vec![3, 5, 7]);
        assert_eq!(sparse(16, 100, 0, 16), (0..8).collect::<Vec<_>>());
        let dense = recurrent_mask(16, 16, false, 100, 0, 0, EagleReach::default());
        assert_eq!(kept(&dense), (0..8).collect::<Vec<_>>());
        // Nothing before the first whole block.
        assert!(sparse(16, 10, 0, 0).is_empty());
        // Hits landing on 64-token scheduler blocks (attention blocks of 64
        // beside states of 16): the prompt's resume point 99 rounds down to
        // 64 (block 3), a shared prefix of 40 to nothing.
        assert_eq!(sparse(64, 100, 40, 0), vec![3]);
        // EAGLE's drop (vLLM's replay boundaries): a resend and a longer
        // sibling resume a block before 96, at 80 (block 4); a group that
        // drops a block itself keeps the state a block below the shared
        // prefix's too (after 16 tokens, block 0).
        let eagle = |this_group| EagleReach {
            any_group: true,
            this_group,
        };
        let dropping = |shared, reach| kept(&recurrent_mask(16, 16, true, 100, shared, 0, reach));
        assert_eq!(dropping(0, eagle(false)), vec![4]);
        assert_eq!(dropping(40, eagle(false)), vec![1, 4]);
        assert_eq!(dropping(40, eagle(true)), vec![0, 1, 4]);
    }

    #[test]
    fn a_checkpoint_lies_inside_the_chunk() {
        // Blocks of 16: a chunk 0..100 can write the state after 96 (the
        // prompt's checkpoint), as can 32..100 and 80..100 (a block past
        // its start); 96..120 cannot write the state after 104 (less than a
        // block past its start), nor 0..96 the one after 96 (its end).
        assert!(checkpoint_in_chunk(0, 100, 96, 16, 1));
        assert!(checkpoint_in_chunk(32, 100, 96, 16, 1));
        assert!(checkpoint_in_chunk(80, 100, 96, 16, 1));
        assert!(!checkpoint_in_chunk(96, 120, 104, 16, 1));
        assert!(!checkpoint_in_chunk(0, 96, 96, 16, 1));
        assert!(!checkpoint_in_chunk(8, 100, 96, 16, 1)); // starts inside a block
        assert!(!checkpoint_in_chunk(32, 100, 96, 16, 5)); // 64 is no multiple of 5
    }

    #[test]
    fn group_keys_differ_per_group() {
        let h = BlockHash(12345);
        assert_eq!(group_key(h, 0), h);
        assert_ne!(group_key(h, 1), h);
        assert_ne!(group_key(h, 1), group_key(h, 2));
    }
}
