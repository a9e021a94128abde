//! A request's chain of block hashes (docs/scheduling.md §7.4): one hash per **full**
//! block of its known tokens (and the hasher's lookahead tokens after it),
//! extended as tokens arrive.

use crate::block_hash::{block_hash, BlockHash, BlockHasher, ChainKey, ExtraKey, MmKey};
use crate::multimodal::MultimodalInput;
use smallvec::SmallVec;

/// Where a multimodal input's placeholders lie, for the hashes of the
/// blocks they fall in.
#[derive(Clone, Debug)]
struct MmSpan {
    offset: usize,
    end: usize,
    identifier: Box<str>,
}

/// The hashes of a token sequence's full blocks, in block order, and the
/// chain key the next full block will be hashed under.
#[derive(Clone, Debug, Default)]
#[repr(C)] // the hashes' header first: every appended token reads its length
pub struct BlockHashChain {
    hashes: Vec<BlockHash>,
    next_key: ChainKey,
    /// The key the first block is hashed under, to hash again from the start.
    root: ChainKey,
    /// The request's multimodal inputs, sorted; `None` for text.
    mm: Option<Box<[MmSpan]>>,
    /// A prompt given as embeddings: each block's digest of them, for the
    /// blocks the prompt overlaps (later blocks are keyed as past it);
    /// `None` for a prompt of tokens.
    embeds: Option<Box<[Box<[u8]>]>>,
}

impl BlockHashChain {
    /// An empty chain rooted in the hasher's secret and the request's
    /// extra keys (its `cache_salt`, its LoRA adapter).
    pub fn new(hasher: &BlockHasher, extras: &[ExtraKey<'_>]) -> Self {
        let next_key = hasher.root(extras);
        BlockHashChain {
            hashes: Vec::new(),
            next_key,
            root: next_key,
            mm: None,
            embeds: None,
        }
    }

    /// Key every block by the digest of its prompt embeddings (§7.4): the
    /// `k`-th digest for block `k`, an empty one past them; hashing `tokens`
    /// again from the root.
    pub fn key_by_embeds(
        &mut self,
        digests: &[Vec<u8>],
        hasher: &BlockHasher,
        tokens: &[u32],
        block_size: usize,
    ) {
        self.embeds = Some(
            digests
                .iter()
                .map(|d| d.clone().into_boxed_slice())
                .collect(),
        );
        self.clear();
        self.extend(hasher, tokens, block_size);
    }

    /// Key every block by the multimodal inputs it holds (§7.4), hashing
    /// `tokens` again from the root.
    pub fn key_by_mm(
        &mut self,
        inputs: &[MultimodalInput],
        hasher: &BlockHasher,
        tokens: &[u32],
        block_size: usize,
    ) {
        self.mm = (!inputs.is_empty()).then(|| {
            inputs
                .iter()
                .map(|m| MmSpan {
                    offset: m.offset,
                    end: m.end(),
                    identifier: m.identifier.as_str().into(),
                })
                .collect()
        });
        self.clear();
        self.extend(hasher, tokens, block_size);
    }

    /// Key the blocks not hashed yet by `inputs` too (a streaming session's
    /// next chunk brings them, placed after everything the chain holds).
    pub fn add_mm(&mut self, inputs: &[MultimodalInput]) {
        if inputs.is_empty() {
            return;
        }
        let mut spans = self.mm.take().map(Vec::from).unwrap_or_default();
        spans.extend(inputs.iter().map(|m| MmSpan {
            offset: m.offset,
            end: m.end(),
            identifier: m.identifier.as_str().into(),
        }));
        self.mm = Some(spans.into_boxed_slice());
    }

    /// The hashes so far.
    pub fn hashes(&self) -> &[BlockHash] {
        &self.hashes
    }

    /// Keep the hashes of the first `num_blocks` blocks only (a streaming
    /// session drops its last sampled token). The chain key is rebuilt from
    /// the root over `tokens`, the sequence those hashes were taken over:
    /// with a lookahead, a kept block's hash still covers the tokens after
    /// it as they were (vLLM keeps those hashes too, until it hashes again).
    pub fn truncate(
        &mut self,
        num_blocks: usize,
        hasher: &BlockHasher,
        tokens: &[u32],
        block_size: usize,
    ) {
        if num_blocks >= self.hashes.len() {
            return;
        }
        self.clear();
        let end = num_blocks * block_size + hasher.lookahead();
        self.extend(hasher, &tokens[..end], block_size);
    }

    /// Forget every hash, to hash `tokens` afresh from the root.
    pub fn clear(&mut self) {
        self.hashes.clear();
        self.next_key = self.root;
    }

    /// Hash every full block of `tokens` not hashed yet whose lookahead
    /// tokens are known too. `tokens` is the whole known sequence; a partly
    /// filled last block gets no hash.
    #[inline]
    pub fn extend(&mut self, hasher: &BlockHasher, tokens: &[u32], block_size: usize) {
        if tokens.len() < (self.hashes.len() + 1) * block_size + hasher.lookahead() {
            return; // no new full block: the common case, without a division
        }
        self.hash_new_blocks(hasher, tokens, block_size);
    }

    /// [`Self::extend`] past its check, out of line: one decode in a
    /// block's worth gets here, so the check alone is inlined into each
    /// token's append.
    #[inline(never)]
    fn hash_new_blocks(&mut self, hasher: &BlockHasher, tokens: &[u32], block_size: usize) {
        let lookahead = hasher.lookahead();
        let full = (tokens.len() - lookahead) / block_size;
        for k in self.hashes.len()..full {
            let message = &tokens[k * block_size..(k + 1) * block_size + lookahead];
            self.next_key = if self.mm.is_none() && self.embeds.is_none() {
                hasher.next(&self.next_key, message)
            } else {
                // The lookahead tokens' items key the block too (vLLM's
                // lookahead extra keys).
                let (start, end) = (k * block_size, (k + 1) * block_size + lookahead);
                let keys: SmallVec<[MmKey<'_>; 2]> = self
                    .mm
                    .iter()
                    .flat_map(|spans| spans.iter())
                    .filter(|m| m.offset < end && start < m.end)
                    .map(|m| MmKey {
                        relative_offset: m.offset as i64 - start as i64,
                        identifier: &m.identifier,
                    })
                    .collect();
                let embeds = self
                    .embeds
                    .as_ref()
                    .map(|d| d.get(k).map_or(&[][..], |d| &d[..]));
                hasher.next_with_keys(&self.next_key, message, &keys, embeds)
            };
            self.hashes.push(block_hash(&self.next_key));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn incremental_equals_at_once() {
        let h = BlockHasher::with_key([1; 32]);
        let tokens: Vec<u32> = (0..70).collect();
        let mut all = BlockHashChain::new(&h, &[]);
        all.extend(&h, &tokens, 16);
        assert_eq!(all.hashes().len(), 4);
        let mut step = BlockHashChain::new(&h, &[]);
        for n in 0..=tokens.len() {
            step.extend(&h, &tokens[..n], 16);
            assert_eq!(step.hashes().len(), n / 16);
        }
        assert_eq!(all.hashes(), step.hashes());
    }

    #[test]
    fn truncate_then_extend_equals_hashing_the_new_tokens() {
        let h = BlockHasher::with_key([1; 32]);
        let old: Vec<u32> = (0..64).collect();
        let mut chain = BlockHashChain::new(&h, &[ExtraKey::CacheSalt("s")]);
        chain.extend(&h, &old, 16);
        let mut new = old[..47].to_vec();
        new.extend(100..120);
        chain.truncate(47 / 16, &h, &old, 16);
        chain.extend(&h, &new, 16);
        let mut fresh = BlockHashChain::new(&h, &[ExtraKey::CacheSalt("s")]);
        fresh.extend(&h, &new, 16);
        assert_eq!(chain.hashes(), fresh.hashes());
    }

    #[test]
    fn a_lookahead_hash_waits_for_and_covers_the_next_tokens() {
        let h = BlockHasher::with_key([1; 32]).with_lookahead(2);
        let tokens: Vec<u32> = (0..40).collect();
        let mut step = BlockHashChain::new(&h, &[]);
        for n in 0..=tokens.len() {
            step.extend(&h, &tokens[..n], 16);
            assert_eq!(step.hashes().len(), n.saturating_sub(2) / 16, "{n} tokens");
        }
        // The same 32 tokens, a different 33rd: block 0 equal, block 1 not.
        let mut other = tokens.clone();
        other[32] = 999;
        let mut chain = BlockHashChain::new(&h, &[]);
        chain.extend(&h, &other, 16);
        assert_eq!(chain.hashes()[0], step.hashes()[0]);
        assert_ne!(chain.hashes()[1], step.hashes()[1]);
        // Without a lookahead, the same tokens hash otherwise.
        let plain = BlockHasher::with_key([1; 32]);
        let mut p = BlockHashChain::new(&plain, &[]);
        p.extend(&plain, &tokens, 16);
        assert_ne!(p.hashes()[0], step.hashes()[0]);
    }

    #[test]
    fn truncate_keeps_lookahead_hashes_as_they_were() {
        let h = BlockHasher::with_key([1; 32]).with_lookahead(1);
        let old: Vec<u32> = (0..50).collect();
        let mut chain = BlockHashChain::new(&h, &[]);
        chain.extend(&h, &old, 16);
        let kept = chain.hashes()[..2].to_vec();
        chain.truncate(2, &h, &old, 16);
        assert_eq!(chain.hashes(), &kept[..]);
        // After `clear`, the chain hashes the new sequence afresh.
        let mut new = old[..32].to_vec();
        new.extend(100..120);
        chain.clear();
        chain.extend(&h, &new, 16);
        let mut fresh = BlockHashChain::new(&h, &[]);
        fresh.extend(&h, &new, 16);
        assert_eq!(chain.hashes(), fresh.hashes());
        assert_ne!(chain.hashes()[1], kept[1]);
    }

    #[test]
    fn salt_changes_every_block() {
        let h = BlockHasher::with_key([1; 32]);
        let tokens: Vec<u32> = (0..32).collect();
        let mut plain = BlockHashChain::new(&h, &[]);
        let mut salted = BlockHashChain::new(&h, &[ExtraKey::CacheSalt("A")]);
        plain.extend(&h, &tokens, 16);
        salted.extend(&h, &tokens, 16);
        assert_ne!(plain.hashes()[0], salted.hashes()[0]);
        assert_ne!(plain.hashes()[1], salted.hashes()[1]);
    }

    #[test]
    fn an_adapter_changes_every_block_by_its_name_and_its_path() {
        let h = BlockHasher::with_key([1; 32]);
        let tokens: Vec<u32> = (0..32).collect();
        let chain = |extras: &[ExtraKey<'_>]| {
            let mut c = BlockHashChain::new(&h, extras);
            c.extend(&h, &tokens, 16);
            c.hashes().to_vec()
        };
        let lora = |name, path| ExtraKey::Lora { name, path };
        let a = chain(&[lora("a", "/p")]);
        assert_eq!(a, chain(&[lora("a", "/p")]));
        for other in [
            chain(&[]),
            chain(&[lora("b", "/p")]),
            chain(&[lora("a", "/q")]),
        ] {
            assert_ne!(a[0], other[0]);
            assert_ne!(a[1], other[1]);
        }
        // Parts are length-prefixed: ("ab", "") is not ("a", "b").
        assert_ne!(chain(&[lora("ab", "")]), chain(&[lora("a", "b")]));
        // A salt and an adapter are keys apart, in either combination.
        let both = chain(&[lora("a", "/p"), ExtraKey::CacheSalt("s")]);
        assert_ne!(both, a);
        assert_ne!(both, chain(&[ExtraKey::CacheSalt("s")]));
    }
}
