"""Who is in the cluster: a table driven by STATE messages and ``now``. Pure.

A node announces ``starting``, then ``ready``, heartbeats (a STATE message)
every ``interval`` seconds, and announces ``terminating`` when it stops: it
takes no new calls (it is not ``live``) but finishes those in flight. One that
sends nothing for ``misses`` intervals is dead to the others, terminating or
not.

Each node also learns, per peer, the smallest ``received - sent_at`` seen: the
clock offset plus the quickest trip. A message's ``age`` is its own
``received - sent_at`` minus that minimum: how long it waited on the way
(in Redis, in a paused process) without the nodes' clocks having to agree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rpcbus.cluster.messages import READY, STARTING


@dataclass
class Member:
    name: str
    state: str
    url: str
    started: float
    last_seen: float
    info: dict[str, Any] = field(default_factory=dict)


class Membership:
    def __init__(self, me: str, interval: float, misses: int) -> None:
        self.me = me
        self.interval = interval
        self.misses = misses
        self.members: dict[str, Member] = {}
        self._offset: dict[str, float] = {}   # kept across deaths: a paused peer keeps its clock
        self._started: dict[str, float] = {}

    def age(self, sender: str, sent_at: float, now: float) -> float:
        """How long a message from ``sender`` stamped ``sent_at`` was under way (≥ 0)."""
        offset = now - sent_at
        best = self._offset.get(sender)
        if best is None or offset < best:
            self._offset[sender] = best = offset
        return offset - best

    def on_state(self, sender: str, state: str, url: str, started: float,
                 info: dict[str, Any], sent_at: float, now: float) -> bool:
        """A STATE message; True when ``sender`` is new or came back."""
        if sender == self.me:
            return False
        member = self.members.get(sender)
        if member is None or member.started != started:
            if started != self._started.get(sender):
                self._offset[sender] = now - sent_at  # a (re)started process: a new clock
            self._started[sender] = started
            self.members[sender] = Member(sender, state, url, started, now, info)
            assert self.me not in self.members, "this node among its peers"
            return True
        member.state, member.url, member.last_seen, member.info = state, url, now, info
        return False

    def forget(self, name: str) -> None:
        """``name``'s process was replaced: its next STATE starts afresh (a new clock too)."""
        self.members.pop(name, None)
        self._offset.pop(name, None)
        self._started.pop(name, None)

    def answering(self) -> list[str]:
        """Peers whose answer to a query counts: ready or still starting (a peer this node
        last heard as starting may serve clients already, its "ready" still on its way;
        it answers queries either way), not stopping."""
        return [m.name for m in self.members.values() if m.state in (READY, STARTING)]

    def grace(self, now: float) -> None:
        """This node could not listen for a while: count every peer as just heard."""
        for member in self.members.values():
            member.last_seen = now

    def expire(self, now: float) -> list[str]:
        """Peers silent for ``misses`` intervals: removed and returned."""
        limit = now - self.interval * self.misses
        dead = [m.name for m in self.members.values() if m.last_seen < limit]
        for name in dead:
            del self.members[name]
        assert all(m.last_seen >= limit for m in self.members.values()), "a silent peer kept"
        return dead
