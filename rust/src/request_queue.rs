//! The waiting queue (docs/scheduling.md §3.3): a deque under FCFS, an ordered set under
//! priority. Entries are request slots.

use crate::request::Request;
use crate::slab::Slot;
use std::cmp::Ordering;
use std::collections::{BTreeSet, VecDeque};

/// The priority order: (priority, arrival_time, request_id), smallest first;
/// ids compare by code point (UTF-8 byte order is code-point order).
#[derive(Clone, Debug)]
pub struct PriorityKey {
    pub priority: i64,
    pub arrival_time: f64,
    pub request_id: String,
    pub slot: Slot,
}

impl PriorityKey {
    fn of(slot: Slot, r: &Request) -> Self {
        PriorityKey {
            priority: r.priority,
            arrival_time: r.arrival_time,
            request_id: r.request_id.clone(),
            slot,
        }
    }
}

impl PartialEq for PriorityKey {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for PriorityKey {}

impl PartialOrd for PriorityKey {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for PriorityKey {
    fn cmp(&self, other: &Self) -> Ordering {
        self.priority
            .cmp(&other.priority)
            .then(self.arrival_time.total_cmp(&other.arrival_time))
            .then_with(|| self.request_id.cmp(&other.request_id))
    }
}

/// Requests waiting to be admitted (again).
#[derive(Clone, Debug)]
pub enum WaitingQueue {
    /// Arrivals at the back; preempted and skipped requests at the front.
    Fcfs(VecDeque<Slot>),
    /// The smallest key first; a preempted request is simply inserted again.
    Priority(BTreeSet<PriorityKey>),
}

impl WaitingQueue {
    /// Number of waiting requests.
    pub fn len(&self) -> usize {
        match self {
            WaitingQueue::Fcfs(q) => q.len(),
            WaitingQueue::Priority(s) => s.len(),
        }
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Queue an arrival.
    pub fn add(&mut self, slot: Slot, r: &Request) {
        match self {
            WaitingQueue::Fcfs(q) => q.push_back(slot),
            WaitingQueue::Priority(s) => {
                s.insert(PriorityKey::of(slot, r));
            }
        }
    }

    /// Put a preempted or skipped request back: at the front under FCFS.
    pub fn prepend(&mut self, slot: Slot, r: &Request) {
        match self {
            WaitingQueue::Fcfs(q) => q.push_front(slot),
            WaitingQueue::Priority(s) => {
                s.insert(PriorityKey::of(slot, r));
            }
        }
    }

    /// The next request to admit.
    pub fn peek(&self) -> Option<Slot> {
        match self {
            WaitingQueue::Fcfs(q) => q.front().copied(),
            WaitingQueue::Priority(s) => s.first().map(|k| k.slot),
        }
    }

    /// Take the next request.
    pub fn pop(&mut self) -> Option<Slot> {
        match self {
            WaitingQueue::Fcfs(q) => q.pop_front(),
            WaitingQueue::Priority(s) => s.pop_first().map(|k| k.slot),
        }
    }

    /// Remove a request from anywhere.
    pub fn remove(&mut self, slot: Slot, r: &Request) {
        match self {
            WaitingQueue::Fcfs(q) => {
                if let Some(i) = q.iter().position(|&s| s == slot) {
                    q.remove(i);
                }
            }
            WaitingQueue::Priority(s) => {
                s.remove(&PriorityKey::of(slot, r));
            }
        }
    }

    /// The waiting slots in admission order.
    pub fn iter(&self) -> Box<dyn Iterator<Item = Slot> + '_> {
        match self {
            WaitingQueue::Fcfs(q) => Box::new(q.iter().copied()),
            WaitingQueue::Priority(s) => Box::new(s.iter().map(|k| k.slot)),
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
        let seq = Sequence::new(vec![1], None, &BlockHasher::with_key([0; 32]), 16);
        let new = NewRequest {
            request_id: id.into(),
            prompt_token_ids: vec![],
            stop,
            priority,
            arrival_time,
            cache_salt: None,
            skip_reading_prefix_cache: false,
            structured_output: false,
            report_hits: false,
        };
        Request::waiting(new, seq)
    }

    #[test]
    fn fcfs_takes_arrivals_in_order_and_preempted_ones_first() {
        let mut q = WaitingQueue::Fcfs(VecDeque::new());
        let r = request("x", 0, 0.0);
        q.add(0, &r);
        q.add(1, &r);
        q.prepend(2, &r); // preempted: ahead of every arrival
        assert_eq!(q.iter().collect::<Vec<_>>(), [2, 0, 1]);
        q.remove(0, &r);
        assert_eq!((q.pop(), q.pop(), q.pop()), (Some(2), Some(1), None));
    }

    #[test]
    fn priority_orders_by_priority_arrival_then_id() {
        let mut q = WaitingQueue::Priority(BTreeSet::new());
        let rs = [
            request("b", 1, 0.0),
            request("a", 1, 0.0), // same key but the id: "a" first
            request("c", 0, 5.0), // a lower priority value runs first
            request("d", 1, -0.0),
        ];
        for (slot, r) in rs.iter().enumerate() {
            q.add(slot as Slot, r);
        }
        // -0.0 arrived "at" 0.0 (Request::waiting adds 0.0): ordered by id.
        assert_eq!(q.iter().collect::<Vec<_>>(), [2, 1, 0, 3]);
        q.remove(1, &rs[1]);
        q.prepend(1, &rs[1]); // a preempted request just goes back in order
        assert_eq!(q.peek(), Some(2));
        assert_eq!(q.iter().collect::<Vec<_>>(), [2, 1, 0, 3]);
    }
}
