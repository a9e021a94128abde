//! Live values in small, stable slots. A slot is a value's row while it
//! lives (a model runner keeps per-request state by it); freed slots are
//! reused last-freed first. Each slot has a generation that changes when its
//! value is removed, so a reference taken earlier (a step's entry) can tell
//! whether the slot still holds the same value.

use std::ops::{Index, IndexMut};

/// A slot: the row of a live value.
pub type Slot = u32;

/// Values by slot, with generations.
#[derive(Clone, Debug)]
pub struct Slab<T> {
    values: Vec<Option<T>>,
    generations: Vec<u32>,
    free: Vec<Slot>,
    len: usize,
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Slab {
            values: Vec::new(),
            generations: Vec::new(),
            free: Vec::new(),
            len: 0,
        }
    }
}

impl<T> Slab<T> {
    /// Store `value` in the last freed slot, or a new one.
    pub fn insert(&mut self, value: T) -> Slot {
        self.len += 1;
        match self.free.pop() {
            Some(slot) => {
                self.values[slot as usize] = Some(value);
                slot
            }
            None => {
                self.values.push(Some(value));
                self.generations.push(0);
                (self.values.len() - 1) as Slot
            }
        }
    }

    /// Take the value out of `slot`, freeing the slot and changing its
    /// generation. Panics if the slot holds nothing (a broken invariant).
    pub fn remove(&mut self, slot: Slot) -> T {
        let value = self.values[slot as usize].take().expect("a live slot");
        let generation = &mut self.generations[slot as usize];
        *generation = generation.wrapping_add(1);
        self.free.push(slot);
        self.len -= 1;
        value
    }

    /// The value in `slot`, if it holds one.
    pub fn get(&self, slot: Slot) -> Option<&T> {
        self.values.get(slot as usize)?.as_ref()
    }

    /// The value in `slot`, if it holds one.
    pub fn get_mut(&mut self, slot: Slot) -> Option<&mut T> {
        self.values.get_mut(slot as usize)?.as_mut()
    }

    /// The slot's current generation.
    pub fn generation(&self, slot: Slot) -> u32 {
        self.generations[slot as usize]
    }

    /// Whether `slot` still holds the value it held at `generation`.
    pub fn holds(&self, slot: Slot, generation: u32) -> bool {
        self.generations.get(slot as usize) == Some(&generation) && self.get(slot).is_some()
    }

    /// Live values.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no value is live.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// `slab[slot]`: the live value in `slot`. Panics if the slot holds
/// nothing, which only a broken invariant can cause.
impl<T> Index<Slot> for Slab<T> {
    type Output = T;

    fn index(&self, slot: Slot) -> &T {
        self.values[slot as usize].as_ref().expect("a live slot")
    }
}

impl<T> IndexMut<Slot> for Slab<T> {
    fn index_mut(&mut self, slot: Slot) -> &mut T {
        self.values[slot as usize].as_mut().expect("a live slot")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_reused_last_freed_first_with_new_generations() {
        let mut slab = Slab::default();
        let (a, b, c) = (slab.insert("a"), slab.insert("b"), slab.insert("c"));
        assert_eq!((a, b, c), (0, 1, 2));
        let old = slab.generation(b);
        assert_eq!(slab.remove(b), "b");
        slab.remove(a);
        assert!(!slab.holds(b, old));
        assert_eq!(slab.insert("d"), a); // last freed first
        assert_eq!(slab.insert("e"), b);
        assert!(!slab.holds(b, old)); // same slot, another value
        assert!(slab.holds(b, slab.generation(b)));
        assert_eq!((slab[b], slab.len()), ("e", 3));
        assert_eq!(slab.get(7), None);
    }
}
