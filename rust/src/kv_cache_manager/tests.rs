//! KV-cache scenarios of docs/scheduling.md §9.1 (vLLM 0.33.0's own
//! values) at the core's level; tests/test_kv_scenarios.py runs them on
//! both backends through the Python API.
use super::*;
use crate::attention_group::AttentionKind;

const BS: usize = 16;

fn manager(num_blocks: usize) -> KvCacheManager {
    KvCacheManager::new(&KvCacheConfig::new(num_blocks, BS, 4096, true)).unwrap()
}

/// A request admitted the way the scheduler admits one: prefix lookup,
/// then every remaining token allocated after the hits.
struct Admitted {
    seq: Sequence,
    table: BlockTable,
    hits: Vec<BlockId>,
    hit_tokens: usize,
}

fn admit(kv: &mut KvCacheManager, tokens: Vec<u32>) -> Admitted {
    let seq = Sequence::new(tokens, &[], kv.hasher(), BS);
    let mut hits = vec![];
    let hit_tokens = kv.get_computed_blocks(&seq, &mut hits);
    let mut table = BlockTable::default();
    let n = seq.num_tokens() - hit_tokens;
    kv.allocate_slots(&mut table, &seq, n, hit_tokens, &hits, false)
        .unwrap()
        .expect("room");
    Admitted {
        seq,
        table,
        hits,
        hit_tokens,
    }
}

fn free_queue(kv: &KvCacheManager) -> Vec<BlockId> {
    kv.pool().free_block_ids().collect()
}

fn common(extra: &[u32]) -> Vec<u32> {
    (1000..1048).chain(extra.iter().copied()).collect()
}

#[test]
fn k1_prefix_hits_and_the_free_order() {
    let mut kv = manager(11);
    let mut r0 = admit(&mut kv, common(&[3; 7]));
    assert_eq!(r0.table.block_ids(), [1, 2, 3, 4]);
    assert_eq!(r0.table.num_cached_blocks(), 3); // block 4 is partial
    let mut r1 = admit(&mut kv, common(&[3; 5]));
    assert_eq!((r1.hits.as_slice(), r1.hit_tokens), (&[1, 2, 3][..], 48));
    assert_eq!(r1.table.block_ids(), [1, 2, 3, 5]);
    kv.free(std::slice::from_mut(&mut r0.table));
    assert_eq!(free_queue(&kv), [4, 6, 7, 8, 9, 10]);
    // Unhashed blocks to the head, cached ones to the tail, last first (Q2).
    kv.free(std::slice::from_mut(&mut r1.table));
    assert_eq!(free_queue(&kv), [5, 4, 6, 7, 8, 9, 10, 3, 2, 1]);
    let r2 = admit(&mut kv, common(&[3; 6]));
    assert_eq!(
        (r2.hit_tokens, r2.table.block_ids()),
        (48, &[1, 2, 3, 5][..])
    );
}

#[test]
fn k4_the_last_token_is_always_computed() {
    // A hit covers at most num_tokens - 1 tokens (Q12); the recomputed
    // block's copy joins the map and lookups answer the earliest (Q14).
    let mut kv = manager(11);
    let mut x = admit(&mut kv, common(&[]));
    kv.free(std::slice::from_mut(&mut x.table));
    let y = admit(&mut kv, common(&[]));
    assert_eq!((y.hit_tokens, y.table.block_ids()), (32, &[1, 2, 4][..]));
    let last = y.seq.block_hashes()[2];
    let cached: Vec<_> = kv
        .pool()
        .cached_blocks()
        .filter(|(h, _)| *h == last)
        .map(|(_, ids)| ids.to_vec())
        .collect();
    assert_eq!(cached, vec![vec![3, 4]]);
}

#[test]
fn k6_a_refused_allocation_changes_nothing() {
    let mut kv = manager(6);
    let mut a = admit(&mut kv, common(&[1]));
    kv.free(std::slice::from_mut(&mut a.table));
    let _big = admit(&mut kv, (2000..2016).collect());
    assert_eq!(kv.num_free_blocks(), 4);
    let seq = Sequence::new(
        common(&(3000..3040).collect::<Vec<_>>()),
        &[],
        kv.hasher(),
        BS,
    );
    let mut hits = vec![];
    assert_eq!(kv.get_computed_blocks(&seq, &mut hits), 48);
    let before = free_queue(&kv);
    let mut table = BlockTable::default();
    // 3 new + 3 evictable hits = 6 > 4 free.
    for gate in [true, false] {
        let got = kv.allocate_slots(&mut table, &seq, 40, 48, &hits, gate);
        assert_eq!(got, Ok(None));
    }
    assert_eq!(free_queue(&kv), before);
    assert!(table.is_empty());
}

#[test]
fn hits_must_be_the_requests_own_cached_blocks() {
    let mut kv = manager(11);
    let _a = admit(&mut kv, common(&[1]));
    let seq = Sequence::new((0..40).collect(), &[], kv.hasher(), BS);
    let mut table = BlockTable::default();
    // Cached blocks, but of another prompt: refused, nothing changes.
    let got = kv.allocate_slots(&mut table, &seq, 8, 32, &[1, 2], false);
    assert!(matches!(got, Err(Error::InvalidArgument(_))));
    // More hits than the request has full blocks.
    let short = Sequence::new(common(&[]), &[], kv.hasher(), BS);
    let got = kv.allocate_slots(&mut table, &short, 1, 48, &[1, 2, 3], false);
    assert!(got.is_err());
    assert!(table.is_empty());
    assert_eq!(kv.num_free_blocks(), 6);
}

/// A Qwen3-Next-like layout in vLLM 0.33's Mamba cache mode "none": full
/// attention in blocks of 16 beside a recurrent group of `mamba_block`
/// tokens per state block with `speculative` scratch states.
fn mamba_manager(mamba_block: usize, speculative: usize) -> KvCacheManager {
    let mut config = KvCacheConfig::new(30, BS, 64, false);
    let mamba = AttentionKind::Mamba {
        block_size: mamba_block,
        speculative_blocks: speculative,
        checkpoint_alignment: None,
    };
    config.groups = vec![
        GroupSpec::FULL,
        GroupSpec {
            kind: mamba,
            admission_cap_blocks: None,
            block_size: None,
        },
    ];
    KvCacheManager::new(&config).unwrap()
}

#[test]
fn a_mamba_group_holds_one_state_block_and_its_scratch_states() {
    // The default state block spans the model's 64 tokens: one block, plus
    // two drafts' scratch states, taken with the first chunk and kept.
    let mut kv = mamba_manager(64, 2);
    let mut seq = Sequence::new((0..60).collect(), &[], kv.hasher(), BS);
    let mut tables = vec![BlockTable::default(), BlockTable::default()];
    let admission = Admission::default();
    assert_eq!(
        kv.allocate(&mut tables, &seq, 40, 0, &[], admission, 0),
        Some(3)
    );
    assert_eq!(tables[0].block_ids(), [1, 2, 3]);
    assert_eq!(tables[1].block_ids(), [4, 5, 6]);
    seq.num_computed_tokens = 40;
    // The next chunk grows full attention's table only.
    kv.allocate(&mut tables, &seq, 20, 0, &[], admission, 0);
    assert_eq!((tables[0].grown(), tables[1].grown()), (1, 0));
    assert_eq!(tables[1].block_ids(), [4, 5, 6]);
    assert_eq!(kv.pool().num_free_blocks(), 29 - 7);
}

#[test]
fn a_short_mamba_state_block_frees_all_but_the_last_tokens() {
    // State blocks of 16 tokens: once 40 are computed, only the block of
    // the 40th token's state is read again; the two before it go back.
    let mut kv = mamba_manager(16, 0);
    let mut seq = Sequence::new((0..60).collect(), &[], kv.hasher(), BS);
    let mut tables = vec![BlockTable::default(), BlockTable::default()];
    let admission = Admission::default();
    kv.allocate(&mut tables, &seq, 40, 0, &[], admission, 0);
    assert_eq!(tables[1].block_ids(), [4, 5, 6]);
    seq.num_computed_tokens = 40;
    kv.allocate(&mut tables, &seq, 10, 0, &[], admission, 0);
    // Unhashed blocks go back to the free queue's head, the last first:
    // full attention's next block is 5, the state block for tokens 48.. 4.
    assert_eq!(tables[0].block_ids(), [1, 2, 3, 5]);
    assert_eq!(tables[1].block_ids(), [0, 0, 6, 4]);
    assert_eq!(kv.pool().num_free_blocks(), 29 - 6);
}

#[test]
fn group_block_sizes_refuse_what_vllm_cannot_run() {
    let group = |kind, block_size| GroupSpec {
        kind,
        admission_cap_blocks: None,
        block_size,
    };
    let chunked = AttentionKind::ChunkedLocal { chunk: 64 };
    let config = |groups: Vec<GroupSpec>, caching: bool| KvCacheConfig {
        groups,
        ..KvCacheConfig::new(100, 16, 256, caching)
    };
    // Chunked blocks larger than full attention's: vLLM's hits end on them.
    let larger = vec![group(chunked, Some(32)), group(AttentionKind::Full, None)];
    assert!(config(larger, true).validate().is_ok());
    // Smaller: vLLM's prefix lookup asserts, so only without prefix caching.
    let smaller = vec![group(chunked, None), group(AttentionKind::Full, Some(32))];
    assert!(config(smaller.clone(), false).validate().is_ok());
    let err = config(smaller, true).validate().unwrap_err().to_string();
    assert!(err.contains("chunked-local-attention group's blocks must be the largest (32"));
    // An encoder-decoder's cross-attention blocks of their own size.
    let cross = vec![
        group(AttentionKind::Full, None),
        group(AttentionKind::CrossAttention, Some(32)),
    ];
    assert!(config(cross, false).validate().is_ok());
    // A recurrent group's block size is its kind's.
    let mamba = AttentionKind::Mamba {
        block_size: 16,
        speculative_blocks: 0,
        checkpoint_alignment: None,
    };
    let err = config(
        vec![group(AttentionKind::Full, None), group(mamba, Some(32))],
        false,
    )
    .validate()
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("a Mamba group's block size is its size"),
        "{err}"
    );
}
