"""A request's images (audio, video) as clients describe them to the
scheduler: where each item's placeholder tokens lie in the prompt, which of
them take an encoder embedding, and an identifier that equal items share
(vLLM's ``MultiModalFeatureSpec``: ``mm_position`` and ``identifier``). The
scheduler runs each item's encoder inside its token and encoder budgets and
keys prefix-cache blocks by it (docs/scheduling.md §4.15); the pixels never
reach it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ironbatch.reference.limits import utf8_str
from ironbatch.reference.multimodal import MultimodalInput as TwinInput


@dataclass(frozen=True)
class MultimodalInput:
    """One item: ``length`` placeholder tokens from ``offset`` in the prompt;
    ``identifier`` equal for equal content (vLLM's ``mm_hash``);
    ``is_embed``, when given, marks the placeholders that take an embedding
    (break and separator tokens do not). vLLM's ``MultiModalFeatureSpec`` is
    taken as well."""

    offset: int
    length: int
    identifier: str
    is_embed: Sequence[bool] | None = None

    def __post_init__(self) -> None:
        check_feature(self, "MultimodalInput")
        if self.is_embed is not None:
            object.__setattr__(self, "is_embed", tuple(bool(m) for m in self.is_embed))


def _position(feature: Any) -> Any:
    """The object holding offset, length and is_embed: vLLM's
    ``mm_position``, or the feature itself."""
    return getattr(feature, "mm_position", feature)


def _mask(position: Any) -> list[bool] | None:
    mask = getattr(position, "is_embed", None)
    if mask is None:
        return None
    if hasattr(mask, "tolist"):  # vLLM's torch tensor
        mask = mask.tolist()
    return [bool(m) for m in mask]


def check_feature(feature: Any, name: str) -> None:
    """Refuse a feature without offset, length and identifier, or with a
    negative offset, an empty placeholder range, a mask of another length,
    naming the field."""
    position = _position(feature)
    for field_name, holder in (("offset", position), ("length", position)):
        if not hasattr(holder, field_name):
            raise TypeError(
                f"{name}.{field_name} is missing: a multimodal feature needs identifier, "
                "offset, length (or vLLM's mm_position) and is_embed"
            )
        value = getattr(holder, field_name)
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name}.{field_name} must be an int, got {type(value).__name__}")
    if position.offset < 0:
        raise ValueError(f"{name}.offset must be >= 0, got {position.offset}")
    if position.length < 1:
        raise ValueError(f"{name}.length must be >= 1, got {position.length}")
    if not hasattr(feature, "identifier"):
        raise TypeError(f"{name}.identifier is missing")
    utf8_str(f"{name}.identifier", feature.identifier)
    mask = getattr(position, "is_embed", None)
    if mask is not None:
        if isinstance(mask, (str, bytes)) or not (
            hasattr(mask, "tolist") or isinstance(mask, Sequence)
        ):
            raise TypeError(f"{name}.is_embed must be a list of bools, got {type(mask).__name__}")
        if len(mask) != position.length:
            raise ValueError(
                f"{name}.is_embed has {len(mask)} entries; it must have length ({position.length})"
            )


def check_mm_features(features: Any) -> list[Any]:
    """The features as a list, each checked (the rules between them and the
    prompt are the scheduler's: ``add_request`` refuses those)."""
    if isinstance(features, (str, bytes)) or not isinstance(features, Sequence):
        raise TypeError(
            f"mm_features must be a list of MultimodalInput, got {type(features).__name__}"
        )
    out = list(features)
    for i, f in enumerate(out):
        check_feature(f, f"mm_features[{i}]")
    return out


def mm_inputs(features: Sequence[Any] | None) -> list[TwinInput]:
    """The twin's inputs for a request's checked ``mm_features``."""
    out: list[TwinInput] = []
    for f in features or ():
        p = _position(f)
        item = TwinInput(p.offset, p.length, f.identifier)
        mask = _mask(p)
        out.append(item if mask is None else item.with_is_embed(mask))
    return out
