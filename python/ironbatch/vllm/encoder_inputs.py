"""What a step's ``SchedulerOutput`` tells the model runner about encoder
inputs beyond the core's ``scheduled_encoder_inputs`` and
``free_encoder_mm_hashes`` (docs/scheduling.md §4.15): model runner V2's
``encoder_input_updates`` (an item's data sent again to a running request
that rewound into it; ``None`` once the worker may drop it), and the
requests to end because an identifier came back with other content. Only requests
with multimodal inputs cost anything here."""

from __future__ import annotations

import itertools
from typing import Any

from vllm.v1.core.sched.output import NewRequestData, ScheduledEncoderInputStats

from ironbatch import _core


def _sendable(data: Any) -> bool:
    """An item's data the engine core can send again: present, and not a
    shared-memory descriptor (whose tensors live in the processor cache)."""
    return data is not None and "address" not in data


class EncoderInputs:
    """The drop-in's encoder-input bookkeeping, as vLLM 0.33's scheduler
    keeps it (``_pending_encoder_input_ids``, ``encoder_cache_mismatch_reqs``)."""

    def __init__(
        self,
        core: Any,
        requests: dict[str, Any],
        use_v2_model_runner: bool,
        is_encoder_decoder: bool,
    ) -> None:
        self.core = core
        self.requests = requests
        self.use_v2_model_runner = use_v2_model_runner
        # An encoder-decoder's audio is done with once any token is computed
        # (its cross-attention KV holds it).
        self.is_encoder_decoder = is_encoder_decoder
        # Per request installed with sendable items: those the worker holds.
        self.pending: dict[str, set[int]] = {}
        # Requests to end with an error at the next update.
        self.mismatch: set[str] = set()

    def forget(self, request_id: str) -> None:
        """A request finished or was preempted: the worker drops its items."""
        self.pending.pop(request_id, None)

    def updates(
        self,
        num_scheduled_tokens: dict[str, int],
        new_reqs: list[NewRequestData],
        scheduled: dict[str, list[int]],
        slot_of: dict[str, int],
    ) -> dict[str, dict[int, Any]]:
        """Model runner V2's ``encoder_input_updates`` for this step."""
        if not self.use_v2_model_runner:
            return {}
        for new in new_reqs:
            # (Re)installed: the worker holds the items sent with their data.
            if new.mm_features:
                self.pending[new.req_id] = {
                    i for i, f in enumerate(new.mm_features) if _sendable(f.data)
                }
        if not self.pending:
            return {}
        # Only a request that encodes this step or whose worker holds items
        # can get an update; a step scheduled 256 of them without news.
        held = (r for r, p in self.pending.items() if p and r not in scheduled)
        updates: dict[str, dict[int, Any]] = {}
        for rid in itertools.chain(scheduled, held):
            pending = self.pending.get(rid)
            if pending is None or rid not in num_scheduled_tokens:
                continue
            encoding = scheduled.get(rid, ())
            features = self.requests[rid].mm_features
            for i in encoding:
                data = features[i].data
                if i not in pending and _sendable(data):
                    # A running request rewound into an item the worker dropped.
                    updates.setdefault(rid, {})[i] = data
                    pending.add(i)
            confirmed = _core.vllm_confirmed_tokens(self.core, slot_of[rid])
            for i in list(pending):
                if i in encoding:
                    continue
                position = features[i].mm_position
                done = self.is_encoder_decoder and confirmed > 0
                if done or position.offset + position.length <= confirmed:
                    updates.setdefault(rid, {})[i] = None
                    pending.remove(i)
        return updates


def encoder_input_stats(
    requests: dict[str, Any], scheduled_encoder_inputs: dict[str, list[int]]
) -> ScheduledEncoderInputStats | None:
    """What a step's encoder runs, for vLLM's iteration details
    (``--enable-logging-iteration-details``): its inputs and their
    embeddings; None when it runs none."""
    stats = ScheduledEncoderInputStats()
    for rid, input_ids in scheduled_encoder_inputs.items():
        request = requests.get(rid)
        if request is None:
            continue
        for i in input_ids:
            stats.num_inputs += 1
            stats.output_tokens += request.mm_features[i].mm_position.get_num_embeds()
    return stats if stats.num_inputs else None
