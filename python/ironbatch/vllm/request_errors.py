"""The requests a step ends with an error, as vLLM 0.33's
``update_from_output`` ends them: grammars that failed to compile, images
whose cached encoding holds other content, encoder outputs the
encoder-cache connector can no longer obtain, and loads that failed under
the "fail" policy. vLLM gathers them in one Python set after the step's
output and ends them in its iteration order, before finished KV transfers
settle; the order shapes the free queue. The drop-in gathers the first
three before the core's update, which ends them with the failed loads it
finds, asking ``end_order`` for vLLM's set order."""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vllm.v1.engine import EngineCoreOutput
from vllm.v1.request import RequestStatus

from ironbatch.vllm.engine_outputs import error_output
from ironbatch.vllm.request_mirror import RequestMirror

if TYPE_CHECKING:
    from vllm.v1.engine import RequestError

    from ironbatch.vllm.scheduler import Scheduler


@dataclass
class StepErrors:
    """The errors a step's update ends besides failed loads, each in the
    collection vLLM keeps it in (their iteration orders make its set's)."""

    #: Grammars that failed to compile, with the error each output carries.
    grammar: dict[str, RequestError] = field(default_factory=dict)
    #: Images whose cached encoding holds other content.
    mismatch: Set[str] = frozenset()
    #: Encoder outputs the encoder-cache connector can no longer obtain.
    unavailable: Set[str] = frozenset()

    def request_ids(self) -> list[str]:
        """The ids to end, for the core (it skips finished ones)."""
        return [*self.grammar, *self.mismatch, *self.unavailable]

    def end_order(
        self, whole: list[str], loading: list[str], running: list[str], requested: list[str]
    ) -> list[str]:
        """The order vLLM ends them in with the failed loads (the core's
        groups): its sets' iteration order, the sets built as it builds
        them (failed loads: whole failures, then the loading and the
        running requests with an invalid block; then the error set; then
        ``finish_requests``'s own copy, which skips finished requests)."""
        failed: set[str] = set()
        failed.update(set(whole))
        failed.update(set(loading) | set(running))
        error_req_ids = set(self.grammar)
        error_req_ids.update(self.mismatch)
        error_req_ids.update(failed)
        error_req_ids.update(self.unavailable)
        live = {*whole, *loading, *running, *requested}
        return [rid for rid in set(error_req_ids) if rid in live]


def take_step_errors(s: Scheduler) -> StepErrors:
    """The errors the next update ends, taken from where schedule() and the
    encoder-cache connector left them (and any a refused update gave back)."""
    unavailable = s.ec_connector.take_unavailable_requests() if s.ec_connector else frozenset()
    if s._unavailable_held:  # (only after a refused update: vLLM has none)
        unavailable = s._unavailable_held | set(unavailable)
        s._unavailable_held = set()
    mismatch = s._encoder.mismatch
    s._encoder.mismatch = set()  # (vLLM clears its set: a fresh one is alike)
    return StepErrors(s._structured.take_errors(), mismatch, unavailable)


def give_back_step_errors(s: Scheduler, errors: StepErrors) -> None:
    """An update was refused (nothing changed): its errors wait for the
    next one, none lost."""
    s._structured.errors = {**errors.grammar, **s._structured.errors}
    s._encoder.mismatch = set(errors.mismatch) | s._encoder.mismatch
    s._unavailable_held |= set(errors.unavailable)


def report_errors(
    s: Scheduler,
    update: Any,
    outputs: dict[int, list[EngineCoreOutput]],
    errors: StepErrors,
) -> None:
    """The requests the update ended with an error, each with its error
    output (a grammar's carries its error), in the order the core ended
    them; each Request as it ended (the step's tokens, computed count)."""
    for end in update.errored:
        rid = end.request_id
        r = s.requests[rid]
        RequestMirror.set_tokens(r, end.token_ids)
        r.num_computed_tokens = end.num_computed_tokens
        r.status = RequestStatus.FINISHED_ERROR
        s._forget(r)
        outputs[r.client_index].append(error_output(r, errors.grammar.get(rid)))
