//! `KVCacheManager`: the KV-cache manager with a registry of the requests it
//! serves, keyed by request id (the core itself keeps no ids: the requests
//! own their tables and sequences, as the scheduler's requests will).

use super::args::{count, u32_list};
use super::prefix_cache_stats::PyPrefixCacheStats;
use crate::block::BlockId;
use crate::block_table::BlockTable;
use crate::error::Error;
use crate::kv_cache_manager::{KvCacheConfig, KvCacheManager};
use crate::sequence::Sequence;
use crate::{cdiv, BlockHash, ExtraKey};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use rustc_hash::FxHashMap;
use std::collections::HashMap;

struct Entry {
    seq: Sequence,
    table: BlockTable,
}

/// The paged KV cache's bookkeeping: prefix lookups, slot allocation and
/// freeing for the requests registered with `add_request`, with vLLM 0.33's
/// decisions (block ids, free-queue order, prefix-cache hits).
#[pyclass(name = "KVCacheManager", module = "ironbatch._core")]
pub struct PyKvCacheManager {
    kv: KvCacheManager,
    requests: FxHashMap<String, Entry>,
    scratch: Vec<BlockId>,
}

fn unknown(request_id: &str) -> PyErr {
    Error::UnknownRequest(request_id.to_owned()).into()
}

impl PyKvCacheManager {
    fn entry(&self, request_id: &str) -> PyResult<&Entry> {
        self.requests
            .get(request_id)
            .ok_or_else(|| unknown(request_id))
    }

    fn check_len(&self, field: &str, num_tokens: usize) -> PyResult<()> {
        if num_tokens > self.kv.max_model_len() {
            return Err(PyValueError::new_err(format!(
                "{field}: {num_tokens} tokens exceed max_model_len = {}",
                self.kv.max_model_len()
            )));
        }
        Ok(())
    }
}

#[pymethods]
impl PyKvCacheManager {
    #[new]
    #[pyo3(signature = (num_blocks, block_size, max_model_len, enable_prefix_caching = true))]
    fn new(
        num_blocks: &Bound<'_, PyAny>,
        block_size: &Bound<'_, PyAny>,
        max_model_len: &Bound<'_, PyAny>,
        enable_prefix_caching: bool,
    ) -> PyResult<Self> {
        let config = KvCacheConfig::new(
            count("num_blocks", num_blocks)?,
            count("block_size", block_size)?,
            count("max_model_len", max_model_len)?,
            enable_prefix_caching,
        );
        Ok(PyKvCacheManager {
            kv: KvCacheManager::new(&config)?,
            requests: FxHashMap::default(),
            scratch: Vec::new(),
        })
    }

    /// Register a request's prompt (and hash its full blocks).
    #[pyo3(signature = (request_id, prompt_token_ids, cache_salt = None))]
    fn add_request(
        &mut self,
        request_id: &str,
        prompt_token_ids: &Bound<'_, PyAny>,
        cache_salt: Option<&str>,
    ) -> PyResult<()> {
        if self.requests.contains_key(request_id) {
            return Err(Error::DuplicateRequest(request_id.to_owned()).into());
        }
        let prompt = u32_list("prompt_token_ids", prompt_token_ids)?;
        if prompt.is_empty() {
            return Err(PyValueError::new_err("prompt_token_ids must not be empty"));
        }
        self.check_len("prompt_token_ids", prompt.len())?;
        let keys: Vec<ExtraKey<'_>> = cache_salt.map(ExtraKey::CacheSalt).into_iter().collect();
        let seq = Sequence::new(prompt, &keys, self.kv.hasher(), self.kv.hash_block_size());
        self.requests.insert(
            request_id.to_owned(),
            Entry {
                seq,
                table: BlockTable::default(),
            },
        );
        Ok(())
    }

    /// Append output tokens to a request, hashing each block they complete.
    fn append_token_ids(&mut self, request_id: &str, token_ids: &Bound<'_, PyAny>) -> PyResult<()> {
        let tokens = u32_list("token_ids", token_ids)?;
        let num_tokens = self.entry(request_id)?.seq.num_tokens() + tokens.len();
        self.check_len("token_ids", num_tokens)?;
        let (hasher, bs) = (self.kv.hasher(), self.kv.hash_block_size());
        let entry = self.requests.get_mut(request_id).expect("checked above");
        entry.seq.append(&tokens, hasher, bs);
        Ok(())
    }

    /// Free a request's blocks and forget it.
    fn remove_request(&mut self, request_id: &str) -> PyResult<()> {
        let mut entry = self
            .requests
            .remove(request_id)
            .ok_or_else(|| unknown(request_id))?;
        self.kv.free(std::slice::from_mut(&mut entry.table));
        Ok(())
    }

    /// The longest cached prefix of the request: (hit block ids, hit tokens).
    /// Whole blocks only, at most `num_tokens - 1` tokens. Changes nothing.
    fn get_computed_blocks(&mut self, request_id: &str) -> PyResult<(Vec<u32>, usize)> {
        let entry = self
            .requests
            .get(request_id)
            .ok_or_else(|| unknown(request_id))?;
        self.scratch.clear();
        let hit = self.kv.get_computed_blocks(&entry.seq, &mut self.scratch);
        Ok((self.scratch.clone(), hit))
    }

    /// Make room for `num_new_tokens` more tokens after taking the prefix
    /// hits `new_computed_blocks` (worth `num_new_computed_tokens`). Returns
    /// the newly allocated block ids, or None (and changes nothing) when too
    /// few blocks are free. `full_sequence_must_fit` is the admission gate.
    #[pyo3(signature = (request_id, num_new_tokens, num_new_computed_tokens = None,
                        new_computed_blocks = None, full_sequence_must_fit = false))]
    fn allocate_slots(
        &mut self,
        request_id: &str,
        num_new_tokens: &Bound<'_, PyAny>,
        num_new_computed_tokens: Option<&Bound<'_, PyAny>>,
        new_computed_blocks: Option<&Bound<'_, PyAny>>,
        full_sequence_must_fit: bool,
    ) -> PyResult<Option<Vec<u32>>> {
        let n_new = count("num_new_tokens", num_new_tokens)?;
        let n_hit = match num_new_computed_tokens {
            Some(n) => count("num_new_computed_tokens", n)?,
            None => 0,
        };
        let hits = match new_computed_blocks {
            Some(b) => u32_list("new_computed_blocks", b)?,
            None => Vec::new(),
        };
        let entry = self
            .requests
            .get_mut(request_id)
            .ok_or_else(|| unknown(request_id))?;
        let grown = self.kv.allocate_slots(
            &mut entry.table,
            &entry.seq,
            n_new,
            n_hit,
            &hits,
            full_sequence_must_fit,
        )?;
        Ok(grown.map(|k| entry.table.block_ids()[entry.table.len() - k..].to_vec()))
    }

    /// Release the request's blocks (last block first). It stays registered
    /// with no computed tokens, as a preempted request is.
    fn free(&mut self, request_id: &str) -> PyResult<()> {
        let entry = self
            .requests
            .get_mut(request_id)
            .ok_or_else(|| unknown(request_id))?;
        self.kv.free(std::slice::from_mut(&mut entry.table));
        entry.seq.num_computed_tokens = 0;
        Ok(())
    }

    /// The request's block table.
    fn get_block_ids(&self, request_id: &str) -> PyResult<Vec<u32>> {
        Ok(self.entry(request_id)?.table.block_ids().to_vec())
    }

    /// How many leading blocks of the request's table are hash-cached.
    fn num_cached_blocks(&self, request_id: &str) -> PyResult<usize> {
        Ok(self.entry(request_id)?.table.num_cached_blocks())
    }

    /// The request's known tokens (prompt + output).
    fn num_tokens(&self, request_id: &str) -> PyResult<usize> {
        Ok(self.entry(request_id)?.seq.num_tokens())
    }

    /// Tokens of the request whose KV is (or this step will be) cached.
    fn num_computed_tokens(&self, request_id: &str) -> PyResult<usize> {
        Ok(self.entry(request_id)?.seq.num_computed_tokens)
    }

    /// Set what the scheduler computed; at most the tokens its table covers
    /// and its known tokens.
    fn set_num_computed_tokens(
        &mut self,
        request_id: &str,
        num_computed_tokens: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let n = count("num_computed_tokens", num_computed_tokens)?;
        let bs = self.kv.hash_block_size();
        let entry = self
            .requests
            .get_mut(request_id)
            .ok_or_else(|| unknown(request_id))?;
        let limit = entry.seq.num_tokens().min(entry.table.len() * bs);
        if n > limit {
            return Err(PyValueError::new_err(format!(
                "num_computed_tokens = {n} exceeds the {limit} tokens request {request_id:?} has \
                 slots for ({} blocks of {bs}, {} known tokens)",
                entry.table.len(),
                entry.seq.num_tokens()
            )));
        }
        debug_assert!(cdiv(n, bs) <= entry.table.len());
        entry.seq.num_computed_tokens = n;
        Ok(())
    }

    /// The request's block hashes, one per full block.
    fn block_hashes(&self, request_id: &str) -> PyResult<Vec<u128>> {
        Ok(self
            .entry(request_id)?
            .seq
            .block_hashes()
            .iter()
            .map(|h| h.0)
            .collect())
    }

    fn __contains__(&self, request_id: &str) -> bool {
        self.requests.contains_key(request_id)
    }

    fn __len__(&self) -> usize {
        self.requests.len()
    }

    /// Count one admission of the request with `num_hit_tokens` prefix hits.
    #[pyo3(signature = (request_id, num_hit_tokens, preempted = false))]
    fn record_prefix_cache_stats(
        &mut self,
        request_id: &str,
        num_hit_tokens: &Bound<'_, PyAny>,
        preempted: bool,
    ) -> PyResult<()> {
        let hits = count("num_hit_tokens", num_hit_tokens)?;
        let num_tokens = self.entry(request_id)?.seq.num_tokens();
        if hits > num_tokens {
            return Err(PyValueError::new_err(format!(
                "num_hit_tokens = {hits} exceeds the request's {num_tokens} tokens"
            )));
        }
        self.kv
            .record_prefix_cache_stats(num_tokens, hits, preempted);
        Ok(())
    }

    /// Take the prefix-cache counters, leaving zeros.
    fn make_prefix_cache_stats(&mut self) -> PyPrefixCacheStats {
        self.kv.make_prefix_cache_stats().into()
    }

    /// Forget every cached hash; refused (False) while any block is held.
    fn reset_prefix_cache(&mut self) -> bool {
        self.kv.reset_prefix_cache()
    }

    /// The free queue, head (next to reuse or evict) first.
    fn free_block_ids(&self) -> Vec<u32> {
        self.kv.pool().free_block_ids().collect()
    }

    /// Every block's reference count, indexed by block id.
    fn block_ref_cnts(&self) -> Vec<u32> {
        let pool = self.kv.pool();
        (0..pool.num_blocks() as u32)
            .map(|b| pool.block(b).map_or(0, |b| b.ref_cnt))
            .collect()
    }

    /// The hash a block is cached under, or None.
    fn block_hash(&self, block_id: &Bound<'_, PyAny>) -> PyResult<Option<u128>> {
        let id = count("block_id", block_id)?;
        let block = u32::try_from(id)
            .ok()
            .and_then(|id| self.kv.pool().block(id))
            .ok_or_else(|| PyValueError::new_err(format!("block_id = {id} is not in the pool")))?;
        Ok(block.hash.map(|h: BlockHash| h.0))
    }

    /// The prefix-cache map: hash -> block ids in insertion order.
    fn cached_blocks(&self) -> HashMap<u128, Vec<u32>> {
        self.kv
            .pool()
            .cached_blocks()
            .map(|(h, ids)| (h.0, ids))
            .collect()
    }

    #[getter]
    fn num_blocks(&self) -> usize {
        self.kv.pool().num_blocks()
    }

    #[getter]
    fn block_size(&self) -> usize {
        self.kv.hash_block_size()
    }

    #[getter]
    fn max_model_len(&self) -> usize {
        self.kv.max_model_len()
    }

    #[getter]
    fn enable_prefix_caching(&self) -> bool {
        self.kv.enable_prefix_caching()
    }

    #[getter]
    fn num_free_blocks(&self) -> usize {
        self.kv.num_free_blocks()
    }

    #[getter]
    fn usage(&self) -> f64 {
        self.kv.usage()
    }

    fn __repr__(&self) -> String {
        format!(
            "KVCacheManager(num_blocks={}, block_size={}, max_model_len={}, \
             enable_prefix_caching={}, num_free_blocks={}, requests={})",
            self.kv.pool().num_blocks(),
            self.kv.hash_block_size(),
            self.kv.max_model_len(),
            if self.kv.enable_prefix_caching() {
                "True"
            } else {
                "False"
            },
            self.kv.num_free_blocks(),
            self.requests.len()
        )
    }
}
