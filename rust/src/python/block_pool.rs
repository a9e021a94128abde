//! `BlockPool`: the bare pool and free queue, for direct use and benchmarks.

use super::args::{count, u32_list};
use crate::block_pool::BlockPool;
use pyo3::prelude::*;

/// All KV-cache blocks and their free queue (block 0 is the reserved null
/// block). Freed blocks go to the head of the queue (reused first).
#[pyclass(name = "BlockPool", module = "ironbatch._core")]
pub struct PyBlockPool {
    pool: BlockPool,
    scratch: Vec<u32>,
}

#[pymethods]
impl PyBlockPool {
    #[new]
    fn new(num_blocks: &Bound<'_, PyAny>) -> PyResult<Self> {
        let pool = BlockPool::new(count("num_blocks", num_blocks)?)?;
        Ok(PyBlockPool {
            pool,
            scratch: Vec::new(),
        })
    }

    /// Take `num_blocks` blocks from the head of the free queue.
    fn get_new_blocks(&mut self, num_blocks: &Bound<'_, PyAny>) -> PyResult<Vec<u32>> {
        let k = count("num_blocks", num_blocks)?;
        self.scratch.clear();
        self.pool.get_new_blocks(k, &mut self.scratch)?;
        Ok(self.scratch.clone())
    }

    /// Drop one reference per listed block, in the order given.
    fn free_blocks(&mut self, block_ids: &Bound<'_, PyAny>) -> PyResult<()> {
        let ids = u32_list("block_ids", block_ids)?;
        Ok(self.pool.free_blocks(&ids)?)
    }

    /// Add one reference per listed block, taking free ones off the queue.
    fn touch(&mut self, block_ids: &Bound<'_, PyAny>) -> PyResult<()> {
        let ids = u32_list("block_ids", block_ids)?;
        Ok(self.pool.touch(&ids)?)
    }

    /// Forget all cached hashes; refused (False) while any block is held.
    fn reset_prefix_cache(&mut self) -> bool {
        self.pool.reset_prefix_cache()
    }

    /// The free queue, head (next to reuse) first.
    fn free_block_ids(&self) -> Vec<u32> {
        self.pool.free_block_ids().collect()
    }

    /// Every block's reference count, indexed by block id.
    fn block_ref_cnts(&self) -> Vec<u32> {
        (0..self.pool.num_blocks() as u32)
            .map(|b| self.pool.block(b).map_or(0, |b| b.ref_cnt))
            .collect()
    }

    #[getter]
    fn num_blocks(&self) -> usize {
        self.pool.num_blocks()
    }

    #[getter]
    fn num_free_blocks(&self) -> usize {
        self.pool.num_free_blocks()
    }

    #[getter]
    fn usage(&self) -> f64 {
        self.pool.usage()
    }

    fn __repr__(&self) -> String {
        format!(
            "BlockPool(num_blocks={}, num_free_blocks={})",
            self.pool.num_blocks(),
            self.pool.num_free_blocks()
        )
    }
}
