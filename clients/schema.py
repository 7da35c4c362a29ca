"""What nodes record, shared by the node and the offline analytics: the latency buckets
and the load history's version and outcomes. Constants only (imported by the Spark job's
executors, so it must stay free of the node's dependencies)."""

from __future__ import annotations

from bisect import bisect_left
from enum import IntEnum

#: Latency bucket upper bounds in seconds (Prometheus ``le``); the last bucket is +Inf.
#: The node's metrics and the load history use the same ones, so they merge exactly.
BOUNDS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
          0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


def bucket_of(seconds: float) -> int:
    """The histogram bucket of a latency."""
    return bisect_left(BOUNDS, seconds)


#: The load history's row schema (docs/history.md).
HISTORY_SCHEMA_VERSION = 1


class Outcome(IntEnum):
    """How an attempt at a provider ended, as the load history counts it (the index into a
    row's outcome counts; ``OK`` is derived, never counted one by one)."""

    OK = 0
    REJECTED = 1
    ERRORS = 2
    ACK_TIMEOUTS = 3
    RESPONSE_TIMEOUTS = 4


#: The history's outcome column names, by ``Outcome``.
OUTCOMES = tuple(o.name.lower() for o in Outcome)
