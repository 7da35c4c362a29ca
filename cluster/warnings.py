"""Warnings a flood repeats, logged sparingly (the node's and the cluster link's)."""

from __future__ import annotations

import time
from typing import Any, Callable


class SparseWarnings:
    """Logs each event at most once per ``every`` seconds, with ``held_back``: how many of
    it were not logged since the last line (the counters in /stats have them all)."""

    def __init__(self, log: Any, every: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._log = log
        self._every = every
        self._clock = clock
        self._last: dict[str, tuple[float, int]] = {}   # event -> (logged at, held back)

    def warn(self, event: str, **fields: Any) -> None:
        now = self._clock()
        last, held = self._last.get(event, (-self._every, 0))
        if now - last >= self._every:
            self._log.warning(event, held_back=held, **fields)
            self._last[event] = (now, 0)
        else:
            self._last[event] = (last, held + 1)
