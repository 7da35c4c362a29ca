"""Fixed-window rate limits per user (pure; the clock comes in from the caller).

As ThreeFold RMB's limiter does: a window of ``window`` seconds allows
``max_messages`` requests and ``max_bytes`` bytes received; over either, each
further request in that window is refused (the session answers it
RATE_LIMITED) and the connection stays. Answers a provider sends (RESPONSE,
ACCEPT, REJECT, ERROR) count in the bytes but are never refused: refusing them
would fail other users' calls. A limit of 0 means none.
"""

from __future__ import annotations

_NO_LIMIT = float("inf")


class WindowLimiter:
    """The counters of one user (shared by all of that user's connections)."""

    __slots__ = ("window", "max_messages", "max_bytes", "end", "messages", "bytes",
                 "refused", "warned_window", "refusal")

    def __init__(self, window: float, max_messages: int, max_bytes: int) -> None:
        self.window = window
        self.max_messages = max_messages or _NO_LIMIT
        self.max_bytes = max_bytes or _NO_LIMIT
        self.end = 0.0
        self.messages = 0
        self.bytes = 0
        self.refused = 0            # requests refused, all windows
        self.warned_window = -1.0   # the window a warning was last logged in
        self.refusal = ""           # the RATE_LIMITED text of that window (made once)

    def received(self, now: float, nbytes: int) -> None:
        """A frame of ``nbytes`` arrived."""
        if now >= self.end:
            self._next_window(now)
        self.bytes += nbytes

    def take(self, now: float, count: int = 1) -> bool:
        """``count`` requests (a call_all: one per provider it reaches): True when they are
        within the limits, False when they must be refused."""
        if now >= self.end:
            self._next_window(now)
        self.messages += count
        if self.messages <= self.max_messages and self.bytes <= self.max_bytes:
            return True
        self.refused += 1
        return False

    def first_refusal_in_window(self) -> bool:
        """True once per window: when a refusal is worth a log line."""
        if self.warned_window == self.end:
            return False
        self.warned_window = self.end
        return True

    def _next_window(self, now: float) -> None:
        self.end = now + self.window
        self.messages = 0
        self.bytes = 0
