"""Exponential backoff with full jitter, as a small object to pass in (like redis-py's)."""

from __future__ import annotations

import random
from typing import Callable


class Backoff:
    """``next()`` gives the delay before the next attempt; ``reset()`` after a success."""

    def __init__(self, minimum: float = 0.1, maximum: float = 5.0,
                 rand: Callable[[], float] = random.random) -> None:
        self.minimum = minimum
        self.maximum = maximum
        self._rand = rand
        self._attempt = 0

    def next(self) -> float:
        ceiling = min(self.maximum, self.minimum * 2.0 ** min(self._attempt, 60))
        self._attempt += 1
        return self.minimum / 2 + self._rand() * (ceiling - self.minimum / 2)

    def reset(self) -> None:
        self._attempt = 0
