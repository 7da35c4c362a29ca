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

**Leaps** (``leaps``): a clock that *stepped* forward (an NTP step, a VM resumed) leaves
a gap in its node's rows, while the other nodes' rows go on through it, and from the
step on stamps everything that much later. A gap of ``L`` s (at least ``MIN_OFFSET``;
from the end of the last window before it to the start of the first after) is a leap
when, moved back by ``L``, the rows after it fit the cluster: **ends** (the last gap
only: the ends tell the steps' sum), the node's last window then ends with the other
nodes' latest (within ``max(MIN_OFFSET, 10 %)``) where unmoved it ends past it; or
**load**, its calls per minute from the gap to the next gap, moved back by ``L`` in
whole minutes, line up with the other nodes' together (``MIN_CORRELATION``, and
``MIN_GAIN`` better than unmoved where unmoved can be compared). Load that lines up
unmoved says the node paused, not stepped, whatever the ends say. The other nodes must
have rows in half the gap's minutes or more (when the whole cluster stopped, nothing
tells a step from a pause). Gaps are judged first to last, each after the earlier
leaps are taken back. A backward step is not
found: its rows fall on minutes the node already wrote, and are added to them.
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


def leaps(nodes: dict[str, dict[int, tuple[float, float, float]]]) -> list[dict[str, Any]]:
    """``nodes``: per node, per minute in which it has rows: (calls, its first window's
    start, its last window's end). Returns one finding per leap: node, offset_s (the gap:
    how far the clock stepped forward), shift_s (the same in whole minutes: what the
    rows from the step on are moved back by), since (the end of the node's last window
    before the step: when it stepped), from_minute (the first minute after it, on the
    node's own clock), method, relative_to, correlation (of the load, when compared)."""
    out = []
    for node in sorted(nodes):
        others = [m for name, m in nodes.items() if name != node and m]
        mine = nodes[node]
        if not others or len(mine) < 2:
            continue
        cluster: dict[int, float] = {}
        for m in others:
            for minute, (calls, _, _) in m.items():
                cluster[minute] = cluster.get(minute, 0.0) + calls
        cluster_end = max(we for m in others for _, _, we in m.values())
        minutes = sorted(mine)
        gaps = [i for i in range(1, len(minutes)) if minutes[i] - minutes[i - 1] > 60
                and mine[minutes[i]][1] - mine[minutes[i - 1]][2] >= MIN_OFFSET]
        earlier = 0    # what the leaps found before this gap moved its rows back by
        for k, i in enumerate(gaps):
            before, after = minutes[i - 1], minutes[i]
            gap = mine[after][1] - mine[before][2]
            inside = range(before + 60, after, 60)
            if 2 * sum(1 for t in inside if t - earlier in cluster) < len(inside):
                continue
            shift = round(gap / 60) * 60
            # the ends tell the steps' sum: they speak for the last gap only
            ends = k == len(gaps) - 1 and _stepped_ends(mine[minutes[-1]][2] - earlier, gap,
                                                        cluster_end)
            segment = minutes[i:gaps[k + 1] if k + 1 < len(gaps) else len(minutes)]
            load, corr = _stepped_load({t - earlier: mine[t][0] for t in segment}, cluster,
                                       shift)
            if load or (load is None and ends):
                method = "+".join(m for m, v in (("ends", ends), ("load", load)) if v)
                out.append({"node": node, "offset_s": round(gap, 1),
                            "shift_s": float(shift), "since": mine[before][2] - earlier,
                            "from_minute": after, "method": method,
                            "relative_to": "the other nodes", "correlation": corr})
                earlier += shift
    return out


def _stepped_ends(last: float, gap: float, cluster_end: float) -> bool:
    """The node's rows end (at ``last``) past the cluster's by about ``gap``."""
    return (last - cluster_end >= MIN_OFFSET
            and abs(last - gap - cluster_end) <= max(MIN_OFFSET, 0.1 * gap))


def _stepped_load(after: dict[int, float], cluster: dict[int, float], shift: int
                  ) -> tuple[bool | None, float | None]:
    """Whether the calls per minute ``after`` a gap line up with the ``cluster``'s moved
    back by ``shift`` s (True), unmoved (False), or neither (None); and the correlation
    moved back. The first and last minutes are left out (partial)."""
    import numpy as np

    kept = sorted(after)[1:-1]

    def corr(by: int) -> float | None:
        pairs = [(after[t], cluster[t - by]) for t in kept if t - by in cluster]
        if len(pairs) < MIN_OVERLAP:
            return None
        x, y = np.array(pairs).T
        if min(np.count_nonzero(x), np.count_nonzero(y)) < MIN_OVERLAP:
            return None
        if x.std() == 0 or y.std() == 0:
            return None
        return float(np.corrcoef(x, y)[0, 1])

    moved, unmoved = corr(shift), corr(0)
    if moved is not None and moved >= MIN_CORRELATION and (
            unmoved is None or moved - unmoved >= MIN_GAIN):
        return True, round(moved, 3)
    silent = unmoved is not None and unmoved >= MIN_CORRELATION   # it lines up unmoved
    return (False if silent else None), None if moved is None else round(moved, 3)


def taken_back(clocks: dict[str, dict[int, Any]], leaps: list[dict[str, Any]]
               ) -> tuple[int, tuple[float, float]]:
    """The newest minute and the span (first window start, last window end) of the
    usable rows, each stepped clock's taken back from its step on."""
    newest, first, last = 0, float("inf"), float("-inf")
    for node, by_minute in clocks.items():
        steps = [(leap["from_minute"], int(leap["shift_s"])) for leap in leaps
                 if leap["node"] == node]
        for minute, (_, start, end) in by_minute.items():
            back = sum(shift for since, shift in steps if minute >= since)
            newest = max(newest, minute - back)
            first, last = min(first, start - back), max(last, end - back)
    return newest, (first, last) if clocks else (0.0, 0.0)
