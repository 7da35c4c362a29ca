"""What checks that fail may cost: logins refused (broker/gate.py), batches on the bus
that do not open (cluster/bus.py). Pure; the clock comes in as ``now``."""

from __future__ import annotations


class CheckBudget:
    """The CPU that checks which *fail* may take: node-wide ``share`` of one core, and
    ``share / 2`` for any one source, so two sources at least share it. Each failed
    check's cost is spent as debt that drains at those rates; while the node's debt is
    over ``burst`` (or the source's over ``burst / 2``), checks for that source are not
    made. Sources whose checks did not fail lately are never held by it."""

    __slots__ = ("share", "burst", "debt", "at", "_by_address", "_addresses")

    def __init__(self, share: float, burst: float, addresses: int = 4096) -> None:
        assert share > 0 and burst > 0, (share, burst)
        self.share, self.burst = share, burst
        self.debt, self.at = 0.0, 0.0
        self._by_address: dict[str, tuple[float, float]] = {}  # address -> (debt, at)
        self._addresses = addresses

    def allows(self, address: str, now: float) -> bool:
        """A check for ``address`` (a source) may run at ``now``."""
        if self.debt - self.share * (now - self.at) > self.burst:
            return False
        debt, at = self._by_address.get(address, (0.0, now))
        return debt - self.share / 2 * (now - at) <= self.burst / 2

    def spend(self, address: str, seconds: float, now: float) -> None:
        """A check for ``address`` failed at ``now``, having taken ``seconds`` of CPU."""
        self.debt = max(self.debt - self.share * (now - self.at), 0.0) + seconds
        self.at = now
        by = self._by_address
        debt, at = by.pop(address, (0.0, now))
        if len(by) >= self._addresses:  # the oldest address forgotten
            del by[next(iter(by))]
        by[address] = (max(debt - self.share / 2 * (now - at), 0.0) + seconds, now)
