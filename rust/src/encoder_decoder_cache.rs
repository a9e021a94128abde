//! The encoder cache of an encoder-decoder model (docs/scheduling.md §4.17;
//! vLLM 0.33's `EncoderDecoderCacheManager`). Whisper's encoder output is
//! read once, into the cross-attention KV cache, so nothing is shared or
//! kept between requests: the cache is a count of free embedding slots,
//! and the identifiers of the inputs encoded in a step are reported freed
//! one step later (the runner drops them before the next model run).
//!
//! The count follows vLLM's arithmetic exactly, including what vLLM frees
//! without having taken: every step a request with computed tokens runs
//! frees its inputs' embeddings again, as does finishing, preemption and
//! a refused allocation. So the count only bounds the first steps; after
//! that the compute budget is what limits the encoder.

use crate::multimodal::MultimodalInput;

/// Free embedding slots and the identifiers waiting to be reported freed.
#[derive(Clone, Debug)]
pub struct EncoderDecoderCache {
    size: usize,
    num_free: usize,
    /// Encoded this step: reported freed after the next step.
    allocated: Vec<String>,
    /// Encoded the step before: reported freed by this step.
    to_free: Vec<String>,
}

impl EncoderDecoderCache {
    /// An empty cache of `size` embeddings.
    pub fn new(size: usize) -> Self {
        EncoderDecoderCache {
            size,
            num_free: size,
            allocated: Vec::new(),
            to_free: Vec::new(),
        }
    }

    /// Its size in embeddings.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Free embedding slots (vLLM's `num_free_slots`; may exceed the size).
    pub fn num_free(&self) -> usize {
        self.num_free
    }

    /// Identifiers encoded this step and the step before, in order.
    pub fn pending(&self) -> (&[String], &[String]) {
        (&self.allocated, &self.to_free)
    }

    /// Whether an input of `num_embeds` fits the step's remaining `budget`
    /// and, beside the `num_scheduled` embeddings planned already, the
    /// free slots.
    pub fn can_allocate(&self, num_embeds: usize, budget: usize, num_scheduled: usize) -> bool {
        num_embeds <= budget && num_embeds + num_scheduled <= self.num_free
    }

    /// Take slots for an input the step encodes.
    pub fn allocate(&mut self, input: &MultimodalInput) {
        self.num_free -= input.num_embeds();
        self.allocated.push(input.identifier.to_string());
    }

    /// Give back every input's slots (whether taken or not, as vLLM does).
    pub fn release_all(&mut self, inputs: &[MultimodalInput]) {
        let n: usize = inputs.iter().map(MultimodalInput::num_embeds).sum();
        self.num_free = self.num_free.saturating_add(n);
    }

    /// The identifiers the model runner may drop now: those encoded the
    /// step before this one.
    pub fn take_freed(&mut self) -> Vec<String> {
        std::mem::replace(&mut self.to_free, std::mem::take(&mut self.allocated))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_taken_then_given_back_and_ids_are_freed_a_step_late() {
        let mut cache = EncoderDecoderCache::new(10);
        let a = MultimodalInput::new(0, 6, "a");
        assert!(cache.can_allocate(6, 6, 0));
        assert!(!cache.can_allocate(6, 5, 0), "over the budget");
        assert!(!cache.can_allocate(6, 6, 5), "over the free slots");
        cache.allocate(&a);
        assert_eq!(cache.num_free(), 4);
        assert!(cache.take_freed().is_empty());
        assert_eq!(cache.take_freed(), ["a"]);
        assert!(cache.take_freed().is_empty());
        // Freed twice, counted twice (vLLM's arithmetic).
        cache.release_all(std::slice::from_ref(&a));
        cache.release_all(std::slice::from_ref(&a));
        assert_eq!(cache.num_free(), 16);
    }
}
