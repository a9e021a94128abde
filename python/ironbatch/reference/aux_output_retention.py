"""Which blocks' auxiliary outputs the workers still hold (docs/scheduling.md
§7.12): with ``--enable-return-routed-experts``, each output carries the
experts its tokens were routed to, and a request that reuses cached KV must
get those tokens' routing too. The workers keep it per block, keyed by the
block's hash in one KV-cache group (the first full-attention group, else
group 0): for every block cached in that group, and for the blocks finished
requests left behind, up to a capacity, least recently used out first. A
prefix hit, local or from a KV connector, may reach only over blocks whose
routing is held (vLLM's ``max_cache_hit`` and ``cap_external_hit``).

This is the scheduler's side of vLLM's ``AuxOutputSchedulerConnector``: what
it remembers, at the moments vLLM's scheduler tells it something (a lookup,
a request's blocks going back, a request loading its KV, a step scheduling a
request, a prefix-cache reset). What a block being cached means is asked of
the KV cache at that moment."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

#: Whether a block ending at a hash is cached in the retention's group now.
Cached = Callable[[int], bool]


class AuxOutputRetention:
    """The retained blocks (by the hash where each ends) in least recently
    used order, and which a loading request reads."""

    def __init__(self, group: int, block_size: int, hash_block_size: int) -> None:
        #: The group whose blocks key the routing.
        self.group = group
        #: That group's tokens per block, and its block in hash blocks.
        self.block_size = block_size
        self.hashes_per_block = max(block_size // max(hash_block_size, 1), 1)
        #: Retained blocks, least recently used first (dicts keep order).
        self.retained: dict[int, None] = {}
        #: Per request loading its KV from a connector: the blocks it reads.
        self.loading: dict[int, list[int]] = {}

    def max_cache_hit(self, hashes: Sequence[int], num_tokens: int, cached: Cached) -> int:
        """The most tokens a prefix hit of a request with ``hashes`` and
        ``num_tokens`` tokens may cover: its blocks from the first while
        each is retained (now the most recently used) or ``cached`` in the
        group, short of its last token."""
        num_blocks = 0
        for end in self._block_ends(len(hashes)):
            key = hashes[end - 1]
            if key in self.retained:
                del self.retained[key]
                self.retained[key] = None
            elif not cached(key):
                break
            num_blocks += 1
        return min(num_blocks * self.block_size, max(num_tokens - 1, 0))

    def cap_external_hit(
        self,
        hashes: Sequence[int],
        num_tokens: int,
        num_local: int,
        num_external: int,
        cached: Cached,
    ) -> int:
        """A connector's ``num_external`` tokens past a local hit of
        ``num_local``, kept only when the whole hit ends on a block and
        reaches no further than :meth:`max_cache_hit` (else none)."""
        num_hit = num_local + num_external
        # (Asked even when the hit is misaligned, as vLLM asks: it touches.)
        aligned = num_hit % self.block_size == 0
        if aligned and num_hit <= self.max_cache_hit(hashes, num_tokens, cached):
            return num_external
        return 0

    def request_loading(self, slot: int, hashes: Sequence[int], num_tokens: int) -> None:
        """The request in ``slot`` loads its KV from a connector,
        ``num_tokens`` of them in all: its blocks among those stay retained
        meanwhile."""
        ends = list(self._block_ends(len(hashes)))[: num_tokens // self.block_size]
        self.loading[slot] = [hashes[end - 1] for end in ends]

    def scheduled(self, slot: int) -> None:
        """A step scheduled the request in ``slot``: whatever it loaded is in."""
        self.loading.pop(slot, None)

    def request_finished(
        self,
        slot: int,
        hashes: Sequence[int],
        num_computed_tokens: int,
        capacity: int,
        cached: Cached,
    ) -> None:
        """The request in ``slot`` gives its blocks back (finished or
        preempted) having computed ``num_computed_tokens``: its computed
        blocks cached in the group now are retained (after the others), then
        the least recently used retained blocks neither cached nor loading
        go while more than ``capacity`` are held."""
        self.loading.pop(slot, None)
        ends = list(self._block_ends(len(hashes)))[: num_computed_tokens // self.block_size]
        for end in ends:
            key = hashes[end - 1]
            if key not in self.retained and cached(key):
                self.retained[key] = None
        self._release_unheld(capacity, cached)

    def reset(self) -> None:
        """The prefix cache was reset: the workers start afresh, holding none."""
        self.retained.clear()

    def __len__(self) -> int:
        return len(self.retained)

    def _release_unheld(self, capacity: int, cached: Cached) -> None:
        excess = len(self.retained) - capacity
        if excess <= 0:
            return
        loading = {key for keys in self.loading.values() for key in keys}
        victims = [key for key in self.retained if key not in loading and not cached(key)]
        for key in victims[:excess]:
            del self.retained[key]

    def _block_ends(self, num_hashes: int) -> Iterator[int]:
        """Where each of the group's blocks ends, in hash blocks, over a
        request's ``num_hashes`` hashes."""
        return iter(range(self.hashes_per_block, num_hashes + 1, self.hashes_per_block))
