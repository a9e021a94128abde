"""The encoder cache's bookkeeping (docs/scheduling.md §4.15; vLLM's
``EncoderCacheManager``): the twin of ``rust/src/encoder_cache.rs``. It
tracks which encoder outputs the model runner holds, by identifier, counted
in embeddings against a fixed size. An entry lives while a request
references it; unreferenced, it stays (another request with the same image
reuses it) until space is needed, and then the oldest unreferenced entries
are evicted first. The runner is told which went (``free_encoder_mm_hashes``)."""

from __future__ import annotations

import bisect
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from ironbatch.reference.multimodal import MultimodalInput


@dataclass
class _Entry:
    """One cached encoder output."""

    num_embeds: int
    #: The slots of the requests that reference it; empty: evictable.
    refs: list[int] = field(default_factory=list)


class EncoderCache:
    """The encoder cache of one scheduler."""

    def __init__(self, size: int) -> None:
        """A cache of ``size`` embeddings."""
        self._size = size
        self._num_free = size
        #: Free plus what evicting every unreferenced entry would free.
        self._num_freeable = size
        self._entries: dict[str, _Entry] = {}
        #: Each request's inputs that hold a reference, ascending (vLLM walks a
        #: set of small ints, which iterates ascending for up to 8 inputs).
        self._held: dict[int, list[int]] = {}
        #: Unreferenced entries' identifiers, oldest first.
        self._freeable: OrderedDict[str, None] = OrderedDict()
        #: Evicted since last taken.
        self._freed: list[str] = []

    def size(self) -> int:
        """Its size in embeddings."""
        return self._size

    def num_used(self) -> int:
        """Embeddings held by entries (referenced or not)."""
        return self._size - self._num_free

    def cached_num_embeds(self, identifier: str) -> int | None:
        """The embeddings an entry for ``identifier`` holds, if there is one."""
        e = self._entries.get(identifier)
        return None if e is None else e.num_embeds

    def reference_cached(self, slot: int, inputs: Sequence[MultimodalInput], id: int) -> bool:
        """If input ``id`` of the request in ``slot`` is cached, reference it
        for the request and return True (vLLM's ``check_and_update_cache``)."""
        identifier = inputs[id].identifier
        entry = self._entries.get(identifier)
        if entry is None:
            return False
        if identifier in self._freeable:
            # Referenced again: no longer evictable.
            del self._freeable[identifier]
            self._num_freeable -= entry.num_embeds
        if slot not in entry.refs:
            entry.refs.append(slot)
        self._hold(slot, id)
        return True

    def make_room(self, num_embeds: int, budget: int, num_scheduled: int) -> bool:
        """Whether ``num_embeds`` more embeddings fit beside ``num_scheduled``
        already scheduled this step, within ``budget``; if they fit only by
        evicting, the oldest unreferenced entries are evicted now (vLLM's
        ``can_allocate``)."""
        if num_embeds > budget:
            return False
        needed = num_embeds + num_scheduled
        if needed <= self._num_free:
            return True
        if needed > self._num_freeable:
            return False
        while needed > self._num_free:
            identifier, _ = self._freeable.popitem(last=False)
            entry = self._entries.pop(identifier)
            self._num_free += entry.num_embeds
            self._freed.append(identifier)
        return True

    def allocate(self, slot: int, inputs: Sequence[MultimodalInput], id: int) -> None:
        """Take space for input ``id`` of the request in ``slot`` and
        reference it (after ``make_room`` said it fits)."""
        m = inputs[id]
        num_embeds = m.num_embeds()
        entry = self._entries.setdefault(m.identifier, _Entry(num_embeds))
        assert entry.num_embeds == num_embeds
        if slot not in entry.refs:
            entry.refs.append(slot)
        assert self._num_free >= num_embeds and self._num_freeable >= num_embeds
        self._num_free -= num_embeds
        self._num_freeable -= num_embeds
        self._hold(slot, id)

    def _hold(self, slot: int, id: int) -> None:
        held = self._held.setdefault(slot, [])
        at = bisect.bisect_left(held, id)
        if at == len(held) or held[at] != id:
            held.insert(at, id)

    def held(self, slot: int) -> list[int]:
        """The request's inputs that hold a reference, ascending (the
        cache's own list: read, don't change)."""
        return self._held.get(slot, [])

    def release(self, slot: int, inputs: Sequence[MultimodalInput], id: int) -> None:
        """Drop input ``id``'s reference for the request in ``slot``; the
        entry becomes evictable once no request (and no other input of this
        one with the same identifier) references it (vLLM's
        ``free_encoder_input``)."""
        identifier = inputs[id].identifier
        held = self._held.get(slot)
        if held is not None:
            at = bisect.bisect_left(held, id)
            if at < len(held) and held[at] == id:
                del held[at]
            still_held = any(inputs[other].identifier == identifier for other in held)
            if not held:
                del self._held[slot]
            if still_held:
                return
        entry = self._entries.get(identifier)
        if entry is None or not entry.refs:
            return
        if slot in entry.refs:
            entry.refs.remove(slot)
        if not entry.refs:
            self._freeable[identifier] = None
            self._num_freeable += entry.num_embeds

    def release_all(self, slot: int, inputs: Sequence[MultimodalInput]) -> None:
        """Drop every reference of the request in ``slot`` (it finished, was
        preempted or could not be admitted)."""
        for id in list(self.held(slot)):
            self.release(slot, inputs, id)

    def take_freed(self) -> list[str]:
        """The identifiers evicted since last taken and not cached again
        since (vLLM's ``get_freed_mm_hashes``)."""
        freed, self._freed = self._freed, []
        return [i for i in freed if i not in self._entries]

    def check_invariants(self) -> str | None:
        """What is wrong with the counts against the entries, or None (tests)."""
        used = sum(e.num_embeds for e in self._entries.values())
        unreferenced = sum(e.num_embeds for e in self._entries.values() if not e.refs)
        if used > self._size:
            return f"{used} embeddings cached in a cache of {self._size}"
        if self._num_free != self._size - used:
            return f"num_free {self._num_free} but {used} used"
        if self._num_freeable != self._num_free + unreferenced:
            return (
                f"num_freeable {self._num_freeable} but {self._num_free} free and "
                f"{unreferenced} unreferenced"
            )
        if len(self._freeable) != sum(1 for e in self._entries.values() if not e.refs):
            return "the eviction order misses an unreferenced entry"
        return None
