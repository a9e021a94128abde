//! LoRA adapters as the scheduler sees them (docs/scheduling.md §4.14): a
//! request's adapter, which keys its block hashes (two adapters never share
//! a prefix-cache hit), and the running batch's set of adapters, which caps
//! admissions at `max_loras` distinct ones.

use smallvec::SmallVec;

/// A request's adapter (vLLM's `LoRARequest`): `id` is what the batch counts
/// (`lora_int_id`, at least 1), `name` and `path` what the hashes are keyed
/// by, so that a name pointed at another adapter never reuses its KV.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoraAdapter {
    pub id: u32,
    pub name: String,
    pub path: String,
}

/// The distinct adapters of one step's batch: those of every running
/// request (scheduled this step or not: they can join a later batch),
/// then those the waiting pass admits.
#[derive(Debug)]
pub struct LoraBatch {
    max_loras: usize,
    ids: SmallVec<[u32; 8]>,
}

impl LoraBatch {
    /// The adapters of `running`, under a cap of `max_loras`.
    pub fn of_running(max_loras: usize, running: impl Iterator<Item = u32>) -> Self {
        let mut batch = LoraBatch {
            max_loras,
            ids: SmallVec::new(),
        };
        for id in running {
            batch.add(id);
        }
        batch
    }

    /// Whether a request with adapter `id` can join without a new adapter
    /// past the cap (one already in the batch always can).
    pub fn admits(&self, id: u32) -> bool {
        self.ids.len() < self.max_loras || self.ids.contains(&id)
    }

    /// Count `id` in the batch (once).
    pub fn add(&mut self, id: u32) {
        if !self.ids.contains(&id) {
            self.ids.push(id);
        }
    }

    /// Distinct adapters so far.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_refuses_only_a_new_adapter() {
        let mut batch = LoraBatch::of_running(2, [3, 3, 5].into_iter());
        assert_eq!(batch.len(), 2);
        assert!(batch.admits(3) && batch.admits(5));
        assert!(!batch.admits(7));
        let mut open = LoraBatch::of_running(2, [3].into_iter());
        assert!(open.admits(7));
        open.add(7);
        assert!(!open.admits(9));
        batch.add(5);
        assert_eq!(batch.len(), 2);
    }
}
