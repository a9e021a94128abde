"""When prefills wait (docs/scheduling.md §4.11): vLLM holds prefill work back
on some steps so decodes run in longer uninterrupted stretches, either because
a data-parallel engine says so (``throttle_prefills``, in step with the other
ranks) or on a local cadence (``prefill_schedule_interval`` executed steps
between prefill-carrying steps). Both stop holding once a releasing step could
not drain the waiting queue, or a backed-up engine would cap its prefill at
one budget per interval."""

from __future__ import annotations

from collections.abc import Callable


class PrefillCadence:
    """The cadence's state across steps."""

    def __init__(self, interval: int) -> None:
        #: Executed steps from one prefill-carrying step to the next; 1 is off.
        self.interval = interval
        #: The last step that did not hold prefills left requests waiting
        #: (other than skipped ones): holding stops while this is so.
        self.capacity_bound = False
        #: The executed step that last carried prefill work (a full interval
        #: back at first, so the first step is never held).
        self.last_prefill_step = -interval
        #: Steps that scheduled any token.
        self.num_executed_steps = 0

    def holds(self, throttle: bool, any_decoding: Callable[[], bool]) -> bool:
        """Whether this step holds prefills: asked by the engine
        (``throttle``) or due to the local cadence, and only while some
        running request decodes and the queue drained last time.
        ``any_decoding`` is asked last, only when the answer hangs on it: it
        is a pass over every running request."""
        if self.capacity_bound:
            return False
        # This call becomes executed step num_executed_steps + 1 if it
        # schedules anything.
        since = self.num_executed_steps + 1 - self.last_prefill_step
        return (throttle or (self.interval > 1 and since < self.interval)) and any_decoding()

    def note_release(self, num_waiting: int, num_skipped: int) -> None:
        """After a waiting pass of a step that did not hold prefills: whether
        it left requests waiting beyond those it skipped."""
        self.capacity_bound = num_waiting > num_skipped

    def note_step(self, scheduled_any: bool, carried_prefill: bool) -> None:
        """At the end of a step: count it if it scheduled anything, and
        restart the interval if it carried prefill work."""
        if scheduled_any:
            self.num_executed_steps += 1
        if self.interval > 1 and carried_prefill:
            self.last_prefill_step = self.num_executed_steps
