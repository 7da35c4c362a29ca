"""A stream's flow control, on each side of it. Pure: no asyncio, no sockets.

A caller opens a stream with a window (STREAM's ``window``): its provider may send that
many parts ahead of the caller's reading. Every part costs the provider one credit; the
caller gives credit back (CREDIT) as its application reads parts, half a window at a
time. So a caller that stops reading stops its provider within a window, and nobody
holds more than a window of one stream's parts: not the caller (``Inflow``), not a node
(the router counts the same credit and ends a stream whose provider overruns it), not
the provider (``Outflow``: the shell advances its generator only with credit).
"""

from __future__ import annotations

from collections import deque
from typing import Any

DEFAULT_WINDOW = 64


class Inflow:
    """The caller's side of one stream: the parts read ahead of the application, and
    the count of parts read to give back as credit."""

    __slots__ = ("window", "parts", "taken", "credited")

    def __init__(self, window: int) -> None:
        self.window = window
        self.parts: deque[Any] = deque()
        self.taken = 0     # parts the application took
        self.credited = 0  # ``taken`` as last told (CREDIT)

    def arrived(self, data: Any) -> bool:
        """A part came; False when it is past the window (the node broke the flow
        control: the stream is to end with an error)."""
        if self.taken + len(self.parts) >= self.credited + self.window:
            return False
        self.parts.append(data)
        return True

    def take(self) -> tuple[Any, int]:
        """The next part (one must have arrived) and the CREDIT to send now: the parts
        taken in all, every half window (at least every part); 0: none yet."""
        part = self.parts.popleft()
        self.taken += 1
        if self.taken - self.credited >= (self.window + 1) // 2:
            self.credited = self.taken
            return part, self.taken
        return part, 0


class Outflow:
    """The provider's side of one stream: the parts sent, and how many of them the
    caller has read (its CREDITs); it may send up to the window beyond those. ``waiter``
    is the shell's handle to wake when credit comes (None: it is not waiting)."""

    __slots__ = ("window", "sent", "read", "waiter")

    def __init__(self, window: int) -> None:
        self.window = window
        self.sent = 0
        self.read = 0
        self.waiter: Any = None

    @property
    def credit(self) -> int:
        """The parts it may send now."""
        return self.read + self.window - self.sent

    def granted(self, read: int) -> Any:
        """CREDIT: the caller has read ``read`` parts in all. The waiter to wake, or None
        (an older count changes nothing)."""
        if read <= self.read:
            return None
        self.read = read
        waiter, self.waiter = self.waiter, None
        return waiter
