"""vLLM's encoder-cache connector behind the drop-in (docs/scheduling.md
§4.20): built by vLLM's own factory with the scheduler role, exactly as
vLLM's scheduler builds it, and called by the core through a bridge that
hands it vLLM's ``Request`` for each request id. What the core does not
decide stays here, at vLLM's points in the step: the connector's metadata
for the workers, its report from the workers, the requests it can no longer
serve, its transfer parameters and its stats."""

from __future__ import annotations

from typing import Any

from vllm.distributed.ec_transfer.ec_connector.base import ECConnectorRole
from vllm.distributed.ec_transfer.ec_connector.factory import ECConnectorFactory
from vllm.v1.request import Request


def build_ec_connector(vllm_config: Any) -> Any:
    """The scheduler side of the deployment's encoder-cache connector, as
    vLLM's scheduler builds it."""
    return ECConnectorFactory.create_connector(config=vllm_config, role=ECConnectorRole.SCHEDULER)


class EcConnectorBridge:
    """The connector as the core calls it: by request id, each call made
    with vLLM's ``Request``. ``transfer_params`` keeps what
    ``request_finished`` returned, for the request's last output (a normal
    finish's; aborts and errors drop it, as vLLM does)."""

    def __init__(self, connector: Any, requests: dict[str, Request]) -> None:
        self.connector = connector
        self.requests = requests
        self.transfer_params: dict[str, dict[str, Any] | None] = {}

    def has_cache_item(self, identifier: str) -> bool:
        return bool(self.connector.has_cache_item(identifier))

    def ensure_cache_available(self, request_id: str, num_computed_tokens: int) -> bool:
        return bool(
            self.connector.ensure_cache_available(self.requests[request_id], num_computed_tokens)
        )

    def update_state_after_alloc(self, request_id: str, input_id: int) -> None:
        self.connector.update_state_after_alloc(self.requests[request_id], input_id)

    def update_state_after_free(self, request_id: str, input_id: int) -> None:
        self.connector.update_state_after_free(self.requests[request_id], input_id)

    def request_finished(self, request_id: str) -> bool:
        delay_free, params = self.connector.request_finished(self.requests[request_id])
        self.transfer_params[request_id] = params
        return bool(delay_free)


def ec_stats(connector: Any, ec_connector_output: Any) -> Any:
    """The step's encoder-cache connector stats: the workers', aggregated
    with the scheduler side's (vLLM's order), or None."""
    stats = ec_connector_output.ec_connector_stats if ec_connector_output else None
    own = connector.get_ec_connector_stats()
    if own is not None and not own.is_empty():
        stats = stats.aggregate(own) if stats is not None else own
    return stats
