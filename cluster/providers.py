"""Which other nodes provide an rpc, and how many providers each has. Pure: ``now`` passed in.

Entries live in ``cachetools.TTLCache``s (``ttl`` for names someone provides,
the short ``negative_ttl`` for names nobody does) for their time-to-live, and
are mirrored in a plain dict that the hot path reads: one dict lookup per call
instead of a TTLCache lookup (≈ 1 µs, 16 % of a node's CPU in a prototype).
``expire(now)``, run on every tick, keeps the mirror equal to the caches.

An entry is complete knowledge: every live node's count at query time, kept
up to date by PROVIDER_UPDATE messages. So a query finishes when every node
membership calls live has answered (0 included) — a healthy cluster never
waits for the query timeout. Its timeout runs from when Redis took the query
(``published``), not from the miss. At the timeout, a query some node has not
answered is not "nobody provides it": with a provider among the answers, those
are stored with the short TTL (asked afresh soon); with none, it is asked again
while calls wait for it (``expire``'s ``waiting``), and nothing negative is
stored. A node that dies leaves every query (membership), which then completes.
Concurrent misses for one name share one query.

A node that stops as planned hands its providers over: they reconnect to another
node and provide there a moment later. Names it leaves with no provider anywhere
are ``moving`` until a provider reappears (``on_update``, or the owner's own
provider) or the handover bound passes (``expire``); calls wait for them meanwhile
instead of failing NO_PROVIDER in that gap. The bound follows how long names really
took to reappear (``HandoverWait``): on a slow host providers take longer to move. It
runs from when the stopping node let its clients go: while it still drains (its
providers may not have been told yet), its names do not stop moving, and when it
leaves (``released``) their bound starts again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from cachetools import TTLCache

_MAX_NAMES = 1_000_000  # far above any real count: entries leave by TTL, not by size
_UNSETTLED = "\0unsettled"  # an answer that never comes: such a query ends at its deadline
_UNPUBLISHED = 5.0  # s: a query's deadline until Redis has taken it (``published``)


class Entry:
    """Remote providers of one name: ``targets`` is [(node, count)] with count > 0."""

    __slots__ = ("counts", "targets", "peers")

    def __init__(self, counts: dict[str, float]) -> None:
        self.counts = {n: c for n, c in counts.items() if c > 0}
        self.targets = list(self.counts.items())
        self.peers: list[Any] | None = None  # the owner's memo of targets as its peer objects

    def set(self, node: str, count: float) -> None:
        if count > 0:
            self.counts[node] = count
        else:
            self.counts.pop(node, None)
        self.targets = list(self.counts.items())
        self.peers = None


@dataclass
class Query:
    expected: set[str]
    deadline: float
    answers: dict[str, float] = field(default_factory=dict)
    settled_at: float = 0.0   # the deadline is never before this (a node just joined)


class HandoverWait:
    """How long calls wait for a moving name's providers to reappear: RFC 6298's shape
    (as the router's ack timeouts) over the times names took to reappear, ``srtt + 4 *
    rttvar`` between ``floor`` (``cluster.handover_wait``, what a quick host gets) and
    ``ceiling`` (``cluster.handover_wait_max``). Calls never wait past their deadline."""

    __slots__ = ("floor", "ceiling", "wait", "_srtt", "_rttvar")

    def __init__(self, floor: float, ceiling: float) -> None:
        assert 0 <= floor <= ceiling, (floor, ceiling)
        self.floor = floor
        self.ceiling = ceiling
        self.wait = floor
        self._srtt = 0.0
        self._rttvar = 0.0

    def took(self, seconds: float) -> None:
        """A moving name's provider reappeared ``seconds`` after it went."""
        if self._srtt == 0.0:
            self._srtt, self._rttvar = seconds, seconds / 2
        else:
            self._rttvar += 0.25 * (abs(self._srtt - seconds) - self._rttvar)
            self._srtt += 0.125 * (seconds - self._srtt)
        self.wait = min(self.ceiling, max(self.floor, self._srtt + 4 * self._rttvar))


class ProviderCache:
    def __init__(self, ttl: float, negative_ttl: float, query_timeout: float,
                 handover: HandoverWait | None = None) -> None:
        self._now = 0.0
        self.query_timeout = query_timeout
        self._positive: TTLCache[str, Entry] = TTLCache(_MAX_NAMES, ttl, timer=self._clock)
        self._negative: TTLCache[str, Entry] = TTLCache(_MAX_NAMES, negative_ttl,
                                                        timer=self._clock)
        self.entries: dict[str, Entry] = {}   # the hot path's mirror
        self.queries: dict[str, Query] = {}
        self.queries_sent = 0
        self.moving: dict[str, float] = {}    # name -> until when its providers may reappear
        self._moved_at: dict[str, float] = {}  # name -> when it started moving
        self._moved_from: dict[str, str] = {}  # name -> the stopping node it left
        self.handover = handover if handover is not None else HandoverWait(0.0, 0.0)

    def _clock(self) -> float:
        return self._now

    def begin_query(self, name: str, expected: list[str], now: float,
                    settled_at: float = 0.0) -> tuple[bool, bool]:
        """A miss for ``name``: (publish a query?, already complete?).

        With no other live node there is nothing to ask: the entry is made
        (empty) at once. Before ``settled_at`` (a node that just joined and
        may not know every peer yet) the answers are collected until then.
        """
        if name in self.queries:
            return False, False
        self._now = now
        if now < settled_at:
            self.queries[name] = Query({_UNSETTLED, *expected},
                                       max(settled_at, now + _UNPUBLISHED), settled_at=settled_at)
            self.queries_sent += 1
            return True, False
        if not expected:
            self._store(name, {})
            return False, True
        self.queries[name] = Query(set(expected), now + _UNPUBLISHED)
        self.queries_sent += 1
        return True, False

    def published(self, name: str, now: float) -> None:
        """Redis has taken the query for ``name``: its timeout runs from ``now``."""
        query = self.queries.get(name)
        if query is not None:
            query.deadline = max(query.settled_at, now + self.query_timeout)

    def on_update(self, node: str, name: str, count: float, now: float) -> bool:
        """A PROVIDER_UPDATE from ``node``; True when it completed a query for ``name``, or
        a provider of a ``moving`` name reappeared (either way, waiting calls go on)."""
        self._now = now
        if count > 0 and self.reappeared(name, now) and name not in self.queries:
            entry = self.entries.get(name)
            if entry is None:
                self._store(name, {node: count})
            else:
                entry.set(node, count)
                self._store(name, entry.counts)
            return True
        query = self.queries.get(name)
        if query is not None:
            query.answers[node] = count
            query.expected.discard(node)
            if not query.expected:
                del self.queries[name]
                self._store(name, query.answers)
                return True
            return False
        entry = self.entries.get(name)
        if entry is not None:
            was_negative = not entry.counts
            entry.set(node, count)
            if was_negative and entry.counts:
                self._store(name, entry.counts)  # now a positive entry, with the long TTL
        return False

    def node_gone(self, node: str, now: float, handover: bool = False) -> list[str]:
        """``node`` left: drop it everywhere; returns names whose queries it completed.
        ``handover``: its providers may reappear elsewhere (it stops as planned, or it
        died), and the names it leaves with no provider are ``moving`` (``hold``)."""
        self._now = now
        for name, entry in self.entries.items():
            if node in entry.counts:
                entry.set(node, 0)
                if handover and not entry.counts:
                    self.hold(name, now, node)
        done = []
        for name, query in list(self.queries.items()):
            query.answers.pop(node, None)
            query.expected.discard(node)
            if not query.expected:
                del self.queries[name]
                self._store(name, query.answers)
                done.append(name)
        return done

    def hold(self, name: str, now: float, origin: str = "") -> None:
        """``name`` has no provider now, but one may be on its way: it is ``moving`` for
        the handover wait (``HandoverWait``); ``origin``, the node it leaves, if known."""
        if self.handover.wait > 0:
            self.moving[name] = now + self.handover.wait
            self._moved_at.setdefault(name, now)
            if origin:
                self._moved_from[name] = origin

    def released(self, node: str, now: float) -> None:
        """``node``, stopping as planned, has gone: it let its clients go by now, so the
        names moving off it wait a whole handover wait from now."""
        if not self._moved_from:
            return
        until = now + self.handover.wait
        for name, origin in self._moved_from.items():
            if origin == node and name in self.moving and self.moving[name] < until:
                self.moving[name] = until

    def reappeared(self, name: str, now: float) -> bool:
        """A provider of ``name`` appeared: True when it was moving (it no longer is).
        How long it took since it went moves the handover wait, also when it came after
        the wait (up to the ceiling): then the wait was too short."""
        since = self._moved_at.pop(name, None)
        if since is not None and now - since <= self.handover.ceiling:
            self.handover.took(now - since)  # late ones too: the wait was too short
        self._moved_from.pop(name, None)
        return self.moving.pop(name, None) is not None

    def forget_node_for(self, name: str, node: str) -> None:
        """``node`` did not acknowledge a call for ``name``: leave it out, and ask afresh
        once the short negative TTL has passed. If it was the only provider, the entry
        goes: a slow node is not "nobody provides it", so the next call asks again."""
        entry = self.entries.get(name)
        if entry is None or node not in entry.counts:
            return
        entry.set(node, 0)
        self._positive.pop(name, None)
        if entry.counts:
            self._negative[name] = entry
        else:
            del self.entries[name]

    def expire(self, now: float, waiting: Callable[[str], bool] = lambda name: False,
               draining: Callable[[str], bool] = lambda node: False
               ) -> tuple[list[str], list[str]]:
        """Drop entries past their TTL; deal with timed-out queries and moving names
        past their bound (not those moving off a node ``draining`` says still drains).

        Returns (finished, again): names whose query finished (their waiting calls
        go on), and names to ask again — no answer named a provider, some node did
        not answer, and ``waiting(name)`` says calls still wait.
        """
        self._now = now
        for cache in (self._positive, self._negative):
            for name, entry in cache.expire():
                if self.entries.get(name) is entry:
                    del self.entries[name]
        finished, again = [], []
        for name in [n for n, until in self.moving.items() if until <= now]:
            origin = self._moved_from.get(name)
            if origin is not None and draining(origin):
                continue  # its providers may not have been told to move yet
            del self.moving[name]  # no provider came back: its calls go on (NO_PROVIDER)
            self._moved_from.pop(name, None)
            finished.append(name)
        if self._moved_at:  # kept past the wait, up to the ceiling: a late one is learnt
            ceiling = self.handover.ceiling
            for name in [n for n, t in self._moved_at.items() if now - t > ceiling]:
                del self._moved_at[name]
        for name in [n for n, q in self.queries.items() if q.deadline <= now]:
            query = self.queries[name]
            query.expected.discard(_UNSETTLED)
            if not query.expected:                       # complete after all
                self._store(name, self.queries.pop(name).answers)
                finished.append(name)
            elif any(c > 0 for c in query.answers.values()):
                self._store(name, self.queries.pop(name).answers, short=True)
                finished.append(name)
            elif waiting(name):                          # unknown, not "nobody"
                query.deadline = now + _UNPUBLISHED
                self.queries_sent += 1
                again.append(name)
            else:
                del self.queries[name]
                finished.append(name)
        return finished, again

    def _store(self, name: str, counts: dict[str, float], short: bool = False) -> None:
        """``short``: partial knowledge (a node did not answer), kept for the short TTL."""
        entry = Entry(counts)
        self._positive.pop(name, None)
        self._negative.pop(name, None)
        (self._positive if entry.counts and not short else self._negative)[name] = entry
        self.entries[name] = entry
