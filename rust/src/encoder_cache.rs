//! The encoder cache's bookkeeping (docs/scheduling.md §4.15; vLLM's
//! `EncoderCacheManager`): which encoder outputs the model runner holds, by
//! identifier, counted in embeddings against a fixed size. An entry lives
//! while a request references it; unreferenced, it stays (another request
//! with the same image reuses it) until space is needed, and then the
//! oldest unreferenced ones are evicted first. The runner is told which
//! entries went (`free_encoder_mm_hashes`).

use crate::multimodal::MultimodalInput;
use crate::slab::Slot;
use rustc_hash::FxHashMap;
use smallvec::SmallVec;
use std::collections::BTreeMap;

/// One cached encoder output.
#[derive(Debug)]
struct Entry {
    num_embeds: usize,
    /// The requests that reference it; empty: evictable.
    refs: SmallVec<[Slot; 2]>,
    /// Its place in the eviction order while unreferenced.
    freeable_at: Option<u64>,
}

/// The encoder cache of one scheduler.
#[derive(Debug, Default)]
pub struct EncoderCache {
    size: usize,
    num_free: usize,
    /// Free plus what evicting every unreferenced entry would free.
    num_freeable: usize,
    entries: FxHashMap<String, Entry>,
    /// Each request's inputs that hold a reference, ascending (vLLM walks a
    /// set of small ints, which iterates ascending for up to 8 inputs).
    held: FxHashMap<Slot, SmallVec<[u32; 4]>>,
    /// Unreferenced entries, oldest first.
    freeable: BTreeMap<u64, String>,
    next_freeable: u64,
    /// Evicted since last taken.
    freed: Vec<String>,
}

impl EncoderCache {
    /// A cache of `size` embeddings.
    pub fn new(size: usize) -> Self {
        EncoderCache {
            size,
            num_free: size,
            num_freeable: size,
            ..Default::default()
        }
    }

    /// Its size in embeddings.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Embeddings held by entries (referenced or not).
    pub fn num_used(&self) -> usize {
        self.size - self.num_free
    }

    /// The embeddings an entry for `identifier` holds, if there is one.
    pub fn cached_num_embeds(&self, identifier: &str) -> Option<usize> {
        self.entries.get(identifier).map(|e| e.num_embeds)
    }

    /// If input `id` of the request in `slot` is cached, reference it for
    /// the request and return true (vLLM's `check_and_update_cache`).
    pub fn reference_cached(&mut self, slot: Slot, inputs: &[MultimodalInput], id: u32) -> bool {
        let identifier = &inputs[id as usize].identifier;
        let Some(entry) = self.entries.get_mut(identifier) else {
            return false;
        };
        if let Some(at) = entry.freeable_at.take() {
            self.freeable.remove(&at);
            self.num_freeable -= entry.num_embeds;
        }
        if !entry.refs.contains(&slot) {
            entry.refs.push(slot);
        }
        self.hold(slot, id);
        true
    }

    /// Whether `num_embeds` more embeddings fit beside `num_scheduled`
    /// already scheduled this step, within `budget`; if they fit only by
    /// evicting, the oldest unreferenced entries are evicted now (vLLM's
    /// `can_allocate`).
    pub fn make_room(&mut self, num_embeds: usize, budget: usize, num_scheduled: usize) -> bool {
        if num_embeds > budget {
            return false;
        }
        let needed = num_embeds + num_scheduled;
        if needed <= self.num_free {
            return true;
        }
        if needed > self.num_freeable {
            return false;
        }
        while needed > self.num_free {
            let (_, identifier) = self
                .freeable
                .pop_first()
                .expect("freeable space is in unreferenced entries");
            let entry = self.entries.remove(&identifier).expect("a freeable entry");
            self.num_free += entry.num_embeds;
            self.freed.push(identifier);
        }
        true
    }

    /// Take space for input `id` of the request in `slot` and reference it
    /// (after [`Self::make_room`] said it fits).
    pub fn allocate(&mut self, slot: Slot, inputs: &[MultimodalInput], id: u32) {
        let input = &inputs[id as usize];
        let num_embeds = input.num_embeds();
        let entry = self
            .entries
            .entry(input.identifier.clone())
            .or_insert_with(|| Entry {
                num_embeds,
                refs: SmallVec::new(),
                freeable_at: None,
            });
        debug_assert_eq!(entry.num_embeds, num_embeds);
        if !entry.refs.contains(&slot) {
            entry.refs.push(slot);
        }
        assert!(self.num_free >= num_embeds && self.num_freeable >= num_embeds);
        self.num_free -= num_embeds;
        self.num_freeable -= num_embeds;
        self.hold(slot, id);
    }

    fn hold(&mut self, slot: Slot, id: u32) {
        let held = self.held.entry(slot).or_default();
        if let Err(at) = held.binary_search(&id) {
            held.insert(at, id);
        }
    }

    /// The request's inputs that hold a reference, ascending.
    pub fn held(&self, slot: Slot) -> &[u32] {
        self.held.get(&slot).map_or(&[], |h| h.as_slice())
    }

    /// Drop input `id`'s reference for the request in `slot`; the entry
    /// becomes evictable once no request (and no other input of this one
    /// with the same identifier) references it (vLLM's `free_encoder_input`).
    pub fn release(&mut self, slot: Slot, inputs: &[MultimodalInput], id: u32) {
        let identifier = &inputs[id as usize].identifier;
        let mut still_held = false;
        if let Some(held) = self.held.get_mut(&slot) {
            if let Ok(at) = held.binary_search(&id) {
                held.remove(at);
            }
            still_held = held
                .iter()
                .any(|&other| inputs[other as usize].identifier == *identifier);
            if held.is_empty() {
                self.held.remove(&slot);
            }
        }
        if still_held {
            return;
        }
        let Some(entry) = self.entries.get_mut(identifier) else {
            return;
        };
        if entry.refs.is_empty() {
            return;
        }
        entry.refs.retain(|s| *s != slot);
        if entry.refs.is_empty() {
            let at = self.next_freeable;
            self.next_freeable += 1;
            entry.freeable_at = Some(at);
            self.freeable.insert(at, identifier.clone());
            self.num_freeable += entry.num_embeds;
        }
    }

    /// Drop every reference of the request in `slot` (it finished, was
    /// preempted or could not be admitted).
    pub fn release_all(&mut self, slot: Slot, inputs: &[MultimodalInput]) {
        let held: SmallVec<[u32; 4]> = self.held(slot).into();
        for id in held {
            self.release(slot, inputs, id);
        }
    }

    /// The identifiers evicted since last taken and not cached again since
    /// (vLLM's `get_freed_mm_hashes`).
    pub fn take_freed(&mut self) -> Vec<String> {
        let mut freed = std::mem::take(&mut self.freed);
        freed.retain(|id| !self.entries.contains_key(id));
        freed
    }

    /// Embeddings free now, and free once every unreferenced entry is
    /// evicted (vLLM's `num_free_slots` and `num_freeable_slots`).
    pub fn num_free(&self) -> (usize, usize) {
        (self.num_free, self.num_freeable)
    }

    /// Every entry's identifier and the requests that reference it.
    pub fn entries(&self) -> impl Iterator<Item = (&str, &[Slot])> {
        self.entries
            .iter()
            .map(|(id, e)| (id.as_str(), e.refs.as_slice()))
    }

    /// The unreferenced entries, the next to be evicted first.
    pub fn eviction_order(&self) -> impl Iterator<Item = &str> {
        self.freeable.values().map(String::as_str)
    }

    /// Check the counts against the entries (tests).
    pub fn check_invariants(&self) -> Result<(), String> {
        let used: usize = self.entries.values().map(|e| e.num_embeds).sum();
        let unreferenced: usize = self
            .entries
            .values()
            .filter(|e| e.refs.is_empty())
            .map(|e| e.num_embeds)
            .sum();
        if used > self.size {
            return Err(format!(
                "{used} embeddings cached in a cache of {}",
                self.size
            ));
        }
        if self.num_free != self.size - used {
            return Err(format!("num_free {} but {used} used", self.num_free));
        }
        if self.num_freeable != self.num_free + unreferenced {
            return Err(format!(
                "num_freeable {} but {} free and {unreferenced} unreferenced",
                self.num_freeable, self.num_free
            ));
        }
        if self.freeable.len() != self.entries.values().filter(|e| e.refs.is_empty()).count() {
            return Err("the eviction order misses an unreferenced entry".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(identifier: &str, length: usize) -> MultimodalInput {
        MultimodalInput::new(0, length, identifier)
    }

    #[test]
    fn a_shared_entry_lives_while_any_request_holds_it() {
        let mut cache = EncoderCache::new(10);
        let a = [image("x", 6)];
        assert!(cache.make_room(6, 10, 0));
        cache.allocate(1, &a, 0);
        assert!(cache.reference_cached(2, &a, 0));
        cache.release_all(1, &a);
        // Request 2 still holds it: no room for another 6.
        assert!(!cache.make_room(6, 10, 0));
        cache.release_all(2, &a);
        assert!(cache.make_room(6, 10, 0));
        assert_eq!(cache.take_freed(), vec!["x".to_string()]);
        cache.check_invariants().unwrap();
    }

    #[test]
    fn eviction_takes_the_oldest_unreferenced_first() {
        let mut cache = EncoderCache::new(9);
        let inputs = [image("a", 3), image("b", 3), image("c", 3)];
        for id in 0..3 {
            assert!(cache.make_room(3, 9, 0));
            cache.allocate(7, &inputs, id);
        }
        cache.release(7, &inputs, 1);
        cache.release(7, &inputs, 0);
        assert!(cache.make_room(3, 9, 0));
        assert_eq!(cache.take_freed(), vec!["b".to_string()]);
        assert_eq!(cache.cached_num_embeds("a"), Some(3));
        cache.check_invariants().unwrap();
    }

    #[test]
    fn the_budget_and_the_scheduled_count() {
        let mut cache = EncoderCache::new(10);
        assert!(!cache.make_room(5, 4, 0), "over the compute budget");
        assert!(cache.make_room(5, 10, 5));
        assert!(
            !cache.make_room(5, 10, 6),
            "past the cache beside those scheduled"
        );
    }

    #[test]
    fn a_request_with_one_image_twice_keeps_it_until_both_are_released() {
        let mut cache = EncoderCache::new(10);
        let twice = [
            MultimodalInput::new(0, 4, "x"),
            MultimodalInput::new(8, 4, "x"),
        ];
        assert!(cache.make_room(4, 10, 0));
        cache.allocate(3, &twice, 0);
        assert!(cache.reference_cached(3, &twice, 1));
        cache.release(3, &twice, 0);
        assert!(!cache.make_room(7, 10, 0), "input 1 still holds it");
        cache.release(3, &twice, 1);
        assert!(cache.make_room(7, 10, 0));
        cache.check_invariants().unwrap();
    }
}
