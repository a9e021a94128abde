"""Streaming-input sessions (docs/scheduling.md §4.12): a request whose input
arrives in chunks under one id (vLLM's ``resumable`` requests). When a turn
stops, the session keeps its KV cache and waits for the next chunk; each
chunk continues it from all it has but its last sampled token. A chunk that
arrives early waits in the session's queue; a chunk that is not resumable
ends the input."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ironbatch.reference.multimodal import MultimodalInput
    from ironbatch.reference.request import StopRules


@dataclass
class SessionUpdate:
    """One input chunk of a session: its tokens, its images (placed within
    the chunk) and the rules of its turn."""

    prompt_token_ids: list[int]
    #: Offsets count from the chunk's first token; applying the chunk moves
    #: them past what the session keeps, as vLLM does.
    mm_inputs: list[MultimodalInput]
    stop: StopRules
    #: Seconds; replaces the session's arrival time when applied.
    arrival_time: float


#: A session's chunks not applied yet, in arrival order; None ends the input
#: (the turn that takes it is the session's last).
SessionQueue = deque["SessionUpdate | None"]
