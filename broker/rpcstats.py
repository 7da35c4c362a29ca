"""Per-rpc outcome counts and latency histograms, recorded by the router. Pure.

Recorded once per call, at its one outcome, on the node the caller is
connected to (calls served for other nodes are counted there, not twice).
Cost per call: one clock read, a dict lookup, a ``bisect`` over the bucket
bounds and three increments. Names are bounded: past ``MAX_NAMES`` distinct
names (a client calling random names, say) the rest are counted under
``OTHER``, so memory and the metrics' label sets stay bounded.
"""

from __future__ import annotations

from bisect import bisect_left

#: Latency bucket upper bounds in seconds (Prometheus ``le``); the last bucket is +Inf.
BOUNDS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
          0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
MAX_NAMES = 1000
OTHER = "_other"


class RpcStats:
    """One rpc name: outcomes by code ("ok" for a response) and its latency histogram."""

    __slots__ = ("outcomes", "buckets", "sum", "count")

    def __init__(self) -> None:
        self.outcomes: dict[str, int] = {}
        self.buckets = [0] * (len(BOUNDS) + 1)
        self.sum = 0.0
        self.count = 0


class RpcStatsTable:
    def __init__(self) -> None:
        self.by_name: dict[str, RpcStats] = {}

    def record(self, name: str, code: str, seconds: float) -> None:
        stats = self.by_name.get(name)
        if stats is None:
            if len(self.by_name) >= MAX_NAMES:
                name = OTHER
            stats = self.by_name.get(name)
            if stats is None:
                stats = self.by_name[name] = RpcStats()
        outcomes = stats.outcomes
        outcomes[code] = outcomes.get(code, 0) + 1
        stats.buckets[bisect_left(BOUNDS, seconds)] += 1
        stats.sum += seconds
        stats.count += 1
