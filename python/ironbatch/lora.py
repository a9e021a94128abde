"""A request's LoRA adapter as clients name it (vLLM's ``LoRARequest``
fields), checked where it comes in; the scheduler counts adapters against
``max_loras`` and keys block hashes by them (docs/scheduling.md §4.14)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ironbatch.reference.limits import utf8_str
from ironbatch.reference.lora import LoraAdapter

U32_MAX = 2**32 - 1


@dataclass(frozen=True)
class LoRARequest:
    """An adapter by vLLM's field names: ``lora_int_id`` (at least 1) is
    what ``max_loras`` counts, ``lora_name`` and ``lora_path`` what the
    prefix cache is keyed by. vLLM's own ``LoRARequest`` is taken as well."""

    lora_name: str
    lora_int_id: int
    lora_path: str = ""

    def __post_init__(self) -> None:
        check_lora_request(self)


def check_lora_request(lora: Any) -> None:
    """Refuse an adapter without vLLM's fields, an id outside [1, 2^32 - 1]
    or a name or path that is not a str, naming the field."""
    for name in ("lora_int_id", "lora_name", "lora_path"):
        if not hasattr(lora, name):
            raise TypeError(
                "lora_request must have vLLM's LoRARequest fields (lora_int_id, lora_name, "
                f"lora_path); {type(lora).__name__} has no {name}"
            )
    i = lora.lora_int_id
    if isinstance(i, bool) or not isinstance(i, int):
        raise TypeError(f"lora_request.lora_int_id must be an int, got {type(i).__name__}")
    if not 1 <= i <= U32_MAX:
        raise ValueError(f"lora_request.lora_int_id must be in [1, {U32_MAX}], got {i}")
    utf8_str("lora_request.lora_name", lora.lora_name)
    utf8_str("lora_request.lora_path", lora.lora_path)


def lora_adapter(lora: Any) -> LoraAdapter | None:
    """The twin's adapter for a request's ``lora_request`` (None: the base model)."""
    if lora is None:
        return None
    return LoraAdapter(id=lora.lora_int_id, name=lora.lora_name, path=lora.lora_path)
