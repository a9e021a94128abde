"""Live values in small, stable slots (the twin of ``rust/src/slab.rs``). A
slot is a value's row while it lives (a model runner keeps per-request state
by it); freed slots are reused last-freed first. Each slot has a generation
that changes when its value is removed, so a reference taken earlier (a
step's entry) can tell whether the slot still holds the same value."""

from __future__ import annotations

from typing import Generic, TypeVar

T = TypeVar("T")


class Slab(Generic[T]):
    """Values by slot, with generations. Values are never None (None marks
    an empty slot)."""

    def __init__(self) -> None:
        self._values: list[T | None] = []
        self._generations: list[int] = []
        self._free: list[int] = []
        self._len = 0

    def insert(self, value: T) -> int:
        """Store ``value`` in the last freed slot, or a new one."""
        self._len += 1
        if self._free:
            slot = self._free.pop()
            self._values[slot] = value
            return slot
        self._values.append(value)
        self._generations.append(0)
        return len(self._values) - 1

    def remove(self, slot: int) -> T:
        """Take the value out of ``slot``, freeing the slot and changing its
        generation."""
        value = self[slot]
        self._values[slot] = None
        # The core's generation is a wrapping u32.
        self._generations[slot] = (self._generations[slot] + 1) & 0xFFFF_FFFF
        self._free.append(slot)
        self._len -= 1
        return value

    def get(self, slot: int) -> T | None:
        """The value in ``slot``, if it holds one."""
        return self._values[slot] if 0 <= slot < len(self._values) else None

    def generation(self, slot: int) -> int:
        """The slot's current generation."""
        return self._generations[slot]

    def holds(self, slot: int, generation: int) -> bool:
        """Whether ``slot`` still holds the value it held at ``generation``."""
        return (
            0 <= slot < len(self._values)
            and self._generations[slot] == generation
            and self._values[slot] is not None
        )

    def __getitem__(self, slot: int) -> T:
        """The live value in ``slot``; only a broken invariant finds none."""
        value = self.get(slot)
        if value is None:
            raise LookupError(f"slot {slot} holds no live value")
        return value

    def __len__(self) -> int:
        """Live values."""
        return self._len

    def is_empty(self) -> bool:
        return self._len == 0
