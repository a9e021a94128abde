//! The free-block queue (docs/scheduling.md §7.2): an intrusive doubly-linked list threaded
//! through block indices, so every operation is O(1) per block and nothing
//! is allocated after construction.
//!
//! The head is the next block to be reused (and, if it is cached, evicted).
//! Links live in two index arrays; slots `n` and `n + 1` are the head and
//! tail sentinels, and a block outside the queue has both links `DETACHED`.

use crate::block::BlockId;

const DETACHED: u32 = u32::MAX;

/// Free blocks in reuse order, head first.
#[derive(Clone, Debug)]
pub struct FreeBlockQueue {
    next: Vec<u32>,
    prev: Vec<u32>,
    len: usize,
}

impl FreeBlockQueue {
    /// A queue holding blocks `0..num_blocks` in ascending order from the head.
    ///
    /// # Panics
    /// If `num_blocks` does not leave room for the two sentinel indices
    /// below `u32::MAX` (callers validate sizes first).
    pub fn new(num_blocks: usize) -> Self {
        assert!(num_blocks < (DETACHED - 2) as usize, "too many blocks");
        let n = num_blocks as u32;
        let (head, tail) = (n, n + 1);
        let mut next = vec![DETACHED; num_blocks + 2];
        let mut prev = vec![DETACHED; num_blocks + 2];
        // head -> 0 -> 1 -> ... -> n-1 -> tail
        let mut last = head;
        for b in 0..n {
            next[last as usize] = b;
            prev[b as usize] = last;
            last = b;
        }
        next[last as usize] = tail;
        prev[tail as usize] = last;
        FreeBlockQueue {
            next,
            prev,
            len: num_blocks,
        }
    }

    fn head(&self) -> u32 {
        (self.next.len() - 2) as u32
    }

    fn tail(&self) -> u32 {
        (self.next.len() - 1) as u32
    }

    /// Number of blocks in the queue.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the queue holds no block.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether `block` is in the queue.
    pub fn contains(&self, block: BlockId) -> bool {
        self.next[block as usize] != DETACHED
    }

    /// Take the head block, if any.
    pub fn popleft(&mut self) -> Option<BlockId> {
        let first = self.next[self.head() as usize];
        if first == self.tail() {
            return None;
        }
        self.remove(first);
        Some(first)
    }

    /// Take `n` blocks from the head, appending them to `out` in queue order.
    ///
    /// # Panics
    /// If fewer than `n` blocks are free (callers check `len()` first).
    pub fn popleft_n(&mut self, n: usize, out: &mut Vec<BlockId>) {
        assert!(n <= self.len, "popleft_n({n}) with only {} free", self.len);
        out.reserve(n);
        let head = self.head();
        let mut cur = self.next[head as usize];
        for _ in 0..n {
            out.push(cur);
            let nxt = self.next[cur as usize];
            self.next[cur as usize] = DETACHED;
            self.prev[cur as usize] = DETACHED;
            cur = nxt;
        }
        self.next[head as usize] = cur;
        self.prev[cur as usize] = head;
        self.len -= n;
    }

    /// Unlink `block` from wherever it is.
    ///
    /// # Panics
    /// If `block` is not in the queue.
    pub fn remove(&mut self, block: BlockId) {
        let (p, n) = (self.prev[block as usize], self.next[block as usize]);
        assert!(n != DETACHED, "block {block} is not in the free queue");
        self.next[p as usize] = n;
        self.prev[n as usize] = p;
        self.next[block as usize] = DETACHED;
        self.prev[block as usize] = DETACHED;
        self.len -= 1;
    }

    fn link_after(&mut self, at: u32, block: BlockId) {
        debug_assert!(!self.contains(block), "block {block} is already queued");
        let n = self.next[at as usize];
        self.next[at as usize] = block;
        self.prev[block as usize] = at;
        self.next[block as usize] = n;
        self.prev[n as usize] = block;
        self.len += 1;
    }

    /// Link `block` at the tail.
    pub fn append(&mut self, block: BlockId) {
        let last = self.prev[self.tail() as usize];
        self.link_after(last, block);
    }

    /// Link `blocks` at the tail, in order.
    pub fn append_n(&mut self, blocks: &[BlockId]) {
        for &b in blocks {
            self.append(b);
        }
    }

    /// Link `blocks` at the head, in order: `blocks[0]` becomes the new head.
    pub fn prepend_n(&mut self, blocks: &[BlockId]) {
        for &b in blocks.iter().rev() {
            self.link_after(self.head(), b);
        }
    }

    /// The queued blocks from head to tail.
    pub fn iter(&self) -> impl Iterator<Item = BlockId> + '_ {
        let tail = self.tail();
        let mut cur = self.next[self.head() as usize];
        std::iter::from_fn(move || {
            if cur == tail {
                return None;
            }
            let b = cur;
            cur = self.next[cur as usize];
            Some(b)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::VecDeque;

    fn order(q: &FreeBlockQueue) -> Vec<u32> {
        q.iter().collect()
    }

    #[test]
    fn starts_ascending_and_pops_from_head() {
        let mut q = FreeBlockQueue::new(5);
        assert_eq!(order(&q), vec![0, 1, 2, 3, 4]);
        assert_eq!(q.popleft(), Some(0));
        let mut out = vec![];
        q.popleft_n(2, &mut out);
        assert_eq!(out, vec![1, 2]);
        assert_eq!(order(&q), vec![3, 4]);
        assert_eq!(q.len(), 2);
    }

    #[test]
    fn prepend_puts_first_element_at_head() {
        let mut q = FreeBlockQueue::new(6);
        let mut out = vec![];
        q.popleft_n(4, &mut out);
        q.prepend_n(&[3, 1]);
        q.append_n(&[2, 0]);
        assert_eq!(order(&q), vec![3, 1, 4, 5, 2, 0]);
        q.remove(4);
        q.remove(0);
        assert_eq!(order(&q), vec![3, 1, 5, 2]);
        assert!(!q.contains(4) && q.contains(5));
    }

    #[test]
    fn empty_queue() {
        let mut q = FreeBlockQueue::new(1);
        assert_eq!(q.popleft(), Some(0));
        assert_eq!(q.popleft(), None);
        assert!(q.is_empty());
        q.prepend_n(&[0]);
        assert_eq!(order(&q), vec![0]);
    }

    #[derive(Debug, Clone)]
    enum Op {
        PopN(usize),
        Remove(usize),
        Append(usize),
        Prepend(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0usize..4).prop_map(Op::PopN),
            (0usize..64).prop_map(Op::Remove),
            (0usize..4).prop_map(Op::Append),
            (0usize..4).prop_map(Op::Prepend),
        ]
    }

    proptest! {
        /// The linked list behaves like a VecDeque model under any sequence
        /// of operations.
        #[test]
        fn matches_a_deque_model(ops in prop::collection::vec(op(), 0..200)) {
            let n = 16usize;
            let mut q = FreeBlockQueue::new(n);
            let mut model: VecDeque<u32> = (0..n as u32).collect();
            let mut out_of_queue: Vec<u32> = vec![];
            for op in ops {
                match op {
                    Op::PopN(k) => {
                        let k = k.min(model.len());
                        let mut out = vec![];
                        q.popleft_n(k, &mut out);
                        let expect: Vec<u32> = model.drain(..k).collect();
                        prop_assert_eq!(&out, &expect);
                        out_of_queue.extend(out);
                    }
                    Op::Remove(i) => {
                        if !model.is_empty() {
                            let b = model.remove(i % model.len()).unwrap();
                            q.remove(b);
                            out_of_queue.push(b);
                        }
                    }
                    Op::Append(k) | Op::Prepend(k) => {
                        let k = k.min(out_of_queue.len());
                        let blocks: Vec<u32> = out_of_queue.drain(..k).collect();
                        if matches!(op, Op::Append(_)) {
                            q.append_n(&blocks);
                            model.extend(blocks.iter().copied());
                        } else {
                            q.prepend_n(&blocks);
                            for &b in blocks.iter().rev() { model.push_front(b); }
                        }
                    }
                }
                prop_assert_eq!(order(&q), model.iter().copied().collect::<Vec<_>>());
                prop_assert_eq!(q.len(), model.len());
                for &b in &out_of_queue { prop_assert!(!q.contains(b)); }
            }
        }
    }
}
