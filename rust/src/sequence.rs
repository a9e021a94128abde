//! A request's tokens as the KV cache sees them: the known tokens, how many
//! of them have (or this step will have) KV in the cache, and the hash
//! chain of its full blocks.

use crate::block_hash::{BlockHash, BlockHasher, ExtraKey};
use crate::hash_chain::BlockHashChain;
use crate::multimodal::MultimodalInput;

/// The token state of one request.
#[derive(Clone, Debug)]
#[repr(C)] // what a decode reads first, in order (Request's layout)
pub struct Sequence {
    tokens: Vec<u32>,
    /// Tokens whose KV is (or, this step, will be) in the cache.
    pub num_computed_tokens: usize,
    num_prompt_tokens: usize,
    /// Every appended token checks its hash count (the chain's leading
    /// `Vec`); only a block filling up reads past it.
    hashes: BlockHashChain,
    /// Where a prefix this request shares with others ends, found at its
    /// last prefix lookup when a sliding-window group had not cached it (0
    /// for none): that group then keeps the blocks before it
    /// (docs/scheduling.md §7.13; vLLM's `shared_prefix_boundary`).
    pub shared_prefix_boundary: usize,
}

impl Sequence {
    /// Where the part a decode reads ends: the tokens' header, the counts
    /// and the hash chain's `Vec` header (held by Request's layout test).
    #[cfg(test)]
    pub(crate) const HOT_END: usize =
        std::mem::offset_of!(Sequence, hashes) + std::mem::size_of::<Vec<BlockHash>>();

    /// A sequence of `prompt` tokens, with the hashes of its full blocks.
    pub fn new(
        prompt: Vec<u32>,
        extras: &[ExtraKey<'_>],
        hasher: &BlockHasher,
        block_size: usize,
    ) -> Self {
        let mut hashes = BlockHashChain::new(hasher, extras);
        hashes.extend(hasher, &prompt, block_size);
        Sequence {
            num_prompt_tokens: prompt.len(),
            tokens: prompt,
            num_computed_tokens: 0,
            hashes,
            shared_prefix_boundary: 0,
        }
    }

    /// Key its block hashes by its multimodal inputs too, hashing again.
    pub fn key_by_mm(
        &mut self,
        inputs: &[MultimodalInput],
        hasher: &BlockHasher,
        block_size: usize,
    ) {
        self.hashes
            .key_by_mm(inputs, hasher, &self.tokens, block_size);
    }

    /// Key its block hashes by its prompt embeddings' digests, hashing again.
    pub fn key_by_embeds(&mut self, digests: &[Vec<u8>], hasher: &BlockHasher, block_size: usize) {
        self.hashes
            .key_by_embeds(digests, hasher, &self.tokens, block_size);
    }

    /// Append output tokens, hashing every block they complete.
    pub fn append(&mut self, tokens: &[u32], hasher: &BlockHasher, block_size: usize) {
        self.tokens.extend_from_slice(tokens);
        self.hashes.extend(hasher, &self.tokens, block_size);
    }

    /// A streaming session's next turn: keep the first `keep` tokens (all
    /// but the last sampled one), append `chunk`, and make every token
    /// prompt (docs/scheduling.md §4.12).
    pub fn continue_session(
        &mut self,
        keep: usize,
        chunk: &[u32],
        chunk_inputs: &[MultimodalInput],
        hasher: &BlockHasher,
        block_size: usize,
    ) {
        debug_assert!(keep >= self.num_computed_tokens && keep <= self.tokens.len());
        self.hashes
            .truncate(keep / block_size, hasher, &self.tokens, block_size);
        self.tokens.truncate(keep);
        // The chunk's images (placed already) key the blocks it fills.
        self.hashes.add_mm(chunk_inputs);
        self.append(chunk, hasher, block_size);
        self.num_prompt_tokens = self.tokens.len();
    }

    /// Hash every full block again from the start (a streaming session
    /// admitted afresh under a hash lookahead: its kept hashes may cover a
    /// token it dropped).
    pub fn rehash(&mut self, hasher: &BlockHasher, block_size: usize) {
        self.hashes.clear();
        self.hashes.extend(hasher, &self.tokens, block_size);
    }

    /// The tokens, moved out (a finished request's, as it is freed); the
    /// sequence is left with none.
    pub fn take_tokens(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.tokens)
    }

    /// Prompt plus output tokens.
    pub fn num_tokens(&self) -> usize {
        self.tokens.len()
    }

    /// Prompt tokens.
    pub fn num_prompt_tokens(&self) -> usize {
        self.num_prompt_tokens
    }

    /// All known tokens.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// One hash per full block.
    pub fn block_hashes(&self) -> &[BlockHash] {
        self.hashes.hashes()
    }
}
