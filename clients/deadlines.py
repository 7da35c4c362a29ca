"""Deadlines for many pending items: O(1) add and remove, swept in bulk. Pure: no clock.

Used by the broker's router (one deadline per call attempt) and by the SDK (a
safety deadline per call). Items are grouped in buckets of ``granularity``
seconds keyed by ``ceil(deadline / granularity)``; ``expire(now)`` empties every
bucket whose time has come. An item therefore never fires early and fires at
most one granularity (plus the caller's sweep interval) late.

Unlike a heap with lazy deletion, a removed item leaves the structure at once:
finished calls do not linger until their deadline (which in a prototype let the
garbage collector eat a third of the CPU).
"""

from __future__ import annotations

import math
from typing import Any, Hashable


class Deadlines:
    """Buckets of ``{key: item}`` by due slot; the caller keeps the slot to remove."""

    __slots__ = ("_granularity", "_buckets", "_next", "_count")

    def __init__(self, granularity: float, now: float) -> None:
        if granularity <= 0:
            raise ValueError("granularity must be positive")
        self._granularity = granularity
        self._buckets: dict[int, dict[Hashable, Any]] = {}
        self._next = math.floor(now / granularity)  # lowest slot not yet swept
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def add(self, key: Hashable, item: Any, deadline: float) -> int:
        """File ``item`` under ``key``, due at ``deadline``; returns the slot for ``remove``.

        A deadline already in the past is due at the next sweep.
        """
        slot = math.ceil(deadline / self._granularity)
        if slot < self._next:
            slot = self._next
        bucket = self._buckets.get(slot)
        if bucket is None:
            bucket = self._buckets[slot] = {}
        bucket[key] = item
        self._count += 1
        return slot

    def remove(self, slot: int, key: Hashable) -> bool:
        """Forget ``key`` filed at ``slot``; False when it was not there (already expired)."""
        bucket = self._buckets.get(slot)
        if bucket is None or bucket.pop(key, _MISSING) is _MISSING:
            return False
        self._count -= 1
        if not bucket:
            del self._buckets[slot]
        return True

    def expire(self, now: float) -> list[Any]:
        """Remove and return every item due at or before ``now``, oldest slot first."""
        last = math.floor(now / self._granularity)
        if last < self._next:
            return []
        due: list[Any] = []
        buckets = self._buckets
        if last - self._next > len(buckets):
            # Long idle gap: walk the (few) filled slots rather than every empty one.
            slots = sorted(s for s in buckets if s <= last)
        else:
            slots = range(self._next, last + 1)
        for slot in slots:
            bucket = buckets.pop(slot, None)
            if bucket:
                due.extend(bucket.values())
        self._count -= len(due)
        self._next = last + 1
        return due


_MISSING = object()
