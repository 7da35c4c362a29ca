"""Deadlines for many pending items: O(1) filing, swept in bulk. Pure: no clock.

Used by the broker's router (attempt ids) and by the SDK (call ids). Keys are
filed in buckets of ``granularity`` seconds by due time; ``expire(now)``
empties every bucket whose time has come and returns the keys. A key never
comes back early, and at most one granularity (plus the caller's sweep
interval) late.

Nothing is ever removed before its time: the owner keeps its real state in
its own table, removes finished entries from that table at once, and on
expiry looks each key up there, ignoring keys it no longer knows. Only a
small int waits here until its bucket is swept — never the finished call
itself, so finished calls are freed at once (in a prototype, keeping them
until their deadline let the garbage collector eat a third of the CPU) and
filing costs one list append, not a heap push or a removal.
"""

from __future__ import annotations

import math
from typing import Generic, Hashable, Iterable, TypeVar

K = TypeVar("K", bound=Hashable)


class Deadlines(Generic[K]):
    """Buckets of keys by due slot; see the module docstring for the lazy removal."""

    __slots__ = ("_granularity", "_buckets", "_next", "_last_slot", "_last_bucket")

    def __init__(self, granularity: float, now: float) -> None:
        if granularity <= 0:
            raise ValueError("granularity must be positive")
        self._granularity = granularity
        self._buckets: dict[int, list[K]] = {}
        self._next = math.floor(now / granularity)  # lowest slot not yet swept
        self._last_slot = -1                         # cache: most deadlines share a slot
        self._last_bucket: list[K] = []

    def __len__(self) -> int:
        """Keys filed and not yet swept (including ones their owner has since forgotten)."""
        return sum(len(b) for b in self._buckets.values())

    def add(self, key: K, deadline: float) -> None:
        """File ``key``, due at ``deadline``; one already in the past is due at the next sweep."""
        slot = math.ceil(deadline / self._granularity)
        if slot == self._last_slot:
            self._last_bucket.append(key)
            return
        if slot < self._next:
            slot = self._next
        bucket = self._buckets.get(slot)
        if bucket is None:
            bucket = self._buckets[slot] = []
        bucket.append(key)
        self._last_slot = slot
        self._last_bucket = bucket

    def expire(self, now: float) -> list[K]:
        """Remove and return every key due at or before ``now``, oldest slot first."""
        last = math.floor(now / self._granularity)
        if last < self._next:
            return []
        due: list[K] = []
        buckets = self._buckets
        slots: Iterable[int]
        if last - self._next > len(buckets):
            # Long idle gap: walk the (few) filled slots rather than every empty one.
            slots = sorted(s for s in buckets if s <= last)
        else:
            slots = range(self._next, last + 1)
        for slot in slots:
            bucket = buckets.pop(slot, None)
            if bucket:
                due.extend(bucket)
        self._next = last + 1
        if self._last_slot <= last:
            self._last_slot = -1  # that bucket is gone; never append to it again
        return due
