"""Which encoder inputs a step runs (docs/scheduling.md §4.15; vLLM's
``_try_schedule_encoder_inputs``). An image's embeddings must be in the
encoder cache before the step that computes any of its placeholder tokens,
and the encoder runs an image whole (its attention is bidirectional). So a
request's tokens this step are cut just before the first image that does
not fit the step's encoder budget or the cache; with
``disable_chunked_mm_input``, also before an image the step would only
partly cover. An encoder-decoder model (§4.17) runs its encoder input
once, in the step that computes its first decoder token."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ironbatch.reference.ec_connector import SafeEcConnector
from ironbatch.reference.encoder_decoder_cache import EncoderDecoderCache
from ironbatch.reference.multimodal import MultimodalInput, inputs_in_window
from ironbatch.reference.request import Request
from ironbatch.reference.scheduler.ec_transfer import has_cache_item, notify_allocated

if TYPE_CHECKING:
    from ironbatch.reference.scheduler import EncoderStore, Scheduler, StepDraft


@dataclass
class EncoderPlan:
    """The encoder's share of one request's step."""

    #: Inputs the encoder runs for it (vLLM's ``scheduled_encoder_inputs``).
    scheduled: list[int] = field(default_factory=list)
    #: Inputs an encoder-cache connector supplies (§4.20): they take cache
    #: space, not encoder budget.
    external: list[int] = field(default_factory=list)
    #: Inputs whose identifier an earlier input of this step runs or loads
    #: already: they reference that entry.
    duplicates: list[int] = field(default_factory=list)
    #: Its tokens, after the cuts.
    num_tokens: int = 0
    #: Embeddings the scheduled inputs take from the step's budget.
    num_embeds: int = 0
    #: Embeddings the connector's inputs take in the cache.
    num_external_embeds: int = 0
    #: The step's encoder budget when planned: committing sets the budget to
    #: it less ``num_embeds`` (vLLM's ``new_encoder_compute_budget``), so a
    #: refund from a victim preempted meanwhile is lost, as in vLLM.
    budget_at_plan: int = 0


@dataclass
class ScheduledEncoderInputs:
    """A request's encoder inputs run this step."""

    slot: int
    #: Indices into its inputs, ascending.
    input_ids: list[int]


def plan_encoder_inputs(
    s: Scheduler, slot: int, computed: int, n: int, draft: StepDraft
) -> EncoderPlan:
    """Plan the encoder inputs of ``n`` tokens after ``computed`` for the
    request in ``slot``. Inputs the cache holds already are referenced now,
    and entries evicted to make room are gone, whether or not the request is
    scheduled (as in vLLM). An identifier the cache holds with another
    number of embeddings (a client reusing an id for other content)
    schedules nothing and ends the request with an error."""
    plan = EncoderPlan(num_tokens=n, budget_at_plan=draft.encoder_budget)
    inputs = s.requests[slot].mm_inputs
    encoder = s.config.encoder
    if encoder is None or n == 0 or not inputs:
        return plan
    shift = s.config.drafter_read_ahead
    window_end = computed + n + shift
    budget = draft.encoder_budget
    cache = s.encoder
    if isinstance(cache, EncoderDecoderCache):
        plan_cross_inputs(cache, inputs, computed, window_end, budget, plan)
        return plan
    for i in inputs_in_window(inputs, computed, window_end):
        m = inputs[i]
        num_embeds = m.num_embeds()
        if (
            encoder.disable_chunked_mm_input
            and computed <= m.offset
            and computed + plan.num_tokens < m.end()
        ):
            # Not split: stop before it (and before the drafter's read of its
            # first placeholder).
            plan.num_tokens = max(m.offset - (computed + shift), 0)
            break
        earlier = next(
            (j for j in plan.scheduled + plan.external if inputs[j].identifier == m.identifier),
            None,
        )
        if earlier is not None:
            if inputs[earlier].num_embeds() != num_embeds:
                return mismatch(slot, draft)
            plan.duplicates.append(i)
            continue
        cached = cache.cached_num_embeds(m.identifier)
        if cached is not None and cached != num_embeds:
            return mismatch(slot, draft)
        if cache.reference_cached(slot, inputs, i):
            continue
        if not cache.make_room(num_embeds, budget, plan.num_embeds + plan.num_external_embeds):
            # Its tokens wait for a step with room; a prefix hit past its
            # start leaves nothing to schedule before it.
            if computed < m.offset:
                plan.num_tokens = min(plan.num_tokens, m.offset - computed)
            else:
                plan.num_tokens = 0
            break
        start = max(computed - m.offset, 0)
        end = min(m.length, window_end - m.offset)
        lo, hi = m.embeds_in(start, end)
        if lo == hi:
            continue  # the step covers none of its embeddings
        if has_cache_item(s.ec_connector, m):
            plan.num_external_embeds += num_embeds
            plan.external.append(i)
            continue
        plan.num_embeds += num_embeds
        budget -= num_embeds
        plan.scheduled.append(i)
    return plan


def mismatch(slot: int, draft: StepDraft) -> EncoderPlan:
    """A cached identifier with another embedding count: nothing this step,
    and the caller ends the request (vLLM's ``encoder_cache_mismatch_reqs``)."""
    if slot not in draft.encoder_mismatch:
        draft.encoder_mismatch.append(slot)
    return EncoderPlan()


def commit_encoder_plan(s: Scheduler, slot: int, plan: EncoderPlan, draft: StepDraft) -> None:
    """Take cache space for a scheduled request's planned inputs and its
    budget from the step's."""
    if not plan.scheduled and not plan.external and not plan.duplicates:
        return
    r = s.requests[slot]
    inputs = r.mm_inputs
    cache = s.encoder
    if isinstance(cache, EncoderDecoderCache):
        for id in plan.scheduled:
            cache.allocate(inputs[id])
    else:
        # Those the encoder runs, then those the connector loads, each told
        # to the connector (vLLM's order).
        for id in plan.scheduled + plan.external:
            cache.allocate(slot, inputs, id)
        notify_allocated(s.ec_connector, r.request_id, plan.scheduled)
        notify_allocated(s.ec_connector, r.request_id, plan.external)
        for id in plan.duplicates:
            cache.reference_cached(slot, inputs, id)
    if plan.scheduled:
        draft.encoder_budget = plan.budget_at_plan - plan.num_embeds
        draft.encoder_inputs.append(ScheduledEncoderInputs(slot, list(plan.scheduled)))


def refund_encoder_inputs(s: Scheduler, victim: int, draft: StepDraft) -> None:
    """A victim scheduled earlier this step gives its encoder inputs' share
    of the budget back (the cache space stays taken until it frees)."""
    k = next((k for k, x in enumerate(draft.encoder_inputs) if x.slot == victim), None)
    if k is None:
        return
    taken = draft.encoder_inputs.pop(k)
    inputs = s.requests[victim].mm_inputs
    draft.encoder_budget += sum(inputs[id].num_embeds() for id in taken.input_ids)


def release_all_encoded(s: Scheduler, slot: int) -> None:
    """Drop every encoder-cache reference of the request in ``slot``."""
    inputs = s.requests[slot].mm_inputs
    if not inputs:
        return
    if isinstance(s.encoder, EncoderDecoderCache):
        s.encoder.release_all(inputs)
    else:
        s.encoder.release_all(slot, inputs)


def plan_cross_inputs(
    cache: EncoderDecoderCache,
    inputs: list[MultimodalInput],
    computed: int,
    window_end: int,
    budget: int,
    plan: EncoderPlan,
) -> None:
    """An encoder-decoder's plan (§4.17): every input is the encoder's, at
    position 0, run before the decoder's first token and never again once
    any token is computed; it is not shared by identifier and no rule keeps
    it whole in a chunk (each input is whole or waits)."""
    if computed > 0:
        return  # its cross-attention KV is written already
    hi = sum(1 for m in inputs if m.offset < window_end)
    for i, m in enumerate(inputs[:hi]):
        num_embeds = m.num_embeds()
        if not cache.can_allocate(num_embeds, budget, plan.num_embeds):
            # It sits at 0: no decoder token comes before it this step.
            plan.num_tokens = 0
            return
        lo, end = m.embeds_in(0, min(m.length, window_end - m.offset))
        if lo == end:
            continue
        plan.num_embeds += num_embeds
        budget -= num_embeds
        plan.scheduled.append(i)


def release_encoded(
    store: EncoderStore, connector: SafeEcConnector | None, slot: int, r: Request
) -> None:
    """After a step ran: release the inputs of request ``r`` (in ``slot``)
    whose placeholders are all computed: in its KV cache now, and past any
    draft that a rejection could roll back into (vLLM's
    ``_free_encoder_inputs``). An encoder-decoder's are released whenever
    it has a computed token, every step again (vLLM's arithmetic, §4.17)."""
    if not r.mm_inputs:
        return
    if isinstance(store, EncoderDecoderCache):
        if r.seq.num_computed_tokens > 0:
            store.release_all(r.mm_inputs)
        return
    cache = store
    done = max(r.seq.num_computed_tokens - r.num_output_placeholders, 0)
    for id in list(cache.held(slot)):
        if r.mm_inputs[id].end() <= done:
            cache.release(slot, r.mm_inputs, id)
            if connector is not None:
                connector.update_state_after_free(r.request_id, id)
