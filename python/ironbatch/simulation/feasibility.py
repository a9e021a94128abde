"""Whether resolved settings can run, said in the user's terms. Two settings
are usually derived (``max_model_len`` from the longest request,
``num_blocks`` from ``kv_cache_gib`` or the device) and others left at
vLLM's defaults; a refusal that names one of them says where its value came
from and what to set instead, rather than quoting a number the user never
wrote."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from ironbatch.simulation.settings import KEYS


def origins(
    given: Mapping[str, Any],
    settings: Mapping[str, Any],
    *,
    longest: str,
    kv_bytes_per_token: float | None,
    kv_cache_bytes: float | None,
) -> dict[str, str]:
    """For each setting not given: where its value came from."""
    bs = settings["block_size"]
    out = {k: f"{k} {settings[k]} is vLLM's default" for k in KEYS if k not in given}
    if "max_model_len" not in given:
        out["max_model_len"] = (
            f"max_model_len {settings['max_model_len']:,} (derived: the longest request, "
            f"{longest}, rounded up to block_size {bs}; set max_model_len to leave longer "
            "prompts out)"
        )
    if "num_blocks" not in given:
        n = settings["num_blocks"]
        if "kv_cache_gib" in given:
            where = f"kv_cache_gib={given['kv_cache_gib']:g}"
        elif kv_cache_bytes is not None and kv_bytes_per_token is not None:
            where = (
                f"the {kv_cache_bytes / 2**30:,.1f} GiB the step model's device leaves for the "
                "KV cache"
            )
        else:
            where = "room for max_num_seqs sequences of max_model_len"
        out["num_blocks"] = f"num_blocks {n:,} (derived from {where}: blocks of {bs} tokens)"
    return out


def check_kv(
    settings: Mapping[str, Any],
    given: Mapping[str, Any],
    notes: Mapping[str, str],
    kv_bytes_per_token: float | None,
) -> None:
    """vLLM refuses a KV cache that cannot hold one max_model_len request
    (besides the null block); so does this, naming what to change."""
    bs, n, length = settings["block_size"], settings["num_blocks"], settings["max_model_len"]
    usable = (n - 1) * bs
    if usable >= length:
        return
    need = math.ceil(length / bs) + 1
    cache = f"num_blocks={n}" if "num_blocks" in given else notes["num_blocks"]
    model_len = f"max_model_len={length}" if "max_model_len" in given else notes["max_model_len"]
    fixes = [f"num_blocks >= {need:,}"]
    if "num_blocks" not in given and kv_bytes_per_token is not None:
        fixes.insert(0, f"kv_cache_gib >= {need * bs * kv_bytes_per_token / 2**30:.3g}")
    fixes.append("a smaller max_model_len")
    raise ValueError(
        f"the KV cache is too small: {cache} holds {usable:,} tokens, less than one request of "
        f"{model_len}; give {' or '.join(fixes)}"
    )


def explain(message: str, given: Mapping[str, Any], notes: Mapping[str, str]) -> str:
    """``message`` (the scheduler's refusal) with a note for each setting it
    names that the user did not set."""
    named = [k for k in notes if k not in given and re.search(rf"\b{k}\b", message)]
    if not named:
        return message
    return f"{message} ({'; '.join(notes[k] for k in named)})"
