//! The longest prefix-cache hit valid for every KV-cache group
//! (docs/scheduling.md §7.13), as vLLM 0.33's hybrid coordinator finds it.
//!
//! Each attention type looks for its own kind of hit, at most a candidate
//! length long: full attention the leading run of cached blocks; a sliding
//! window the rightmost run of `cdiv(window − 1, bs)` cached blocks (what
//! its window reads back from the hit's end; the blocks before it are not
//! needed); chunked local attention the cached blocks of the candidate's
//! last chunk; a recurrent state (cache mode "align") the rightmost cached
//! state, the one block it needs. Groups of one kind and size are asked together (a block must
//! be cached in each). Full attention goes first; each answer becomes the
//! next candidate, until a pass changes nothing (one pass when there are two
//! kinds, or one group: vLLM's unitary coordinator asks its group once).
//! Full attention's answer is kept only up to the final hit.
//!
//! An EAGLE-style drafter's groups without lookahead hashes (§7.4) give up
//! the last block of their hit: full attention drops its last block, a
//! window asks one block more and drops it. Beside other groups such a kind
//! first looks a block past the candidate, so that after the drop it lands
//! on it, and does so once per candidate (vLLM's `eagle_verified`).

use crate::attention_group::{contiguous_blocks_for_hit, group_key, AttentionKind};
use crate::block::{cdiv, BlockId, NULL_BLOCK};
use crate::block_hash::BlockHash;
use crate::block_pool::BlockPool;

/// Groups asked together: one attention kind and block size, the group
/// ids that have them, and whether their hit gives up its last block (any
/// of them holds an EAGLE-style drafter's layers).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LookupGroup {
    pub kind: AttentionKind,
    pub block_size: usize,
    pub group_ids: Vec<usize>,
    pub drops_eagle_block: bool,
}

/// The lookup order for groups of these kinds and block sizes (`eagle[g]`:
/// group `g` drops an EAGLE block): alike groups together, in order of
/// first appearance, full attention first (a stable sort).
pub fn lookup_groups(
    kinds: &[AttentionKind],
    block_sizes: &[usize],
    eagle: &[bool],
) -> Vec<LookupGroup> {
    let mut out: Vec<LookupGroup> = Vec::new();
    for (g, (&kind, &block_size)) in kinds.iter().zip(block_sizes).enumerate() {
        let drops = eagle.get(g).copied().unwrap_or(false);
        match out
            .iter_mut()
            .find(|l| l.kind == kind && l.block_size == block_size)
        {
            Some(l) => {
                l.group_ids.push(g);
                l.drops_eagle_block |= drops;
            }
            None => out.push(LookupGroup {
                kind,
                block_size,
                group_ids: vec![g],
                drops_eagle_block: drops,
            }),
        }
    }
    out.sort_by_key(|l| !l.kind.is_full());
    out
}

/// A hit: `blocks[g]` is group `g`'s hit blocks (null where the group needs
/// none), `tokens / bs` long for its block size `bs`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PrefixHit {
    pub tokens: usize,
    /// The longest hit one group alone had, when longer than `tokens`: a
    /// prefix other requests share that a sparse group has not cached yet
    /// (vLLM's `shared_prefix_boundary`, pinned so that group caches it); 0
    /// otherwise.
    pub shared_prefix_boundary: usize,
}

/// Per-group hits told to a KV connector (§4.19.2): full attention's,
/// which the request takes, and whether another group's fell short of it
/// (its state then comes from the connector, or the hit is found again).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupHits {
    pub tokens: usize,
    pub diverged: bool,
}

/// One prefix lookup: a request's `hashes` (one per `hash_block_size`
/// tokens), the most tokens its hit may cover (`max_len`), and the unit
/// each kind's hit ends on (`alignment`: the scheduler block; the block
/// size when the groups' are alike).
#[derive(Clone, Copy, Debug)]
pub struct HitQuery<'a> {
    pub hashes: &'a [BlockHash],
    pub max_len: usize,
    pub hash_block_size: usize,
    pub alignment: usize,
}

impl<'a> HitQuery<'a> {
    /// The request's hashes as `l`'s blocks see them.
    fn view(self, l: &LookupGroup) -> HashView<'a> {
        HashView {
            hashes: self.hashes,
            per_block: l.block_size / self.hash_block_size,
        }
    }
}

/// Find the hit `query` asks for, into `blocks` (one list per group,
/// cleared first).
pub fn find_longest_hit(
    pool: &BlockPool,
    groups: &[LookupGroup],
    query: HitQuery<'_>,
    blocks: &mut [Vec<BlockId>],
) -> PrefixHit {
    let num_groups = blocks.len();
    let mut looked_up = vec![false; num_groups];
    let mut hit_by_group = vec![0usize; num_groups];
    let mut hit = query.max_len;
    let mut longest = 0;
    // vLLM's hybrid coordinator stops after one pass for full attention
    // beside one other kind; its unitary one (a single group) asks once.
    let one_pass = (groups.len() == 2 && groups[0].kind.is_full()) || num_groups == 1;
    // A kind that drops an EAGLE block does so once per candidate length.
    let mut eagle_verified = vec![false; groups.len()];
    let hashed = query.hashes.len() * query.hash_block_size;
    loop {
        let mut candidate = hit;
        for (idx, l) in groups.iter().enumerate() {
            let first = l.group_ids[0];
            if l.kind.is_full() && looked_up[first] {
                // Full attention is downward-closed: its first answer holds.
                candidate = candidate.min(hit_by_group[first]);
                continue;
            }
            let drop = l.drops_eagle_block && !eagle_verified[idx];
            let reach = reach_for(l, candidate, drop, num_groups, hashed);
            let found = find_for(pool, l, query.view(l), reach, query.alignment, blocks, drop);
            if drop {
                eagle_verified[idx] = true;
            } else if found < candidate {
                eagle_verified.fill(false);
            }
            candidate = found;
            for &g in &l.group_ids {
                looked_up[g] = true;
                hit_by_group[g] = found;
            }
            longest = longest.max(candidate);
        }
        if candidate >= hit {
            break;
        }
        hit = candidate;
        if one_pass {
            break;
        }
    }
    for l in groups.iter().filter(|l| l.kind.is_full()) {
        let keep = cdiv(hit, l.block_size);
        for &g in &l.group_ids {
            blocks[g].truncate(keep);
        }
    }
    PrefixHit {
        tokens: hit,
        shared_prefix_boundary: if longest > hit { longest } else { 0 },
    }
}

/// How far kind `l` looks for a hit of at most `candidate` tokens: beside
/// other groups, a kind that drops an EAGLE block looks a block past it, so
/// that after the drop it lands on it (vLLM's hybrid coordinator; its
/// unitary one asks for the candidate). Not a recurrent state: its finder
/// never drops.
fn reach_for(
    l: &LookupGroup,
    candidate: usize,
    drop: bool,
    num_groups: usize,
    hashed: usize,
) -> usize {
    if drop && num_groups > 1 && !l.kind.is_recurrent() {
        (candidate + l.block_size).min(hashed)
    } else {
        candidate
    }
}

/// Each group's own hit for `query`, every kind asked alone (vLLM's
/// `find_longest_cache_hit_per_group`, which a KV connector that completes
/// divergent hybrid hits is told of, §4.19.2), into `blocks` (one list per
/// group, its own hit's length); returns each group's hit in tokens.
pub fn find_hit_per_group(
    pool: &BlockPool,
    groups: &[LookupGroup],
    query: HitQuery<'_>,
    blocks: &mut [Vec<BlockId>],
) -> Vec<usize> {
    let num_groups = blocks.len();
    let mut hit_by_group = vec![0usize; num_groups];
    let hashed = query.hashes.len() * query.hash_block_size;
    for l in groups {
        let drop = l.drops_eagle_block;
        let reach = reach_for(l, query.max_len, drop, num_groups, hashed);
        let found = find_for(pool, l, query.view(l), reach, query.alignment, blocks, drop);
        for &g in &l.group_ids {
            hit_by_group[g] = found;
        }
    }
    hit_by_group
}

/// The blocks cached under `hash` in every group of `l`, into `row`.
fn cached_in_all(
    pool: &BlockPool,
    l: &LookupGroup,
    hash: BlockHash,
    row: &mut Vec<BlockId>,
) -> bool {
    row.clear();
    for &g in &l.group_ids {
        match pool.get_cached_block(group_key(hash, g)) {
            Some(b) => row.push(b),
            None => return false,
        }
    }
    true
}

/// A request's hashes as a group of `per_block` hash blocks a block sees
/// them: block `i`'s is the chain's hash where it ends (vLLM's
/// `BlockHashListWithBlockSize`).
#[derive(Clone, Copy)]
struct HashView<'a> {
    hashes: &'a [BlockHash],
    per_block: usize,
}

impl HashView<'_> {
    fn len(self) -> usize {
        self.hashes.len() / self.per_block
    }

    fn get(self, i: usize) -> BlockHash {
        self.hashes[(i + 1) * self.per_block - 1]
    }
}

/// One kind's hit of at most `max_len` tokens, written into `blocks` for
/// its groups, its last block given up when `drop` (full attention and
/// windows; a window then asks one contiguous block more); returns its
/// length in tokens. It ends on a multiple of `alignment` (for chunked
/// local attention, whose blocks are the alignment's, trivially).
fn find_for(
    pool: &BlockPool,
    l: &LookupGroup,
    hashes: HashView<'_>,
    max_len: usize,
    alignment: usize,
    blocks: &mut [Vec<BlockId>],
    drop: bool,
) -> usize {
    let block_size = l.block_size;
    let num_blocks = (max_len / block_size).min(hashes.len());
    let mut row = Vec::with_capacity(l.group_ids.len());
    for &g in &l.group_ids {
        blocks[g].clear();
    }
    let push_row = |blocks: &mut [Vec<BlockId>], row: &[BlockId]| {
        for (&g, &b) in l.group_ids.iter().zip(row) {
            blocks[g].push(b);
        }
    };
    match l.kind {
        AttentionKind::Full => {
            for i in 0..num_blocks {
                if !cached_in_all(pool, l, hashes.get(i), &mut row) {
                    break;
                }
                push_row(blocks, &row);
            }
            if drop {
                for &g in &l.group_ids {
                    blocks[g].pop();
                }
            }
            // Down to the alignment (blocks smaller than the scheduler
            // block: vLLM's full-attention finder rounds its hit so).
            let mut len = blocks[l.group_ids[0]].len();
            while len * block_size % alignment != 0 {
                len -= 1;
            }
            for &g in &l.group_ids {
                blocks[g].truncate(len);
            }
        }
        AttentionKind::SlidingWindow { window } => {
            // Right to left: the first run long enough ends the hit there.
            let need = contiguous_blocks_for_hit(window, block_size) + usize::from(drop);
            for &g in &l.group_ids {
                blocks[g].resize(num_blocks, NULL_BLOCK);
            }
            let mut run = 0;
            let mut found = false;
            for i in (0..num_blocks).rev() {
                if cached_in_all(pool, l, hashes.get(i), &mut row) {
                    // A run must end where a hit can: on the alignment.
                    let end = if drop { i } else { i + 1 };
                    if run == 0 && block_size != alignment && end * block_size % alignment != 0 {
                        continue;
                    }
                    for (&g, &b) in l.group_ids.iter().zip(&row) {
                        blocks[g][i] = b;
                    }
                    run += 1;
                    if run >= need {
                        for &g in &l.group_ids {
                            blocks[g].truncate(i + run);
                        }
                        found = true;
                        break;
                    }
                } else {
                    run = 0;
                }
            }
            if !found {
                // A shorter run counts only from the first block, and up
                // to the alignment.
                let mut len = run;
                while len * block_size % alignment != 0 {
                    len -= 1;
                }
                for &g in &l.group_ids {
                    blocks[g].truncate(len);
                }
            }
            if drop {
                for &g in &l.group_ids {
                    blocks[g].pop();
                }
                let mut len = blocks[l.group_ids[0]].len();
                while len * block_size % alignment != 0 {
                    len -= 1;
                }
                for &g in &l.group_ids {
                    blocks[g].truncate(len);
                }
            }
        }
        AttentionKind::ChunkedLocal { chunk } => {
            // Blocks before the candidate's last chunk need nothing cached.
            let start = max_len / chunk * chunk / block_size;
            for &g in &l.group_ids {
                blocks[g].resize(start, NULL_BLOCK);
            }
            for i in start..num_blocks {
                if !cached_in_all(pool, l, hashes.get(i), &mut row) {
                    break;
                }
                push_row(blocks, &row);
            }
        }
        AttentionKind::Mamba { .. } => {
            // One state is all a hit needs: the rightmost cached one, after
            // nulls (cache mode "align", §7.15), ending where a hit can, on
            // the alignment (states smaller than the attention blocks,
            // §7.16).
            for i in (0..num_blocks).rev() {
                if block_size != alignment && (i + 1) * block_size % alignment != 0 {
                    continue;
                }
                if cached_in_all(pool, l, hashes.get(i), &mut row) {
                    for &g in &l.group_ids {
                        blocks[g].resize(i, NULL_BLOCK);
                    }
                    push_row(blocks, &row);
                    break;
                }
            }
        }
        // Never cached (prefix caching is off beside it): no hit.
        AttentionKind::CrossAttention => {}
    }
    blocks[l.group_ids[0]].len() * block_size
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pool where `num_groups` groups cached the first `cached` of the
    /// blocks of `hashes` (blocks of 2 tokens), and block 5.
    fn pool_with(num_groups: usize, hashes: &[BlockHash], cached: usize) -> BlockPool {
        let mut pool = BlockPool::new(40).unwrap();
        for g in 0..num_groups {
            let mut ids = Vec::new();
            pool.take_free_blocks(hashes.len(), &mut ids);
            for (i, (&id, &h)) in ids.iter().zip(hashes).enumerate() {
                if i < cached || i == 5 {
                    pool.cache_block(id, group_key(h, g));
                }
            }
        }
        pool
    }

    fn query(hashes: &[BlockHash], max_len: usize, hash_bs: usize, align: usize) -> HitQuery<'_> {
        HitQuery {
            hashes,
            max_len,
            hash_block_size: hash_bs,
            alignment: align,
        }
    }

    /// A pool with a block cached under each `(hash index, group)` key,
    /// in order; their ids.
    fn pool_caching(hashes: &[BlockHash], keys: &[(usize, usize)]) -> (BlockPool, Vec<BlockId>) {
        let mut pool = BlockPool::new(40).unwrap();
        let mut ids = Vec::new();
        pool.take_free_blocks(keys.len(), &mut ids);
        for (&id, &(k, g)) in ids.iter().zip(keys) {
            pool.cache_block(id, group_key(hashes[k], g));
        }
        (pool, ids)
    }

    #[test]
    fn one_group_is_asked_once() {
        // vLLM 0.33, chunks of 3 tokens in blocks of 2, blocks 3 and 4
        // evicted, a 12-token resend (at most 11 hit tokens): its unitary
        // coordinator answers the last chunk's start, 8 tokens, all null
        // (the chunk is not a whole number of blocks); its hybrid one, with
        // two such groups, goes on to 6 (and reports the 8 as shared).
        let hashes: Vec<BlockHash> = (1..=6).map(BlockHash).collect();
        let kind = AttentionKind::ChunkedLocal { chunk: 3 };
        for (num_groups, tokens, shared) in [(1, 8, 0), (2, 6, 8)] {
            let pool = pool_with(num_groups, &hashes, 3);
            let groups = lookup_groups(&vec![kind; num_groups], &vec![2; num_groups], &[]);
            let mut blocks = vec![Vec::new(); num_groups];
            let hit = find_longest_hit(&pool, &groups, query(&hashes, 11, 2, 2), &mut blocks);
            assert_eq!((hit.tokens, hit.shared_prefix_boundary), (tokens, shared));
            assert!(blocks.iter().all(|b| b.len() == tokens / 2));
            assert!(blocks.iter().flatten().all(|&b| b == NULL_BLOCK));
        }
    }

    #[test]
    fn a_window_of_smaller_blocks_ends_its_hit_on_the_scheduler_block() {
        // vLLM 0.33, a mixed-precision hybrid: full attention in blocks of 4
        // tokens, a 3-token window in blocks of 2, hashes per 2 tokens, hits
        // on multiples of 4. The window cached its blocks 3 and 4 (tokens
        // 6..10); a run ending at token 10 is skipped, the hit ends at 8.
        let hashes: Vec<BlockHash> = (1..=8).map(BlockHash).collect();
        let keys = [(1, 0), (3, 0), (5, 0), (3, 1), (4, 1)];
        let (pool, ids) = pool_caching(&hashes, &keys);
        let kinds = [
            AttentionKind::Full,
            AttentionKind::SlidingWindow { window: 3 },
        ];
        let groups = lookup_groups(&kinds, &[4, 2], &[]);
        let mut blocks = vec![Vec::new(); 2];
        let hit = find_longest_hit(&pool, &groups, query(&hashes, 15, 2, 4), &mut blocks);
        assert_eq!(hit.tokens, 8);
        assert_eq!(blocks[0], ids[..2].to_vec());
        assert_eq!(blocks[1], [NULL_BLOCK, NULL_BLOCK, NULL_BLOCK, ids[3]]);
    }

    #[test]
    fn a_state_smaller_than_the_attention_blocks_hits_on_the_scheduler_block() {
        // vLLM 0.33, Qwen3-Next with MTP in small: full attention in blocks
        // of 4 tokens, recurrent states of 2, hashes per 2 tokens, hits on
        // multiples of 4. Full attention cached tokens 0..12, the states
        // after 4, 6 and 10 tokens: those after 10 and 6 are skipped (off
        // the alignment), the hit is the state after 4 (12 shared).
        let hashes: Vec<BlockHash> = (1..=8).map(BlockHash).collect();
        let keys = [(1, 0), (3, 0), (5, 0), (1, 1), (2, 1), (4, 1)];
        let (pool, ids) = pool_caching(&hashes, &keys);
        let state = AttentionKind::Mamba {
            block_size: 2,
            speculative_blocks: 0,
            checkpoint_alignment: None,
        };
        let groups = lookup_groups(&[AttentionKind::Full, state], &[4, 2], &[]);
        let mut blocks = vec![Vec::new(); 2];
        let hit = find_longest_hit(&pool, &groups, query(&hashes, 15, 2, 4), &mut blocks);
        assert_eq!(hit.tokens, 4);
        assert_eq!(hit.shared_prefix_boundary, 12);
        assert_eq!(blocks[0], ids[..1].to_vec());
        assert_eq!(blocks[1], [NULL_BLOCK, ids[3]]);
    }

    #[test]
    fn full_attention_of_smaller_blocks_rounds_its_hit_to_the_scheduler_block() {
        // Full attention in blocks of 2 cached tokens 0..6, a window in
        // blocks of 4 nothing: no hit, and the prefix the requests share
        // ends on the scheduler block, at 4 (vLLM rounds the full-attention
        // hit down so).
        let hashes: Vec<BlockHash> = (1..=8).map(BlockHash).collect();
        let (pool, _) = pool_caching(&hashes, &[(0, 0), (1, 0), (2, 0)]);
        let kinds = [
            AttentionKind::Full,
            AttentionKind::SlidingWindow { window: 3 },
        ];
        let groups = lookup_groups(&kinds, &[2, 4], &[]);
        let mut blocks = vec![Vec::new(); 2];
        let hit = find_longest_hit(&pool, &groups, query(&hashes, 15, 2, 4), &mut blocks);
        assert_eq!(hit.tokens, 0);
        assert_eq!(hit.shared_prefix_boundary, 4);
    }

    #[test]
    fn per_group_hits_are_each_groups_own() {
        // Full attention cached tokens 0..6 in blocks of 2, a state (group
        // 1) the one after 2 tokens: asked together the hit is 2 (and 6
        // is shared); asked alone (vLLM's per-group lookup, which a NIXL
        // connector is told of) full attention has 6 and the state 2.
        let hashes: Vec<BlockHash> = (1..=4).map(BlockHash).collect();
        let (pool, ids) = pool_caching(&hashes, &[(0, 0), (1, 0), (2, 0), (0, 1)]);
        let state = AttentionKind::Mamba {
            block_size: 2,
            speculative_blocks: 0,
            checkpoint_alignment: None,
        };
        let groups = lookup_groups(&[AttentionKind::Full, state], &[2, 2], &[]);
        let mut blocks = vec![Vec::new(); 2];
        let hit = find_longest_hit(&pool, &groups, query(&hashes, 7, 2, 2), &mut blocks);
        assert_eq!((hit.tokens, hit.shared_prefix_boundary), (2, 6));
        let by_group = find_hit_per_group(&pool, &groups, query(&hashes, 7, 2, 2), &mut blocks);
        assert_eq!(by_group, [6, 2]);
        assert_eq!(blocks[0], ids[..3].to_vec());
        assert_eq!(blocks[1], [ids[3]]);
    }

    #[test]
    fn full_attention_is_looked_up_first() {
        let kinds = [
            AttentionKind::SlidingWindow { window: 128 },
            AttentionKind::Full,
            AttentionKind::SlidingWindow { window: 128 },
        ];
        let groups = lookup_groups(&kinds, &[16; 3], &[]);
        assert_eq!(groups.len(), 2);
        assert_eq!(groups[0].group_ids, vec![1]);
        assert_eq!(groups[1].group_ids, vec![0, 2]);
    }
}
