//! The waiting queues (docs/scheduling.md §3.3): a deque under FCFS, a binary
//! heap under priority. Entries are request slots.
//!
//! The heap is CPython's `heapq`, operation for operation (push, pop,
//! heapify, the sift loops and the comparisons they make), over vLLM's
//! request order, read from the live requests. With fixed keys any heap pops
//! in sorted order; this one also matches vLLM when a key changes in place (a
//! streaming session's next chunk rewrites its arrival time while it waits),
//! which leaves the heap stale until vLLM's next heapify.

use crate::request::Request;
use crate::slab::{Slab, Slot};
use std::collections::VecDeque;

/// vLLM's `Request.__lt__`: (priority, arrival_time, request_id), smallest
/// first; ids compare by code point (UTF-8 byte order is code-point order).
fn less(requests: &Slab<Request>, a: Slot, b: Slot) -> bool {
    let (a, b) = (&requests[a], &requests[b]);
    if a.priority != b.priority {
        return a.priority < b.priority;
    }
    if a.arrival_time != b.arrival_time {
        return a.arrival_time < b.arrival_time;
    }
    a.request_id < b.request_id
}

/// `heapq._siftdown`: move the item at `pos` up towards `start`.
fn sift_down(heap: &mut [Slot], requests: &Slab<Request>, start: usize, mut pos: usize) {
    let item = heap[pos];
    while pos > start {
        let parent = (pos - 1) >> 1;
        if less(requests, item, heap[parent]) {
            heap[pos] = heap[parent];
            pos = parent;
            continue;
        }
        break;
    }
    heap[pos] = item;
}

/// `heapq._siftup`: move the smaller child up until a leaf, then the item
/// at `pos` down into place.
fn sift_up(heap: &mut [Slot], requests: &Slab<Request>, mut pos: usize) {
    let (end, start, item) = (heap.len(), pos, heap[pos]);
    let mut child = 2 * pos + 1;
    while child < end {
        let right = child + 1;
        if right < end && !less(requests, heap[child], heap[right]) {
            child = right;
        }
        heap[pos] = heap[child];
        pos = child;
        child = 2 * pos + 1;
    }
    heap[pos] = item;
    sift_down(heap, requests, start, pos);
}

/// `heapq.heapify`.
fn heapify(heap: &mut [Slot], requests: &Slab<Request>) {
    for i in (0..heap.len() / 2).rev() {
        sift_up(heap, requests, i);
    }
}

/// Requests waiting to be admitted (again).
#[derive(Clone, Debug)]
pub enum WaitingQueue {
    /// Arrivals at the back; preempted and skipped requests at the front.
    Fcfs(VecDeque<Slot>),
    /// A binary heap in vLLM's request order; preempted and skipped
    /// requests are pushed again.
    Priority(Vec<Slot>),
}

impl WaitingQueue {
    /// Number of waiting requests.
    pub fn len(&self) -> usize {
        match self {
            WaitingQueue::Fcfs(q) => q.len(),
            WaitingQueue::Priority(h) => h.len(),
        }
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Queue an arrival.
    pub fn add(&mut self, slot: Slot, requests: &Slab<Request>) {
        match self {
            WaitingQueue::Fcfs(q) => q.push_back(slot),
            WaitingQueue::Priority(h) => {
                h.push(slot);
                let last = h.len() - 1;
                sift_down(h, requests, 0, last);
            }
        }
    }

    /// Put a preempted or skipped request back: at the front under FCFS.
    pub fn prepend(&mut self, slot: Slot, requests: &Slab<Request>) {
        match self {
            WaitingQueue::Fcfs(q) => q.push_front(slot),
            WaitingQueue::Priority(_) => self.add(slot, requests),
        }
    }

    /// The next request to admit.
    pub fn peek(&self) -> Option<Slot> {
        match self {
            WaitingQueue::Fcfs(q) => q.front().copied(),
            WaitingQueue::Priority(h) => h.first().copied(),
        }
    }

    /// Take the next request.
    pub fn pop(&mut self, requests: &Slab<Request>) -> Option<Slot> {
        match self {
            WaitingQueue::Fcfs(q) => q.pop_front(),
            WaitingQueue::Priority(h) => {
                let last = h.pop()?;
                if h.is_empty() {
                    return Some(last);
                }
                let first = std::mem::replace(&mut h[0], last);
                sift_up(h, requests, 0);
                Some(first)
            }
        }
    }

    /// Remove every request `gone` names, the others keeping their order
    /// (vLLM's `remove_requests`: a filter, then a heapify under priority,
    /// which also repairs keys changed in place). `gone` may name freed
    /// slots; only the remaining requests are read.
    pub fn remove_all(&mut self, gone: impl Fn(Slot) -> bool, requests: &Slab<Request>) {
        match self {
            WaitingQueue::Fcfs(q) => q.retain(|&s| !gone(s)),
            WaitingQueue::Priority(h) => {
                h.retain(|&s| !gone(s));
                heapify(h, requests);
            }
        }
    }

    /// The waiting slots in admission order (under priority, popped from a
    /// copy, as vLLM iterates its heap).
    pub fn iter<'a>(&'a self, requests: &'a Slab<Request>) -> Box<dyn Iterator<Item = Slot> + 'a> {
        match self {
            WaitingQueue::Fcfs(q) => Box::new(q.iter().copied()),
            WaitingQueue::Priority(h) => {
                let mut copy = WaitingQueue::Priority(h.clone());
                Box::new(std::iter::from_fn(move || copy.pop(requests)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block_hash::BlockHasher;
    use crate::request::{NewRequest, StopRules};
    use crate::sequence::Sequence;

    fn request(id: &str, priority: i64, arrival_time: f64) -> Request {
        let stop = StopRules {
            max_tokens: 1,
            min_tokens: 0,
            eos_token_id: None,
            stop_token_ids: vec![],
            repetition: None,
        };
        let seq = Sequence::new(vec![1], &[], &BlockHasher::with_key([0; 32]), 16);
        let new = NewRequest {
            request_id: id.into(),
            prompt_token_ids: vec![],
            stop,
            priority,
            arrival_time,
            cache_salt: None,
            lora: None,
            mm_inputs: Vec::new(),
            prompt_embeds_digests: None,
            skip_reading_prefix_cache: false,
            structured_output: false,
            report_hits: false,
            resumable: false,
        };
        Request::waiting(new, seq, 1)
    }

    fn slab(rs: Vec<Request>) -> Slab<Request> {
        let mut slab = Slab::default();
        for r in rs {
            slab.insert(r);
        }
        slab
    }

    #[test]
    fn fcfs_takes_arrivals_in_order_and_preempted_ones_first() {
        let requests = slab((0..3).map(|i| request(&i.to_string(), 0, 0.0)).collect());
        let mut q = WaitingQueue::Fcfs(VecDeque::new());
        q.add(0, &requests);
        q.add(1, &requests);
        q.prepend(2, &requests); // preempted: ahead of every arrival
        assert_eq!(q.iter(&requests).collect::<Vec<_>>(), [2, 0, 1]);
        q.remove_all(|s| s == 0, &requests);
        let popped: Vec<_> = std::iter::from_fn(|| q.pop(&requests)).collect();
        assert_eq!(popped, [2, 1]);
    }

    #[test]
    fn priority_orders_by_priority_arrival_then_id() {
        let requests = slab(vec![
            request("b", 1, 0.0),
            request("a", 1, 0.0), // same key but the id: "a" first
            request("c", 0, 5.0), // a lower priority value runs first
            request("d", 1, -0.0),
        ]);
        let mut q = WaitingQueue::Priority(Vec::new());
        for slot in 0..4 {
            q.add(slot, &requests);
        }
        // -0.0 arrived "at" 0.0 (Request::waiting adds 0.0): ordered by id.
        assert_eq!(q.iter(&requests).collect::<Vec<_>>(), [2, 1, 0, 3]);
        q.remove_all(|s| s == 1, &requests);
        q.prepend(1, &requests); // a preempted request just goes back in order
        assert_eq!(q.peek(), Some(2));
        assert_eq!(q.iter(&requests).collect::<Vec<_>>(), [2, 1, 0, 3]);
    }

    #[test]
    fn a_key_changed_in_place_leaves_the_heap_as_heapq_leaves_it() {
        // Arrivals 1..=5; then request 0's arrival becomes 9 while queued.
        let mut requests = slab(
            (0..5)
                .map(|i| request(&i.to_string(), 0, i as f64))
                .collect(),
        );
        let mut q = WaitingQueue::Priority(Vec::new());
        for slot in 0..5 {
            q.add(slot, &requests);
        }
        requests[0].arrival_time = 9.0;
        // CPython: heappop keeps returning heap[0] first, then sifts by the
        // new key: [0, 1, 2, 3, 4] pops as 0, 1, 2, 3, 4.
        let mut stale = q.clone();
        let popped: Vec<_> = std::iter::from_fn(|| stale.pop(&requests)).collect();
        assert_eq!(popped, [0, 1, 2, 3, 4]);
        // A heapify (vLLM's remove_requests) repairs it: 0 goes last.
        q.remove_all(|_| false, &requests);
        let popped: Vec<_> = std::iter::from_fn(|| q.pop(&requests)).collect();
        assert_eq!(popped, [1, 2, 3, 4, 0]);
    }
}
