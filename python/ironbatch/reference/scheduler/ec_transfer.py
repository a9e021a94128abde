"""The scheduler's side of an encoder-cache connector (docs/scheduling.md
§4.20): attaching one, and the calls the passes make into it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ironbatch.reference.ec_connector import SafeEcConnector
from ironbatch.reference.encoder_cache import EncoderCache
from ironbatch.reference.multimodal import MultimodalInput

if TYPE_CHECKING:
    from ironbatch.reference.scheduler import Scheduler


def set_ec_connector(s: Scheduler, connector: Any) -> None:
    """Attach an encoder-cache connector, before the first request. Only a
    scheduler whose encoder outputs are shared by identifier (a vision or
    audio decoder) takes one: an encoder-decoder's encoder runs per
    request."""
    if s.ids:
        why = "it must be set before the first request"
    elif not isinstance(s.encoder, EncoderCache) or s.config.encoder is None:
        why = "the scheduler needs an encoder whose outputs are shared by identifier"
    else:
        why = None
    if why is not None:
        raise ValueError(f"ec_connector: {why}")
    s.ec_connector = SafeEcConnector(connector)


def ec_transfer_pending(s: Scheduler, slot: int, num_computed_tokens: int) -> bool:
    """Whether an encoder output the request in ``slot`` needs past
    ``num_computed_tokens`` is still in transit (vLLM's
    ``_ec_transfer_pending``): then it waits this step. Asked only of
    requests with encoder inputs."""
    if s.ec_connector is None:
        return False
    r = s.requests[slot]
    return bool(r.mm_inputs) and not s.ec_connector.ensure_cache_available(
        r.request_id, num_computed_tokens
    )


def ec_finished(s: Scheduler, slot: int) -> bool:
    """Tell the encoder-cache connector a request finished; true holds its
    KV blocks (§4.19's hold, which a KV connector's report releases)."""
    if s.ec_connector is None:
        return False
    return s.ec_connector.request_finished(s.requests[slot].request_id)


def notify_allocated(
    connector: SafeEcConnector | None, request_id: str, input_ids: list[int]
) -> None:
    """Cache space taken for ``input_ids`` of the request this step: the
    connector is told each, in order."""
    if connector is not None:
        for id in input_ids:
            connector.update_state_after_alloc(request_id, id)


def has_cache_item(connector: SafeEcConnector | None, input: MultimodalInput) -> bool:
    """Whether the connector can supply ``input``'s encoder output (none: no)."""
    return connector is not None and connector.has_cache_item(input.identifier)
