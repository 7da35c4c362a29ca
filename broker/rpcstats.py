"""Per-rpc outcome counts and latency histograms, recorded by the router. Pure.

Recorded at each call's one outcome, on the node the caller is connected to
(calls served for other nodes are counted there, not twice). Every call's latency
is observed, by outcome, so a histogram's count is its outcome's count (a sampled
histogram disagreed with the counts beside it on the metrics page). Names are
bounded: past ``MAX_NAMES`` distinct names (a client calling random names, say) the
rest are counted under ``OTHER``, so memory and the metrics' label sets stay bounded.
"""

from __future__ import annotations

from rpcbus.schema import BOUNDS, bucket_of

MAX_NAMES = 1000
OTHER = "_other"
EMPTY = [0] * (len(BOUNDS) + 1)


class RpcStats:
    """One rpc name: calls answered and their latency histogram (``buckets``, ``sum``),
    calls failed by code and theirs (``errors``: code -> [count, sum, *buckets])."""

    __slots__ = ("ok", "errors", "buckets", "sum")

    def __init__(self) -> None:
        self.ok = 0
        self.errors: dict[str, list[float]] = {}
        self.buckets = [0] * (len(BOUNDS) + 1)
        self.sum = 0.0

    def answered(self, seconds: float) -> None:
        self.ok += 1
        self.buckets[bucket_of(seconds)] += 1
        self.sum += seconds

    def error(self, code: str, seconds: float) -> None:
        row = self.errors.get(code)
        if row is None:
            row = self.errors[code] = [0, 0.0, *EMPTY]
        row[0] += 1
        row[1] += seconds
        row[2 + bucket_of(seconds)] += 1

    @property
    def failed(self) -> int:
        return sum(int(row[0]) for row in self.errors.values())

    @property
    def outcomes(self) -> dict[str, int]:
        """Calls by outcome: "ok" or an error code."""
        counts = {code: int(row[0]) for code, row in self.errors.items()}
        return {"ok": self.ok, **counts} if self.ok else counts

    def histograms(self) -> dict[str, tuple[list[int], float]]:
        """Per outcome ("ok" or an error code): the latency buckets (BOUNDS, then +Inf)
        and their sum of seconds."""
        out = {code: ([int(n) for n in row[2:]], row[1]) for code, row in self.errors.items()}
        return {"ok": (self.buckets, self.sum), **out} if self.ok else out

    def all_buckets(self) -> list[int]:
        """Every call's latency buckets, whatever its outcome."""
        total = list(self.buckets)
        for row in self.errors.values():
            for i, n in enumerate(row[2:]):
                total[i] += int(n)
        return total


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

    def errors_of(self, names: list[str]) -> dict[str, dict[str, int]]:
        """Per rpc of ``names`` that failed any call: its failed calls by code so far."""
        out = {}
        for name in names:
            stats = self.by_name.get(name)
            if stats is not None and stats.errors:
                out[name] = {code: int(row[0]) for code, row in stats.errors.items()}
        return out

    def busiest(self, limit: int) -> dict[str, list[int]]:
        """The ``limit`` rpcs with the most calls so far: name -> ``[ok, failed, *buckets]``,
        all cumulative (a reader takes differences, so a lost reading loses nothing), the
        buckets every call's latency (BOUNDS, then +Inf), whatever its outcome."""
        rows = sorted(((s.ok + s.failed, name, s) for name, s in self.by_name.items()),
                      key=lambda row: (-row[0], row[1]))[:limit]
        return {name: [s.ok, s.failed, *s.all_buckets()] for _, name, s in rows}
