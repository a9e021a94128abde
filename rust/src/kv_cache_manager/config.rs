//! The KV-cache manager's settings and their checks (docs/scheduling.md §2,
//! §2.1, §7.13): every field in range, the first bad one named.

use crate::attention_group::{AttentionKind, GroupSpec};
use crate::error::Error;
use crate::limits::{
    check_range, MAX_BLOCK_SIZE, MAX_KV_CACHE_GROUPS, MAX_MODEL_LEN, MAX_NUM_BLOCKS,
};

/// The KV-cache settings the manager needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvCacheConfig {
    /// Blocks in the pool, the reserved null block included.
    pub num_blocks: usize,
    /// Tokens per block of every group that sets none of its own.
    pub block_size: usize,
    /// Longest sequence; allocation never covers positions past it.
    pub max_model_len: usize,
    /// Prefix-cache lookups and hash caching.
    pub enable_prefix_caching: bool,
    /// KV slots reserved past a request's scheduled tokens, for a drafter
    /// with its own forward pass (vLLM's `num_lookahead_tokens`: EAGLE,
    /// MTP and draft models write their drafts' KV there); 0 otherwise.
    pub num_lookahead_tokens: usize,
    /// Tokens after each block that its hash covers (vLLM's
    /// `num_hash_lookahead_tokens`, §7.4); 0 otherwise.
    pub num_hash_lookahead_tokens: usize,
    /// A prefix hit gives up its last block, which an EAGLE-style drafter
    /// must recompute: its draft KV there read the token after the block,
    /// which the hit does not prove (vLLM's `use_eagle_block_drop` without
    /// lookahead hashes, §7.4).
    pub drop_eagle_block: bool,
    /// The groups whose hits give up their last block under
    /// `drop_eagle_block`: vLLM's groups that hold the drafter's layers
    /// (`is_eagle_group`); `None` for every group (vLLM's fallback when it
    /// flags none). A group shares the flag of the groups of its kind (vLLM
    /// looks them up together).
    pub eagle_groups: Option<Vec<usize>>,
    /// The KV-cache groups, in vLLM's order (its layers' first appearance),
    /// of `block_size` unless they set their own (§7.13, §7.16); one
    /// full-attention group for most models, none for a model without a KV
    /// cache (§7.14).
    pub groups: Vec<GroupSpec>,
    /// Sliding-window groups cache only the blocks a later request can
    /// resume from (vLLM's `prefix_cache_retention_interval = 0`, its
    /// default); false caches them all (`None`).
    pub sparse_retention: bool,
    /// Under sparse retention, a sliding-window group also caches the
    /// blocks that end each segment of this many tokens (vLLM's
    /// `prefix_cache_retention_interval` above 0: resumable checkpoints
    /// along long prompts); a multiple of the scheduler block size, 0 for
    /// none.
    pub retention_interval: usize,
    /// The attention groups' KV is stored at more than one precision
    /// (vLLM's `has_mixed_precision_kv_cache`: some layers skip KV-cache
    /// quantization): a freed block may next be read at another precision,
    /// so the runner zeroes new blocks, as beside a recurrent group.
    pub mixed_precision: bool,
}

/// Greatest common divisor (Euclid's).
fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

impl KvCacheConfig {
    /// A cache without speculative-decoding lookahead.
    pub fn new(
        num_blocks: usize,
        block_size: usize,
        max_model_len: usize,
        enable_prefix_caching: bool,
    ) -> Self {
        KvCacheConfig {
            num_blocks,
            block_size,
            max_model_len,
            enable_prefix_caching,
            num_lookahead_tokens: 0,
            num_hash_lookahead_tokens: 0,
            drop_eagle_block: false,
            eagle_groups: None,
            groups: vec![GroupSpec::FULL],
            sparse_retention: true,
            retention_interval: 0,
            mixed_precision: false,
        }
    }

    /// Tokens per block of each group.
    pub fn group_block_sizes(&self) -> Vec<usize> {
        self.groups
            .iter()
            .map(|g| g.tokens_per_block(self.block_size))
            .collect()
    }

    /// The block sizes of the groups whose blocks are keyed by token hashes:
    /// attention over the decoder's tokens, and with prefix caching a
    /// recurrent group's states (vLLM's cache mode "align", where they are
    /// cached by the hash where their block ends); not cross-attention.
    fn hashed_block_sizes(&self) -> impl Iterator<Item = usize> + '_ {
        self.groups
            .iter()
            .filter(|g| {
                !g.kind.is_slotless() || (g.kind.is_recurrent() && self.enable_prefix_caching)
            })
            .map(|g| g.tokens_per_block(self.block_size))
    }

    /// Tokens per block hash (vLLM's `hash_block_size`): the greatest
    /// common divisor of the hashed groups' block sizes, so every group's
    /// block ends on a hash; the cache's block size when they are all alike
    /// or there are none.
    pub fn hash_block_size(&self) -> usize {
        self.hashed_block_sizes()
            .reduce(gcd)
            .unwrap_or(self.block_size)
    }

    /// The unit prefix hits and hash caching are aligned to (vLLM's
    /// `scheduler_block_size`): the least common multiple of the hashed
    /// groups' block sizes, where every group's blocks end together.
    pub fn scheduler_block_size(&self) -> usize {
        self.hashed_block_sizes()
            .reduce(|a, b| a / gcd(a, b) * b)
            .unwrap_or(self.block_size)
    }

    /// Whether the hashed groups' blocks hold different numbers of tokens.
    pub fn has_mixed_block_sizes(&self) -> bool {
        self.hash_block_size() != self.scheduler_block_size()
    }

    /// Whether a group is cross-attention (an encoder-decoder model).
    pub fn has_cross_attention(&self) -> bool {
        self.groups.iter().any(|g| g.kind.is_cross())
    }

    /// Check every field, naming the first bad one.
    pub fn validate(&self) -> Result<(), Error> {
        check_range("block_size", self.block_size, 1, MAX_BLOCK_SIZE)?;
        check_range("max_model_len", self.max_model_len, 1, MAX_MODEL_LEN)?;
        // Without a KV cache, vLLM's pool is the null block alone.
        let least = if self.groups.is_empty() { 1 } else { 2 };
        check_range("num_blocks", self.num_blocks, least, MAX_NUM_BLOCKS)?;
        check_range(
            "num_lookahead_tokens",
            self.num_lookahead_tokens,
            0,
            self.max_model_len,
        )?;
        // A block's hash covers at most the next block (vLLM requires the
        // block size to hold the prefill lookahead it equals).
        check_range("kv_cache_groups", self.groups.len(), 0, MAX_KV_CACHE_GROUPS)?;
        self.validate_group_block_sizes()?;
        check_range(
            "num_hash_lookahead_tokens",
            self.num_hash_lookahead_tokens,
            0,
            self.hash_block_size(),
        )?;
        if self.groups.is_empty() && self.enable_prefix_caching {
            // Nothing to cache; vLLM turns prefix caching off for such a
            // model (encoder-only attention, an encoder-only deployment).
            return Err(Error::invalid(
                "kv_cache_groups is empty (a model without a KV cache): enable_prefix_caching \
                 must be false",
            ));
        }
        for g in &self.groups {
            match g.kind {
                AttentionKind::Full => {}
                AttentionKind::SlidingWindow { window } => {
                    check_range("sliding_window", window, 1, MAX_MODEL_LEN)?;
                }
                AttentionKind::ChunkedLocal { chunk } => {
                    check_range("attention_chunk_size", chunk, 1, MAX_MODEL_LEN)?;
                }
                AttentionKind::CrossAttention => {
                    // vLLM turns prefix caching off for encoder-decoder models.
                    if self.enable_prefix_caching {
                        return Err(Error::invalid(
                            "enable_prefix_caching must be false with a cross-attention \
                             KV-cache group (an encoder-decoder model)",
                        ));
                    }
                }
                AttentionKind::Mamba {
                    block_size,
                    speculative_blocks,
                    checkpoint_alignment,
                } => {
                    check_range("mamba_block_size", block_size, 1, MAX_MODEL_LEN)?;
                    check_range("speculative_blocks", speculative_blocks, 0, MAX_NUM_BLOCKS)?;
                    if let Some(alignment) = checkpoint_alignment {
                        check_range("checkpoint_alignment", alignment, 1, MAX_MODEL_LEN)?;
                    }
                    // Prefix caching over recurrent states is vLLM's cache
                    // mode "align": a state per block boundary. A state
                    // block of more than a hash block brings vLLM's hits
                    // inside a state block (its partial hash hits), which
                    // are not modelled.
                    let hash_block_size = self.hash_block_size();
                    if self.enable_prefix_caching && block_size != hash_block_size {
                        return Err(Error::invalid(format!(
                            "mamba_block_size ({block_size}) must divide every other \
                             KV-cache group's block size ({:?}) with prefix caching on \
                             (vLLM's mamba_cache_mode 'align'): hits inside a state block \
                             are not modelled",
                            self.group_block_sizes()
                        )));
                    }
                }
            }
        }
        if self.retention_interval > 0 {
            // vLLM's rule: checkpoints land on block boundaries, and only a
            // sliding window or a recurrent group keeps them.
            check_range(
                "retention_interval",
                self.retention_interval,
                1,
                MAX_MODEL_LEN,
            )?;
            let windowed = self.groups.iter().any(|g| {
                matches!(
                    g.kind,
                    AttentionKind::SlidingWindow { .. } | AttentionKind::Mamba { .. }
                )
            });
            let unit = self.scheduler_block_size();
            if self.retention_interval % unit != 0 || !self.sparse_retention || !windowed {
                return Err(Error::invalid(format!(
                    "retention_interval ({}) needs sparse_retention, a sliding-window or \
                     Mamba KV-cache group and a multiple of the scheduler block size ({unit})",
                    self.retention_interval
                )));
            }
        }
        let mut alignments = self
            .groups
            .iter()
            .filter(|g| g.kind.is_recurrent())
            .map(|g| g.kind.checkpoint_alignment());
        if let Some(first) = alignments.next() {
            // vLLM's scheduler splits by the first group's and checkpoints
            // only when every group can.
            if alignments.any(|a| a != first) {
                return Err(Error::invalid(
                    "kv_cache_groups: every Mamba group must have the same checkpoint_alignment",
                ));
            }
        }
        if self.groups.first().is_some_and(|g| g.kind.is_cross()) {
            // A step's block ranges are read off the first group's table.
            return Err(Error::invalid(
                "kv_cache_groups[0] must be a decoder group: cross-attention groups \
                 follow the decoder's (as vLLM orders them)",
            ));
        }
        if self.drop_eagle_block && self.num_hash_lookahead_tokens > 0 {
            // Lookahead hashes prove the token after a block: nothing to drop.
            return Err(Error::invalid(
                "drop_eagle_block must be false with num_hash_lookahead_tokens above 0",
            ));
        }
        for &g in self.eagle_groups.iter().flatten() {
            if g >= self.groups.len() {
                return Err(Error::invalid(format!(
                    "eagle_groups: group {g} is not one of the {} KV-cache groups",
                    self.groups.len()
                )));
            }
        }
        Ok(())
    }

    /// A group's own block size: in range, on full attention or a sliding
    /// window only; where they differ, only what the core models beside
    /// them (docs/scheduling.md §7.16).
    fn validate_group_block_sizes(&self) -> Result<(), Error> {
        for (i, g) in self.groups.iter().enumerate() {
            let Some(size) = g.block_size else { continue };
            check_range(
                &format!("kv_cache_groups[{i}].block_size"),
                size,
                1,
                MAX_BLOCK_SIZE,
            )?;
            if g.kind.is_recurrent() {
                return Err(Error::invalid(format!(
                    "kv_cache_groups[{i}].block_size: a Mamba group's block size is its size"
                )));
            }
        }
        if !self.has_mixed_block_sizes() {
            return Ok(());
        }
        // (Recurrent groups count here only with prefix caching, and then
        // their states are cached as any group's blocks are.)
        // A chunked-local hit ends on its own blocks; vLLM asserts that they
        // are the scheduler block's (its hits' unit) when it looks one up.
        let unit = self.scheduler_block_size();
        let chunked_smaller = self.groups.iter().any(|g| {
            matches!(g.kind, AttentionKind::ChunkedLocal { .. })
                && g.tokens_per_block(self.block_size) != unit
        });
        if self.enable_prefix_caching && chunked_smaller {
            return Err(Error::invalid(format!(
                "kv_cache_groups of different block sizes ({:?}): with prefix caching on, a \
                 chunked-local-attention group's blocks must be the largest ({unit} tokens), as \
                 vLLM asserts",
                self.group_block_sizes()
            )));
        }
        Ok(())
    }
}
