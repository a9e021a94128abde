//! When prefills wait (docs/scheduling.md §4.11): vLLM holds prefill work back
//! on some steps so decodes run in longer uninterrupted stretches, either
//! because a data-parallel engine says so (`throttle_prefills`, in step with
//! the other ranks) or on a local cadence (`prefill_schedule_interval`
//! executed steps between prefill-carrying steps). Both stop holding once a
//! releasing step could not drain the waiting queue, or a backed-up engine
//! would cap its prefill at one budget per interval.

/// The cadence's state across steps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrefillCadence {
    /// Executed steps from one prefill-carrying step to the next; 1 is off.
    interval: usize,
    /// The last step that did not hold prefills left requests waiting
    /// (other than skipped ones): holding stops while this is so.
    capacity_bound: bool,
    /// The executed step that last carried prefill work (a full interval
    /// back at first, so the first step is never held).
    last_prefill_step: i64,
    /// Steps that scheduled any token.
    num_executed_steps: i64,
}

impl PrefillCadence {
    /// A cadence of `interval` executed steps (1: no local cadence).
    pub fn new(interval: usize) -> Self {
        PrefillCadence {
            interval,
            capacity_bound: false,
            last_prefill_step: -(interval as i64),
            num_executed_steps: 0,
        }
    }

    /// Whether this step holds prefills: asked by the engine (`throttle`) or
    /// due to the local cadence, and only while some running request decodes
    /// (there is decode work to fill the step) and the queue drained last
    /// time. `any_decoding` is asked last, only when the answer hangs on
    /// it: it is a pass over every running request.
    pub fn holds(&self, throttle: bool, any_decoding: impl FnOnce() -> bool) -> bool {
        if self.capacity_bound {
            return false;
        }
        // This call becomes executed step `num_executed_steps + 1` if it
        // schedules anything.
        let since = self.num_executed_steps + 1 - self.last_prefill_step;
        (throttle || (self.interval > 1 && since < self.interval as i64)) && any_decoding()
    }

    /// After a waiting pass of a step that did not hold prefills: whether it
    /// left requests waiting beyond those it skipped.
    pub fn note_release(&mut self, num_waiting: usize, num_skipped: usize) {
        self.capacity_bound = num_waiting > num_skipped;
    }

    /// At the end of a step: count it if it scheduled anything, and restart
    /// the interval if it carried prefill work.
    pub fn note_step(&mut self, scheduled_any: bool, carried_prefill: bool) {
        if scheduled_any {
            self.num_executed_steps += 1;
        }
        if self.interval > 1 && carried_prefill {
            self.last_prefill_step = self.num_executed_steps;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_local_cadence_holds_between_prefill_steps() {
        let mut c = PrefillCadence::new(3);
        assert!(!c.holds(false, || true)); // the first step is never held
        c.note_step(true, true); // step 1 carried prefill
        assert!(c.holds(false, || true)); // step 2: 1 since
        assert!(!c.holds(false, || false)); // nothing decodes: no reason to hold
        c.note_step(true, false);
        assert!(c.holds(false, || true)); // step 3: 2 since
        c.note_step(true, false);
        assert!(!c.holds(false, || true)); // step 4: 3 since, released
        c.note_release(5, 1); // the release left 4 waiting: capacity-bound
        assert!(!c.holds(true, || true)); // no holding, even when the engine asks
        c.note_release(1, 1);
        assert!(c.holds(true, || true));
    }

    #[test]
    fn without_a_cadence_only_the_engine_holds() {
        let c = PrefillCadence::new(1);
        assert!(!c.holds(false, || true));
        assert!(c.holds(true, || true));
        // Nothing hangs on whether anyone decodes: the pass is not made.
        assert!(!c.holds(false, || unreachable!("asked needlessly")));
    }
}
