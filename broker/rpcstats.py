"""Per-rpc outcome counts and latency histograms, recorded by the router. Pure.

Recorded at each call's one outcome, on the node the caller is connected to
(calls served for other nodes are counted there, not twice). Outcome counts are
exact; latency is observed for one call in ``SAMPLE`` on average, each call
chosen at random (by arrival order, a workload whose calls come round in a
multiple of ``SAMPLE`` left some rpcs never sampled), which keeps the per-call
cost to a dict lookup
and an increment for most calls. Names are bounded: past ``MAX_NAMES`` distinct
names (a client calling random names, say) the rest are counted under
``OTHER``, so memory and the metrics' label sets stay bounded.
"""

from __future__ import annotations

from rpcbus.schema import BOUNDS, bucket_of

SAMPLE = 8          # latency observed for 1 call in SAMPLE, on average

MAX_NAMES = 1000
OTHER = "_other"


class RpcStats:
    """One rpc name: calls answered, errors by code, and its sampled latency histogram."""

    __slots__ = ("ok", "errors", "buckets", "sum", "count")

    def __init__(self) -> None:
        self.ok = 0
        self.errors: dict[str, int] = {}
        self.buckets = [0] * (len(BOUNDS) + 1)
        self.sum = 0.0
        self.count = 0

    def error(self, code: str) -> None:
        self.errors[code] = self.errors.get(code, 0) + 1

    def observe(self, seconds: float) -> None:
        self.buckets[bucket_of(seconds)] += 1
        self.sum += seconds
        self.count += 1

    @property
    def failed(self) -> int:
        return sum(self.errors.values())

    @property
    def outcomes(self) -> dict[str, int]:
        return {"ok": self.ok, **self.errors} if self.ok else dict(self.errors)


class RpcStatsTable:
    def __init__(self) -> None:
        self.by_name: dict[str, RpcStats] = {}

    def get(self, name: str) -> RpcStats:
        """The stats of ``name`` (made on first use; OTHER's once MAX_NAMES are in use)."""
        stats = self.by_name.get(name)
        if stats is None:
            if len(self.by_name) >= MAX_NAMES:
                name = OTHER
            stats = self.by_name.get(name)
            if stats is None:
                stats = self.by_name[name] = RpcStats()
        return stats

    def busiest(self, limit: int) -> dict[str, list[int]]:
        """The ``limit`` rpcs with the most calls so far: name -> ``[ok, failed, *buckets]``,
        all cumulative (a reader takes differences, so a lost reading loses nothing), the
        buckets those of the sampled latency histogram (BOUNDS, then +Inf)."""
        rows = sorted(((s.ok + s.failed, name, s) for name, s in self.by_name.items()),
                      key=lambda row: (-row[0], row[1]))[:limit]
        return {name: [s.ok, s.failed, *s.buckets] for _, name, s in rows}
