"""The encoder cache of an encoder-decoder model (docs/scheduling.md §4.17;
vLLM 0.33's ``EncoderDecoderCacheManager``): the twin of
``rust/src/encoder_decoder_cache.rs``. Whisper's encoder output is read
once, into the cross-attention KV cache, so nothing is shared or kept
between requests: the cache is a count of free embedding slots, and the
identifiers of the inputs encoded in a step are reported freed one step
later (the runner drops them before the next model run).

The count follows vLLM's arithmetic exactly, including what vLLM frees
without having taken: every step a request with computed tokens runs frees
its inputs' embeddings again, as do finishing, preemption and a refused
allocation. So the count only bounds the first steps; after that the
compute budget is what limits the encoder."""

from __future__ import annotations

from collections.abc import Sequence

from ironbatch.reference.multimodal import MultimodalInput


class EncoderDecoderCache:
    """Free embedding slots and the identifiers waiting to be reported freed."""

    def __init__(self, size: int) -> None:
        """An empty cache of ``size`` embeddings."""
        self._size = size
        self._num_free = size
        #: Encoded this step: reported freed after the next step.
        self._allocated: list[str] = []
        #: Encoded the step before: reported freed by this step.
        self._to_free: list[str] = []

    def size(self) -> int:
        """Its size in embeddings."""
        return self._size

    def num_free(self) -> int:
        """Free embedding slots (vLLM's ``num_free_slots``; may exceed the size)."""
        return self._num_free

    def pending(self) -> tuple[list[str], list[str]]:
        """Identifiers encoded this step and the step before, in order."""
        return list(self._allocated), list(self._to_free)

    def can_allocate(self, num_embeds: int, budget: int, num_scheduled: int) -> bool:
        """Whether an input of ``num_embeds`` fits the step's remaining
        ``budget`` and, beside the ``num_scheduled`` embeddings planned
        already, the free slots."""
        return num_embeds <= budget and num_embeds + num_scheduled <= self._num_free

    def allocate(self, input: MultimodalInput) -> None:
        """Take slots for an input the step encodes."""
        self._num_free -= input.num_embeds()
        self._allocated.append(input.identifier)

    def release_all(self, inputs: Sequence[MultimodalInput]) -> None:
        """Give back every input's slots (whether taken or not, as vLLM does)."""
        self._num_free += sum(m.num_embeds() for m in inputs)

    def take_freed(self) -> list[str]:
        """The identifiers the model runner may drop now: those encoded the
        step before this one."""
        freed, self._to_free, self._allocated = self._to_free, self._allocated, []
        return freed
