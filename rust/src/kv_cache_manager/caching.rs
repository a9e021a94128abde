//! Hash caching (docs/scheduling.md §7.7, §7.13): a table's full blocks
//! enter the prefix-cache map as its tokens fill them, group by group, and
//! how many tokens a request holds in cached blocks.

use super::KvCacheManager;
use crate::attention_group::{group_key, sparse_mask, AttentionKind};
use crate::block::{BlockId, NULL_BLOCK};
use crate::block_table::BlockTable;
use crate::sequence::Sequence;

impl KvCacheManager {
    /// Hash-cache every group's full blocks up to token `upto`, when prefix
    /// caching is on; the async update caches the blocks its tokens filled,
    /// a KV connector's load those it wrote, once reported (§4.19).
    pub fn cache_full_blocks(&mut self, tables: &mut [BlockTable], seq: &Sequence, upto: usize) {
        if self.enable_caching {
            for (g, table) in tables.iter_mut().enumerate() {
                self.cache_blocks(g, table, seq, upto);
            }
        }
    }

    /// `blocks` as a `BlockStored` event names them: each block's id, or
    /// the null block where the table holds none or a window group's
    /// sparse retention kept the block out of the cache (it has no hash).
    pub fn stored_block_ids(&self, blocks: &[BlockId]) -> Vec<BlockId> {
        blocks
            .iter()
            .map(|&b| {
                let hashed = self.pool.block(b).is_some_and(|b| b.hash.is_some());
                if b != NULL_BLOCK && hashed {
                    b
                } else {
                    NULL_BLOCK
                }
            })
            .collect()
    }

    /// Tokens the request holds in hash-cached blocks, as vLLM estimates
    /// them: per group, where its last held cached block ends; the least
    /// over the groups.
    #[inline]
    pub fn num_cached_tokens(&self, tables: &[BlockTable]) -> usize {
        if !self.enable_caching {
            return 0;
        }
        if self.single_full {
            return tables[0].num_cached * self.block_size;
        }
        // Nulls are a table's prefix (a window gives back its oldest blocks
        // first), so the search stops at the first: a window group's scan
        // covers its window, not the whole sequence.
        let cached_end = |table: &BlockTable| {
            let held = &table.blocks[..table.num_cached.min(table.len())];
            let live = held.iter().rev().take_while(|&&b| b != NULL_BLOCK);
            live.enumerate()
                .find(|&(_, &b)| self.pool.block(b).is_some_and(|b| b.hash.is_some()))
                .map_or(0, |(back, _)| (held.len() - back) * self.block_size)
        };
        tables.iter().map(cached_end).min().unwrap_or(0)
    }

    /// Hash-cache group `g`'s full blocks up to token `upto`
    /// (docs/scheduling.md §7.7, §7.13): every one, except null positions
    /// and, for a window group under sparse retention, those no later
    /// request could resume from.
    pub(super) fn cache_blocks(
        &mut self,
        g: usize,
        table: &mut BlockTable,
        seq: &Sequence,
        upto: usize,
    ) {
        // Only tokens whose KV is final: multi-module MTP may prefill the
        // last few again.
        let upto = upto.saturating_sub(self.reprefillable);
        if upto < (table.num_cached + 1) * self.block_size {
            return; // no new full block: the common case, without a division
        }
        let hashes = seq.block_hashes();
        let full = (upto.min(hashes.len() * self.block_size) / self.block_size).min(table.len());
        let start = table.num_cached;
        if start < full {
            let mask = match self.groups[g].kind {
                AttentionKind::SlidingWindow { window } if self.sparse_retention => {
                    Some(sparse_mask(
                        start,
                        full,
                        self.block_size,
                        window,
                        seq.num_prompt_tokens(),
                        seq.shared_prefix_boundary,
                        self.retention_interval,
                    ))
                }
                _ => None,
            };
            if full - start > 1 {
                let keys = hashes[start..full].iter().map(|&h| group_key(h, g));
                self.pool.read_ahead_map(keys);
            }
            let fresh = table.blocks[start..full].iter().zip(&hashes[start..full]);
            for (i, (&block, &hash)) in (start..).zip(fresh) {
                if block == NULL_BLOCK || mask.as_ref().is_some_and(|keep| !keep(i)) {
                    continue;
                }
                self.pool.cache_block(block, group_key(hash, g));
            }
        }
        table.num_cached = table.num_cached.max(full);
    }
}
