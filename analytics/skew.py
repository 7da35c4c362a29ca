"""Clock skew: a node whose clock is off files its rows early or late (pure; no Spark).

Each node stamps its rows with its own clock, so a node running 1 h ahead makes a 2 h
history look 3 h long, and its load appears an hour after everyone else's. Two signs:

Against the majority: a node's offset from each other node is measured pair by pair,
and its offset from the cluster is the median of those and its own 0 (so one node off
among three or more is named, and the others are not).

- **ends**: the node's first window starts and its last window ends both off the other
  nodes' by the same amount (at least ``MIN_OFFSET`` s, the two within
  ``max(MIN_OFFSET, 10 %)`` of each other). Exact to a window, but only when the nodes
  ran over the same span (a cluster that runs all the time). Ends that both agree
  (within ``MIN_OFFSET``) are evidence the other way: the clocks agree, and the load
  is not looked at (two rpcs' bursts line up by chance more often than clocks drift).
- **load**: the node's calls per minute line up best with another's when shifted by a
  whole number of minutes (Pearson correlation at least ``MIN_CORRELATION`` there and
  ``MIN_GAIN`` better than unshifted, each node with calls in at least ``MIN_OVERLAP``
  of the compared minutes, and the shifted series overlapping over at least half the
  shorter one's minutes), and only between nodes whose spans overlap by ``MIN_OVERLAP``
  minutes unshifted (a node renamed mid-history continues another's load, it does not
  repeat it): callers spread their load over every node, so a burst shows on all of
  them in the same minute. To a minute.

With two nodes there is no majority: the finding names both (``relative_to``).
"""

from __future__ import annotations

import statistics
from typing import Any

MIN_OFFSET = 60.0        # s: smaller offsets are not reported
MIN_CORRELATION = 0.6
MIN_GAIN = 0.2
MAX_LAG = 180            # minutes searched either way
MIN_OVERLAP = 10         # minutes with calls each series needs where they are compared


def find(nodes: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """``nodes``: per node ``first`` (its first window's start), ``last`` (its last
    window's end), ``calls`` ({minute: calls}). Returns one finding per node whose clock
    looks off: node, offset_s (positive: ahead), method ("ends", "load" or both),
    relative_to, correlation (the best of its pairwise load comparisons, when made)."""
    names = sorted(nodes)
    if len(names) < 2:
        return []
    pairs: dict[tuple[str, str], tuple[float | None, float | None, float | None]] = {}
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            ends = _ends(nodes[a], nodes[b])
            load, corr = _load(nodes[a], nodes[b]) if ends != 0.0 else (None, None)
            pairs[(a, b)] = (ends, load, corr)
            pairs[(b, a)] = (None if ends is None else -ends, None if load is None else -load,
                             corr)
    out = []
    for name in names if len(names) > 2 else names[1:]:
        mine = [pairs[(name, other)] for other in names if other != name]
        ends = _majority([p[0] for p in mine])
        load = _majority([p[1] for p in mine])
        offset = ends if ends is not None else load
        if offset is None:
            continue
        corrs = [p[2] for p in mine if p[2] is not None]
        out.append({"node": name, "offset_s": round(offset, 1),
                    "method": "+".join(m for m, v in (("ends", ends), ("load", load))
                                       if v is not None),
                    "relative_to": "the other nodes" if len(names) > 2 else names[0],
                    "correlation": round(max(corrs), 3) if corrs else None})
    return out


def _majority(offsets: list[float | None]) -> float | None:
    """The offset from the cluster: the median of the pairwise offsets (None: 0) and the
    node's own 0; None when under ``MIN_OFFSET``."""
    if len(offsets) == 1:
        return offsets[0] or None
    middle = statistics.median([0.0, *(o or 0.0 for o in offsets)])
    return middle if abs(middle) >= MIN_OFFSET else None


def _ends(me: dict[str, Any], other: dict[str, Any]) -> float | None:
    """The offset both ends agree on; 0.0 when both are within ``MIN_OFFSET`` (the
    clocks agree); None when they tell nothing (different spans)."""
    d1 = float(me["first"] - other["first"])
    d2 = float(me["last"] - other["last"])
    if abs(d1) < MIN_OFFSET and abs(d2) < MIN_OFFSET:
        return 0.0
    if abs(d1) < MIN_OFFSET or abs(d2) < MIN_OFFSET or (d1 > 0) != (d2 > 0):
        return None
    if abs(d1 - d2) > max(MIN_OFFSET, 0.1 * max(abs(d1), abs(d2))):
        return None
    return (d1 + d2) / 2


def _load(me: dict[str, Any], other: dict[str, Any]) -> tuple[float | None, float | None]:
    """(offset in s, correlation there), or (None, correlation) when no shift explains
    the load better than none. Minutes without a row count 0 calls."""
    import numpy as np

    if not me["calls"] or not other["calls"]:
        return None, None
    lo = min(*me["calls"], *other["calls"])
    size = (max(*me["calls"], *other["calls"]) - lo) // 60 + 1
    mine, theirs = np.zeros(size), np.zeros(size)
    for series, calls in ((mine, me["calls"]), (theirs, other["calls"])):
        for m, n in calls.items():
            series[(m - lo) // 60] = n
    # only the minutes each series covers (its first to its last): outside, 0 is no data;
    # its first and last are left out too, partial where the node started or stopped
    # (lined up, two such edges correlate whatever the clocks)
    a0, a1 = _covered(me["calls"], lo)
    b0, b1 = _covered(other["calls"], lo)
    a0, a1, b0, b1 = a0 + 1, a1 - 1, b0 + 1, b1 - 1

    if min(a1, b1) - max(a0, b0) < MIN_OVERLAP:
        # they did not run at the same time: their loads are of different hours (a node
        # renamed mid-history: the new one's load goes on where the old one's ended), not
        # one load seen through two clocks
        return None, None
    need = max(MIN_OVERLAP, min(a1 - a0, b1 - b0) // 2)

    def corr(lag: int) -> float | None:
        start, end = max(a0, b0 + lag), min(a1, b1 + lag)    # mine[i] against theirs[i-lag]
        if end - start < need:
            return None
        x, y = mine[start:end], theirs[start - lag:end - lag]
        # a node that worked only a few of these minutes (a starved provider's node: one
        # burst, then idle) lines its burst up with anyone's busiest minute: no evidence
        if min(np.count_nonzero(x), np.count_nonzero(y)) < MIN_OVERLAP:
            return None
        if x.std() == 0 or y.std() == 0:   # a flat series correlates with nothing
            return None
        return float(np.corrcoef(x, y)[0, 1])

    at_zero = corr(0)
    best, best_lag = None, 0
    for lag in range(-MAX_LAG, MAX_LAG + 1):
        c = corr(lag)
        if c is not None and (best is None or c > best + 1e-9):
            best, best_lag = c, lag
    if best is None or best_lag == 0 or best < MIN_CORRELATION:
        return None, best
    if at_zero is not None and best - at_zero < MIN_GAIN:
        return None, best
    return best_lag * 60.0, best


def _covered(calls: dict[int, Any], lo: int) -> tuple[int, int]:
    """The index range [first, last + 1) of a series' minutes."""
    return (min(calls) - lo) // 60, (max(calls) - lo) // 60 + 1
