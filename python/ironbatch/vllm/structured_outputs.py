"""The drop-in's side of vLLM's structured outputs (docs/scheduling.md
§4.10). vLLM's ``StructuredOutputManager`` compiles, masks and advances the
grammars, so they are vLLM's own; the core holds a request until its grammar
has compiled and ends it when the grammar rejects its tokens. This class is
the hand-off between the two: which grammars the core has not heard about
yet, the compile errors a waiting pass reached, the accept hook the core
calls inside its update, and the step's bitmask."""

from __future__ import annotations

import logging
from typing import Any

from vllm.outputs import RequestError
from vllm.v1.core.sched.output import GrammarOutput, SchedulerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output.utils import strip_speculative_padding

logger = logging.getLogger("ironbatch.vllm")


class StructuredOutputs:
    """Grammar state of the drop-in's structured-output requests.
    ``requests`` is the scheduler's own dict of live requests (shared)."""

    def __init__(self, manager: Any, requests: dict[str, Request]) -> None:
        self.manager = manager
        self.requests = requests
        # Live structured-output requests, and those whose grammar the core
        # has not been told about yet.
        self.live: set[str] = set()
        self.compiling: dict[str, Request] = {}
        # Compile errors a waiting pass reached: ended by the next update,
        # as vLLM's grammar_compile_error_reqs are.
        self.errors: dict[str, RequestError] = {}
        # Requests whose tokens fell out of step with the core (never
        # expected); resynced after the update.
        self.out_of_step: set[str] = set()

    def track(self, request: Request) -> None:
        self.live.add(request.request_id)
        self.compiling[request.request_id] = request

    def forget(self, request_id: str) -> None:
        self.live.discard(request_id)
        self.compiling.pop(request_id, None)

    def report_compiled(self, core: Any) -> None:
        """Tell the core which grammars have finished compiling. vLLM reads
        a grammar's Future when a waiting pass reaches the request; the core
        applies the news at that same point, so reading it just before the
        pass decides alike (bar a compile finishing within this call)."""
        for rid, r in list(self.compiling.items()):
            grammar = r.structured_output_request.grammar  # None while compiling
            if grammar is not None:
                core.report_grammar(rid, not isinstance(grammar, Exception))
                del self.compiling[rid]

    def note_failed(self, request_id: str) -> None:
        """A waiting pass reached a request whose grammar failed to compile."""
        grammar = self.requests[request_id].structured_output_request.grammar
        self.errors[request_id] = RequestError(
            code="validation_error", message=f"Invalid structured outputs: {grammar}"
        )

    def take_errors(self) -> dict[str, RequestError]:
        errors, self.errors = self.errors, {}
        return errors

    def accept(self, rid: str, kept: list[int], num_tokens: int) -> bool:
        """The core asks, mid-update, whether a structured-output request's
        grammar takes the tokens it kept. They are appended to the Request
        first (reasoning parsers read ``all_token_ids``): such a Request's
        tokens are kept current, since every token it gets passes here."""
        r = self.requests[rid]
        r._all_token_ids.extend(kept)
        r._output_token_ids.extend(kept)
        if len(r._all_token_ids) != num_tokens:
            logger.error("request %s: tokens out of step with the core", rid)
            self.out_of_step.add(rid)
        try:
            if self.manager.accept_tokens(r, kept):
                return True
            logger.error(
                "Unexpected: grammar rejected tokens %s for request %s. Terminating request.",
                kept,
                rid,
            )
        except Exception:
            logger.exception("request %s: the grammar failed on tokens %s; ending it", rid, kept)
        r.resumable = False
        return False

    def bitmask(self, step: Any, scheduler_output: SchedulerOutput) -> GrammarOutput | None:
        """The grammar masks of the structured-output requests that sample
        in ``step``, in scheduling order; None when there are none. Requests
        that finished since the step was scheduled drop out, as in vLLM."""
        samples = step.column("samples").tolist()
        requests = self.requests
        ids = [
            rid
            for rid, sampling in zip(step.req_ids, samples, strict=True)
            if sampling and (r := requests.get(rid)) is not None and r.use_structured_output
        ]
        if not ids:
            return None
        drafts = scheduler_output.scheduled_spec_decode_tokens
        bitmask = self.manager.grammar_bitmask(requests, ids, drafts)
        # How many of each request's drafts the grammar may accept (up to a
        # placeholder), as vLLM tells the sampler.
        acceptable = [len(strip_speculative_padding(drafts.get(rid, []))) for rid in ids]
        return GrammarOutput(ids, bitmask, acceptable)

    def validate_drafts(self, request: Request, drafts: list[int]) -> list[int]:
        """The longest prefix of a structured-output request's drafts its
        grammar accepts (vLLM's ``validate_tokens``); others' unchanged."""
        return self.manager.validate_tokens(request, drafts)
