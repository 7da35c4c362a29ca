"""Discovery: what the cluster provides, for ``client.rpcs()`` and ``client.providers(name)``
(DISCOVER, docs/protocol.md). Pure: the node shell hands in what it knows.

Each node measures its own providers per rpc over about the last minute (``MinuteStats``,
one per provider and name: calls, errors, and the latency of the attempts the router
times, one in 8 under load) and tells the cluster in every heartbeat (``provider_view``:
the busiest rpcs, up to 8 providers each); the node a client asks answers from its own
providers and the other nodes' last heartbeats, with no round trip: a name too little
provided to be in another node's heartbeat shows that node's provider count only. A user
sees only the names it may call.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Any, Callable

from rpcbus.schema import BOUNDS

HALF = 30.0  # s: the window is the current half and the one before (30-60 s)
LAT_STEP = 0.1  # ``seen``: of the way down to each timed attempt's time (up: at once)
_EMPTY = (0,) * (len(BOUNDS) + 1)


class MinuteStats:
    """One provider connection's figures for one rpc (the router keeps one per name it
    provides): attempts sent (``sent``), a timed attempt's time (``seen``: peak EWMA, up
    at once, down ``LAT_STEP`` of the way), and over about the last minute, in two
    halves of ``HALF`` seconds, errors and the latency buckets of its timed attempts.
    The attempts under way are not kept here (it would cost every call): the router
    counts them from its attempts table when it reads the figures. It updates the
    fields in place on its hot path (``sample`` is what it inlines)."""

    __slots__ = ("buckets", "before", "errors", "errors_before", "mark", "mark_before",
                 "sent", "seen", "since")

    def __init__(self, now: float = 0.0) -> None:
        self.buckets = [0] * (len(BOUNDS) + 1)
        self.before: tuple[int, ...] = _EMPTY
        self.errors = self.errors_before = 0
        self.mark = self.mark_before = 0   # attempts ended as of the halves' starts
        self.sent = 0                      # attempts sent
        self.seen = 0.0                    # s a timed attempt takes, smoothed
        self.since = now                   # when the provider began to provide the rpc

    def sample(self, seconds: float) -> None:
        """A timed attempt took ``seconds``."""
        self.buckets[bisect_left(BOUNDS, seconds)] += 1
        seen = self.seen
        self.seen = seconds if seconds > seen else seen + LAT_STEP * (seconds - seen)

    def rotate(self, held: int) -> None:
        """Every ``HALF`` s (the router's tick): the current half becomes the one before;
        ``held``: attempts under way now."""
        held = min(held, self.sent)  # provided again: attempts sent before count there
        self.before, self.buckets = tuple(self.buckets), [0] * (len(BOUNDS) + 1)
        self.errors_before, self.errors = self.errors, 0
        self.mark_before, self.mark = self.mark, self.sent - held

    def figures(self, now: float, rotated: float, held: int) -> list[Any]:
        """[calls/s, ms, outstanding, calls, errors, p50 ms, p99 ms] with ``held``
        attempts under way: calls ended and errors over the two halves (the current
        one began at ``rotated``), calls/s over the time they span (at least a second),
        the smoothed time of an attempt, and the quantiles of the timed ones (None where
        none was timed)."""
        held = min(held, self.sent)  # provided again: attempts sent before count there
        assert self.sent >= self.mark >= self.mark_before >= 0
        calls = max(self.sent - held - self.mark_before, 0)
        span = max(now - max(self.since, rotated - HALF), 1.0)
        merged = [a + b for a, b in zip(self.buckets, self.before, strict=True)]
        return [round(calls / span, 1), round(self.seen * 1000, 2), held, calls,
                self.errors + self.errors_before,
                _ms(quantile(merged, 0.5)), _ms(quantile(merged, 0.99))]


def quantile(buckets: list[int], q: float) -> float | None:
    """The ``q`` quantile of latency ``buckets`` (BOUNDS, then +Inf), interpolated within
    its bucket as the dashboard does; None for no samples."""
    total = sum(buckets)
    if not total:
        return None
    want, seen = q * total, 0.0
    for i, n in enumerate(buckets):
        if n and seen + n >= want:
            lo = BOUNDS[i - 1] if i else 0.0
            hi = BOUNDS[i] if i < len(BOUNDS) else BOUNDS[-1]
            return lo + (hi - lo) * (want - seen) / n
        seen += n
    return BOUNDS[-1]


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


def rpcs(here: str, local: dict[str, int], heartbeats: dict[str, dict[str, Any]],
         cached: dict[str, dict[str, float]], may_call: Callable[[str], bool]) -> list[Any]:
    """Every name provided in the cluster that the user may call, with its providers per
    node: ``[{"rpc", "providers", "nodes": {node: count}}]`` by name. ``local``: this
    node's counts; ``heartbeats``: the others' last ``providers`` counts; ``cached``: what
    this node learned of names the heartbeats leave out (its discovery cache)."""
    nodes: dict[str, dict[str, float]] = {}
    for name, mine in local.items():
        nodes.setdefault(name, {})[here] = mine
    for node, counts in heartbeats.items():
        for name, told in counts.items():
            if told:
                nodes.setdefault(name, {})[node] = told
    for name, by_node in cached.items():
        for node, learned in by_node.items():
            if learned:
                nodes.setdefault(name, {}).setdefault(node, learned)
    return [{"rpc": name, "providers": sum(by_node.values()), "nodes": by_node}
            for name, by_node in sorted(nodes.items()) if may_call(name)]


def providers(name: str, here: str, mine: list[list[Any]],
              views: dict[str, dict[str, Any]], counts: dict[str, float],
              weight: Callable[[str], float]) -> list[dict[str, Any]]:
    """The providers of ``name`` across the cluster: this node's (``mine``: its
    ``provider_view`` rows) and each other node's from its last heartbeat (``views``:
    node -> its ``provider_view``), a node whose heartbeat leaves the name out by its
    provider count alone (``counts``). Each: provider, node, weight (this node's weights
    file; 1 without one), calls/s, ms an attempt takes, attempts outstanding, and over
    about the last minute calls, errors, p50 and p99 ms (None: not measured)."""
    out = [_row(row, here, weight) for row in mine]
    for node, view in sorted(views.items()):
        rows = view.get(name) if isinstance(view, dict) else None
        if rows:
            out += [_row(row, node, weight) for row in rows if isinstance(row, list) and row]
        elif counts.get(node):
            out.append({"provider": None, "node": node, "count": counts[node]})
    return out


def _row(row: list[Any], node: str, weight: Callable[[str], float]) -> dict[str, Any]:
    """A ``provider_view`` row: [name, calls/s, ms, outstanding, calls, errors, p50, p99,
    label] (a node of an older release sends the first four)."""
    name = str(row[0])
    figures = list(row[4:8]) if len(row) >= 8 else [None] * 4
    return {"provider": str(row[8]) if len(row) > 8 else name, "node": node,
            "weight": weight(name),
            "calls_per_s": _at(row, 1), "ms": _at(row, 2), "outstanding": _at(row, 3),
            "calls": figures[0], "errors": figures[1], "p50_ms": figures[2],
            "p99_ms": figures[3]}


def _at(row: list[Any], i: int) -> Any:
    return row[i] if len(row) > i else None
