"""The requests a step's update ends with an error (docs/scheduling.md
§4.19): those a failed KV load ends under the "fail" policy, and those the
caller names (a grammar that did not compile, an image whose cached
encoding holds other content, an encoder output the encoder-cache connector
can no longer obtain). vLLM 0.33 ends them all at once, after the step's
output and before finished KV transfers settle, in the iteration order of
the one Python set it gathers them in; the order decides the free queue,
so it is the caller's to give."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ironbatch.reference.request import RequestStatus
from ironbatch.reference.step import ErroredRequest, UpdateOutput

if TYPE_CHECKING:
    from ironbatch.reference.scheduler import Scheduler
    from ironbatch.reference.scheduler.kv_load_failure import FailedLoads


@dataclass
class ErrorGroups:
    """The requests an update ends with an error, as each source found
    them, in its order (a request may be in more than one). A caller in
    vLLM's process rebuilds vLLM's set from these, and so its order."""

    #: Loads reported failed whole, in the report's order.
    whole: list[int] = field(default_factory=list)
    #: Loading requests with an invalid block, in queue order.
    loading: list[int] = field(default_factory=list)
    #: Running requests with an invalid block, in running order.
    running: list[int] = field(default_factory=list)
    #: The caller's, still live after the output, in the caller's order.
    requested: list[int] = field(default_factory=list)


#: Orders the requests an update ends with an error: a permutation of
#: them; anything else keeps the order found.
EndOrder = Callable[[ErrorGroups], list[int]]


@dataclass
class RequestErrors:
    """What the caller ends with an error after a step's output, and how
    the whole error set is ordered."""

    #: Request ids, in the caller's order; unknown ones and those already
    #: finished (this step's stops among them) are skipped, as vLLM's
    #: ``finish_requests`` skips them.
    request_ids: Sequence[str] = ()
    order: EndOrder | None = None


#: No errors of the caller's; failed loads end in the order found.
NO_ERRORS = RequestErrors()


def end_with_errors(
    s: Scheduler, out: UpdateOutput, failed: FailedLoads, errors: RequestErrors
) -> None:
    """End the failed loads' requests and the caller's with an error, in
    one order: found order (failed loads first), or ``errors.order``'s."""
    ends = list(failed.ended)
    groups = failed.groups
    for rid in errors.request_ids:
        slot = s.ids.get(rid)
        if slot is None:
            continue
        if s.requests[slot].status.is_finished or slot in groups.requested:
            continue
        groups.requested.append(slot)
        if slot not in ends:
            ends.append(slot)
    if not ends:
        return
    if errors.order is not None:
        ordered = errors.order(groups)
        if sorted(ordered) == sorted(ends):
            ends = list(ordered)
    out.errored = [
        ErroredRequest(
            slot,
            s.requests[slot].request_id,
            list(s.requests[slot].seq.tokens),
            s.requests[slot].seq.num_computed_tokens,
        )
        for slot in ends
    ]
    s.finish_requests([e.request_id for e in out.errored], RequestStatus.FINISHED_ERROR)
