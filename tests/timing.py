"""One timing unit for the suite's waits (as websockets' tests scale theirs by ``MS``).

``RPCBUS_TEST_UNIT`` (default 1) multiplies every wait a test takes from here and the
per-test timeout (tests/conftest.py): on a machine slower than the one the figures were
set on, ``RPCBUS_TEST_UNIT=2`` doubles them all rather than each test growing its own.
Hypothesis runs without its per-example deadline (a loaded host is not a slow example).
"""

from __future__ import annotations

import os

from hypothesis import settings

UNIT = float(os.environ.get("RPCBUS_TEST_UNIT", "1"))
assert UNIT > 0, "RPCBUS_TEST_UNIT must be a positive number"


def wait(seconds: float) -> float:
    """``seconds`` as this machine's waits: times ``UNIT``."""
    return seconds * UNIT


settings.register_profile("rpcbus", deadline=None)
settings.load_profile("rpcbus")
