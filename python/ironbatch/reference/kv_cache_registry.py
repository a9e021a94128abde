"""``KVCacheManager``: the KV-cache manager with a registry of the requests it
serves, keyed by request id: the twin of the Rust binding
(``rust/src/python/kv_cache_manager.rs``). The core manager keeps no ids:
requests own their tables and sequences, as the scheduler's requests do, so
the registry lives here, outside it."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from ironbatch.reference.args import count, u32_list
from ironbatch.reference.block_hash import CacheSalt
from ironbatch.reference.block_table import BlockTable
from ironbatch.reference.error import debug_str, duplicate_request, unknown_request
from ironbatch.reference.kv_cache_manager import KvCacheManager
from ironbatch.reference.limits import utf8_str
from ironbatch.reference.prefix_cache_stats import PrefixCacheStats
from ironbatch.reference.sequence import Sequence


@dataclass
class _Entry:
    seq: Sequence
    table: BlockTable = field(default_factory=BlockTable)


class KVCacheManager:
    """The paged KV cache's bookkeeping: prefix lookups, slot allocation and
    freeing for the requests registered with ``add_request``, with vLLM
    0.33's decisions (block ids, free-queue order, prefix-cache hits)."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        max_model_len: int,
        enable_prefix_caching: bool = True,
    ) -> None:
        self.kv = KvCacheManager(
            count("num_blocks", num_blocks),
            count("block_size", block_size),
            count("max_model_len", max_model_len),
            bool(enable_prefix_caching),
        )
        self._requests: dict[str, _Entry] = {}

    # -- requests -------------------------------------------------------------

    def add_request(
        self, request_id: str, prompt_token_ids: Iterable[int], cache_salt: str | None = None
    ) -> None:
        """Register a request's prompt (and hash its full blocks)."""
        utf8_str("request_id", request_id)
        if cache_salt is not None:
            utf8_str("cache_salt", cache_salt)
        if request_id in self._requests:
            raise duplicate_request(request_id)
        prompt = u32_list("prompt_token_ids", prompt_token_ids)
        if not prompt:
            raise ValueError("prompt_token_ids must not be empty")
        self._check_len("prompt_token_ids", len(prompt))
        extras = [] if cache_salt is None else [CacheSalt(cache_salt)]
        seq = Sequence(prompt, extras, self.kv.hasher, self.kv.hash_block_size)
        self._requests[request_id] = _Entry(seq)

    def append_token_ids(self, request_id: str, token_ids: Iterable[int]) -> None:
        """Append output tokens to a request, hashing each block they complete."""
        tokens = u32_list("token_ids", token_ids)
        entry = self._entry(request_id)
        self._check_len("token_ids", entry.seq.num_tokens + len(tokens))
        entry.seq.append(tokens, self.kv.hasher, self.kv.hash_block_size)

    def remove_request(self, request_id: str) -> None:
        """Free a request's blocks and forget it."""
        entry = self._entry(request_id)
        del self._requests[request_id]
        self.kv.free([entry.table])

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._requests

    def __len__(self) -> int:
        return len(self._requests)

    # -- the manager's work ---------------------------------------------------

    def get_computed_blocks(self, request_id: str) -> tuple[list[int], int]:
        """The longest cached prefix of the request: (hit block ids, hit
        tokens). Whole blocks only, at most ``num_tokens - 1`` tokens.
        Changes nothing."""
        hits, num_hit_tokens = self.kv.get_computed_blocks(self._entry(request_id).seq)
        return [b.block_id for b in hits], num_hit_tokens

    def allocate_slots(
        self,
        request_id: str,
        num_new_tokens: int,
        num_new_computed_tokens: int | None = None,
        new_computed_blocks: Iterable[int] | None = None,
        full_sequence_must_fit: bool = False,
    ) -> list[int] | None:
        """Make room for ``num_new_tokens`` more tokens after taking the
        prefix hits ``new_computed_blocks`` (worth
        ``num_new_computed_tokens``). Returns the newly allocated block ids,
        or None (and changes nothing) when too few blocks are free.
        ``full_sequence_must_fit`` is the admission gate."""
        n_new = count("num_new_tokens", num_new_tokens)
        n_hit = (
            0
            if num_new_computed_tokens is None
            else count("num_new_computed_tokens", num_new_computed_tokens)
        )
        hits = (
            []
            if new_computed_blocks is None
            else u32_list("new_computed_blocks", new_computed_blocks)
        )
        entry = self._entry(request_id)
        grown = self.kv.allocate_slots(
            entry.table, entry.seq, n_new, n_hit, hits, bool(full_sequence_must_fit)
        )
        if grown is None:
            return None
        return entry.table.block_ids()[len(entry.table) - grown :]

    def free(self, request_id: str) -> None:
        """Release the request's blocks (last block first). It stays
        registered with no computed tokens, as a preempted request is."""
        entry = self._entry(request_id)
        self.kv.free([entry.table])
        entry.seq.num_computed_tokens = 0

    # -- inspection -----------------------------------------------------------

    def get_block_ids(self, request_id: str) -> list[int]:
        """The request's block table."""
        return self._entry(request_id).table.block_ids()

    def num_cached_blocks(self, request_id: str) -> int:
        """How many leading blocks of the request's table are hash-cached."""
        return self._entry(request_id).table.num_cached_blocks()

    def num_tokens(self, request_id: str) -> int:
        """The request's known tokens (prompt + output)."""
        return self._entry(request_id).seq.num_tokens

    def num_computed_tokens(self, request_id: str) -> int:
        """Tokens of the request whose KV is (or this step will be) cached."""
        return self._entry(request_id).seq.num_computed_tokens

    def set_num_computed_tokens(self, request_id: str, num_computed_tokens: int) -> None:
        """Set what the scheduler computed; at most the tokens its table
        covers and its known tokens."""
        n = count("num_computed_tokens", num_computed_tokens)
        bs = self.kv.hash_block_size
        entry = self._entry(request_id)
        limit = min(entry.seq.num_tokens, len(entry.table) * bs)
        if n > limit:
            raise ValueError(
                f"num_computed_tokens = {n} exceeds the {limit} tokens request "
                f"{debug_str(request_id)} has slots for ({len(entry.table)} blocks of {bs}, "
                f"{entry.seq.num_tokens} known tokens)"
            )
        entry.seq.num_computed_tokens = n

    def block_hashes(self, request_id: str) -> list[int]:
        """The request's block hashes, one per full block."""
        return list(self._entry(request_id).seq.block_hashes)

    # -- statistics and reset -------------------------------------------------

    def record_prefix_cache_stats(
        self, request_id: str, num_hit_tokens: int, preempted: bool = False
    ) -> None:
        """Count one admission of the request with ``num_hit_tokens`` prefix hits."""
        hits = count("num_hit_tokens", num_hit_tokens)
        num_tokens = self._entry(request_id).seq.num_tokens
        if hits > num_tokens:
            raise ValueError(f"num_hit_tokens = {hits} exceeds the request's {num_tokens} tokens")
        self.kv.record_prefix_cache_stats(num_tokens, hits, bool(preempted))

    def make_prefix_cache_stats(self) -> PrefixCacheStats:
        """Take the prefix-cache counters, leaving zeros."""
        return self.kv.make_prefix_cache_stats()

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash; refused (False) while any block is held."""
        return self.kv.reset_prefix_cache()

    # -- the pool -------------------------------------------------------------

    def free_block_ids(self) -> list[int]:
        """The free queue, head (next to reuse or evict) first."""
        return self.kv.pool.free_block_ids()

    def block_ref_cnts(self) -> list[int]:
        """Every block's reference count, indexed by block id."""
        return self.kv.pool.block_ref_cnts()

    def block_hash(self, block_id: int) -> int | None:
        """The hash a block is cached under, or None."""
        b = count("block_id", block_id)
        block = self.kv.pool.block(b)
        if block is None:
            raise ValueError(f"block_id = {b} is not in the pool")
        return block.hash

    def cached_blocks(self) -> dict[int, list[int]]:
        """The prefix-cache map: hash -> block ids in insertion order."""
        return dict(self.kv.pool.cached_blocks())

    @property
    def num_blocks(self) -> int:
        return self.kv.pool.num_blocks

    @property
    def block_size(self) -> int:
        return self.kv.hash_block_size

    @property
    def max_model_len(self) -> int:
        return self.kv.max_model_len

    @property
    def enable_prefix_caching(self) -> bool:
        return self.kv.enable_prefix_caching

    @property
    def num_free_blocks(self) -> int:
        return self.kv.num_free_blocks

    @property
    def usage(self) -> float:
        return self.kv.usage

    def _entry(self, request_id: str) -> _Entry:
        utf8_str("request_id", request_id)
        entry = self._requests.get(request_id)
        if entry is None:
            raise unknown_request(request_id)
        return entry

    def _check_len(self, field: str, num_tokens: int) -> None:
        if num_tokens > self.kv.max_model_len:
            raise ValueError(
                f"{field}: {num_tokens} tokens exceed max_model_len = {self.kv.max_model_len}"
            )

    def __repr__(self) -> str:
        return (
            f"KVCacheManager(num_blocks={self.num_blocks}, block_size={self.block_size}, "
            f"max_model_len={self.max_model_len}, "
            f"enable_prefix_caching={self.enable_prefix_caching}, "
            f"num_free_blocks={self.num_free_blocks}, requests={len(self)})"
        )
