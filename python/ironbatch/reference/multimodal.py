"""A request's multimodal inputs as the scheduler sees them
(docs/scheduling.md §4.15): the twin of ``rust/src/multimodal.rs``. Each item
is where its placeholder tokens lie in the prompt, which of them take an
encoder embedding, and the identifier that items of equal content share
(vLLM's ``MultiModalFeatureSpec``: ``mm_position`` and ``identifier``); the
pixels never reach the scheduler."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, replace

from ironbatch.reference.error import debug_str


@dataclass(frozen=True)
class MultimodalInput:
    """One image (audio clip, video) of a prompt."""

    #: The first placeholder token's position in the prompt.
    offset: int
    #: Placeholder tokens (at least 1).
    length: int
    #: Equal for items of equal content (vLLM's ``mm_hash``): they share one
    #: encoder-cache entry, and block hashes key the placeholders by it.
    identifier: str
    #: Embeddings up to each placeholder, inclusive (prefix sums of vLLM's
    #: ``is_embed`` mask); None when every placeholder takes one.
    embeds_cumsum: tuple[int, ...] | None = None

    def with_is_embed(self, is_embed: Sequence[bool]) -> MultimodalInput:
        """The same item, only the placeholders where ``is_embed`` holds
        taking an embedding (break and separator tokens do not)."""
        cumsum = tuple(itertools.accumulate(int(bool(e)) for e in is_embed))
        return replace(self, embeds_cumsum=cumsum)

    def end(self) -> int:
        """Where its placeholders end (exclusive)."""
        return self.offset + self.length

    def num_embeds(self) -> int:
        """Encoder embeddings it takes: what the encoder budget and the
        encoder cache count."""
        if self.embeds_cumsum is None:
            return self.length
        return self.embeds_cumsum[-1] if self.embeds_cumsum else 0

    def embeds_in(self, start: int, end: int) -> tuple[int, int]:
        """The embeddings that placeholders ``start..end`` (relative to the
        offset) take, as a ``(start, end)`` range of its encoder output
        (empty when the two are equal)."""
        c = self.embeds_cumsum
        if c is None:
            return start, end
        return (c[start - 1] if start > 0 else 0), (c[end - 1] if end > 0 else 0)


def inputs_in_window(inputs: Sequence[MultimodalInput], start: int, end: int) -> range:
    """The indices of the inputs whose placeholders overlap positions
    ``start..end`` (inputs sorted by offset and apart, so their ends are
    sorted too)."""
    lo = bisect.bisect_left(inputs, start + 1, key=lambda m: m.end())
    hi = bisect.bisect_left(inputs, end, key=lambda m: m.offset)
    return range(lo, max(hi, lo))


@dataclass(frozen=True)
class InPrompt:
    """Placeholders inside a prompt of ``num_prompt_tokens`` (a decoder-only
    model's images; the core's ``InputPlacement::Prompt``)."""

    num_prompt_tokens: int


@dataclass(frozen=True)
class InEncoder:
    """An encoder-decoder's encoder input (Whisper's audio): at position 0,
    its length the encoder's tokens, apart from the decoder's prompt (the
    core's ``InputPlacement::Encoder``)."""


#: Where a request's multimodal inputs sit.
InputPlacement = InPrompt | InEncoder
ENCODER = InEncoder()


def check_inputs(
    request_id: str, inputs: Sequence[MultimodalInput], placement: InputPlacement
) -> None:
    """The rules a request's inputs keep, checked before it is queued
    (``ValueError`` naming the first input that breaks one): each inside the
    prompt (at position 0 for an encoder's), at least one placeholder long,
    an ``is_embed`` mask of its length, an identifier; inputs sorted and
    apart; an identifier used twice always with the same number of
    embeddings."""

    def field(i: int, what: str) -> ValueError:
        return ValueError(f"mm_features[{i}] of request {debug_str(request_id)}: {what}")

    for i, m in enumerate(inputs):
        if m.length == 0:
            raise field(i, "mm_position.length must be >= 1, got 0")
        if isinstance(placement, InPrompt) and m.end() > placement.num_prompt_tokens:
            raise field(
                i,
                f"mm_position (offset {m.offset}, length {m.length}) ends past the "
                f"prompt's {placement.num_prompt_tokens} tokens",
            )
        if isinstance(placement, InEncoder) and m.offset != 0:
            # vLLM asserts it: the encoder runs before the decoder's first token.
            raise field(
                i,
                "mm_position.offset must be 0 for an encoder-decoder model's encoder "
                f"input, got {m.offset}",
            )
        if m.embeds_cumsum is not None and len(m.embeds_cumsum) != m.length:
            raise field(
                i,
                f"mm_position.is_embed has {len(m.embeds_cumsum)} entries; it must have "
                f"length ({m.length})",
            )
        if not m.identifier:
            raise field(i, "identifier must not be empty")
        # An encoder's inputs all sit at 0.
        if isinstance(placement, InPrompt) and i > 0 and inputs[i - 1].end() > m.offset:
            raise field(
                i,
                f"mm_position.offset ({m.offset}) must not be before the end of "
                f"mm_features[{i - 1}] ({inputs[i - 1].end()})",
            )
        for j, o in enumerate(inputs[:i]):
            if o.identifier == m.identifier and o.num_embeds() != m.num_embeds():
                raise field(
                    i,
                    f"identifier {debug_str(m.identifier)} takes {m.num_embeds()} embeddings "
                    f"here but {o.num_embeds()} at mm_features[{j}]",
                )
