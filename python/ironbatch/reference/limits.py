"""The largest sizes ironbatch accepts: the twin of ``rust/src/limits.rs``
(same names, same values, same messages; a test holds them equal to the
core's ``ironbatch._core.LIMITS``). The API checks against these too, so
both backends accept and reject the same values.

They keep every size inside what the core's arithmetic and the step's
columns hold: slots are ``block_id * block_size + offset`` in int64; token
counts, positions and lengths are int32 columns."""

from __future__ import annotations

#: Blocks in a pool, the null block included (2^28 tokens at block size 16
#: is beyond any accelerator; a mistyped size raises instead of allocating).
MAX_NUM_BLOCKS = 1 << 24
#: Tokens per block; with MAX_NUM_BLOCKS a slot stays below 2^44.
MAX_BLOCK_SIZE = 1 << 20
#: Tokens in one sequence (int32 positions and lengths).
MAX_MODEL_LEN = 2**31 - 1
#: Tokens in one step (int32 query_start_loc).
MAX_NUM_BATCHED_TOKENS = 2**31 - 1
#: Requests running at once (int32 request slots).
MAX_NUM_SEQS = 2**31 - 1
#: A request's max_tokens: what crosses into the core as an int64.
MAX_TOKENS = 2**63 - 1
#: KV-cache groups of one model (Gemma 3 has six).
MAX_KV_CACHE_GROUPS = 64

#: Every limit by the name of the field it bounds (the core's ``LIMITS``).
ALL = {
    "num_blocks": MAX_NUM_BLOCKS,
    "block_size": MAX_BLOCK_SIZE,
    "max_model_len": MAX_MODEL_LEN,
    "max_num_batched_tokens": MAX_NUM_BATCHED_TOKENS,
    "max_num_seqs": MAX_NUM_SEQS,
    "max_tokens": MAX_TOKENS,
    "kv_cache_groups": MAX_KV_CACHE_GROUPS,
}


def check_range(field: str, value: int, minimum: int, maximum: int) -> None:
    """``value`` must lie in ``[minimum, maximum]``."""
    if not minimum <= value <= maximum:
        raise ValueError(f"{field} must be in [{minimum}, {maximum}], got {value}")


def utf8_str(field: str, value: object) -> str:
    """A str that encodes as UTF-8 (no lone surrogates), as the core stores
    ids and salts."""
    if not isinstance(value, str):
        raise TypeError(f"{field} must be a str, got {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(
            f"{field} = {value!r} is not valid UTF-8 (character {e.start} is a lone surrogate)"
        ) from None
    return value
