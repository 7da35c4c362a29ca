"""Who is logged in across the cluster, and who is told when that changes. Pure: no I/O.

A user is online while one of their connections is logged in on any node.
``Presence`` counts this node's connections per user (``login``, ``logout``),
holds what every other node said of its own users (``heard``, ``heard_all``,
``node_gone``), and keeps, per user, the number of nodes it is online on: online
anywhere is that count above 0. A user's first connection here, or its last one
leaving, is published once on the control topic (PRESENCE); a node's whole set
goes out when another asks for it (PRESENCE_ALL, ``snapshot``).

Nothing is lost for good: every heartbeat carries ``digest()`` (how many users
are online here and the XOR of their CRC-32s); a node whose view of another's set
disagrees with the digest that node sent asks it for its whole set
(``wants_snapshot``, at most once per ``ASK_EVERY`` seconds per node). A node
declared dead, or replaced by a new process under its name, takes its users with
it (``node_gone``).

Watchers: connections told when a user comes online anywhere or leaves
everywhere (``Watcher.presence_changed``), for every user (``watch(w, None)``)
or for some; a watcher of everyone hears only of the users it ``may_see``.
"""

from __future__ import annotations

import zlib
from collections import Counter
from typing import Any, Callable, Hashable, Iterable, Protocol

from rpcbus.cluster.messages import PRESENCE, PRESENCE_ALL

#: s: how often this node asks one other node for its whole set at most
ASK_EVERY = 2.0


class Watcher(Protocol, Hashable):
    """A connection that watches presence (broker/session_rules.py ``SessionRules``)."""

    def presence_changed(self, user: str, online: bool) -> None:
        """Tell the client that ``user`` came online, or left the cluster."""

    def may_see(self, user: str) -> bool:
        """Whether its user may see ``user``'s presence."""


def _one_less(counts: Counter[str], user: str) -> bool:
    """Count ``user`` down; True when none is left (it leaves ``counts``)."""
    left = counts[user] - 1
    assert left >= 0, user
    if left:
        counts[user] = left
        return False
    del counts[user]
    return True


def _crc(user: str) -> int:
    return zlib.crc32(user.encode("utf-8", "surrogatepass"))


class Presence:
    """See the module docstring; ``publish(message)`` sends on the control topic (None: a
    node alone)."""

    def __init__(self, publish: Callable[[list[Any]], None] | None = None) -> None:
        self._publish = publish
        self.local: Counter[str] = Counter()       # this node's connections per user
        self._xor = 0                              # of the CRC-32s of ``local``'s users
        self.nodes: dict[str, set[str]] = {}       # another node -> its users online
        self._node_xor: dict[str, int] = {}
        self.where: Counter[str] = Counter()       # user -> nodes it is online on
        self._everyone: dict[Watcher, None] = {}
        self._of: dict[str, dict[Watcher, None]] = {}   # user -> its watchers
        self.watching: dict[Watcher, set[str]] = {}     # a watcher -> users it watches
        self._asked: dict[str, float] = {}
        self.stats: Counter[str] = Counter()

    # -- this node's connections -------------------------------------------------------

    def login(self, user: str) -> None:
        self.local[user] += 1
        if self.local[user] == 1:
            self._xor ^= _crc(user)
            if self._publish is not None:
                self._publish([PRESENCE, user, True])
            self._up(user)

    def logout(self, user: str) -> None:
        if not _one_less(self.local, user):
            return
        self._xor ^= _crc(user)
        if self._publish is not None:
            self._publish([PRESENCE, user, False])
        self._down(user)

    def digest(self) -> list[int]:
        """What this node's heartbeat says of its set: [users, XOR of their CRC-32s]."""
        return [len(self.local), self._xor]

    def snapshot(self) -> list[Any]:
        """The PRESENCE_ALL message of this node's set."""
        return [PRESENCE_ALL, sorted(self.local)]

    # -- other nodes -------------------------------------------------------------------

    def heard(self, node: str, user: str, online: bool) -> None:
        """``node`` says ``user``'s first connection there came (or its last left)."""
        users = self.nodes.setdefault(node, set())
        if online and user not in users:
            users.add(user)
            self._node_xor[node] = self._node_xor.get(node, 0) ^ _crc(user)
            self._up(user)
        elif not online and user in users:
            users.discard(user)
            self._node_xor[node] ^= _crc(user)
            self._down(user)

    def heard_all(self, node: str, users: Iterable[str]) -> None:
        """``node``'s whole set: what differs from the view here is told."""
        new = set(users)
        old = self.nodes.get(node, set())
        self.nodes[node] = new
        xor = 0
        for user in new:
            xor ^= _crc(user)
        self._node_xor[node] = xor
        for user in new - old:
            self._up(user)
        for user in old - new:
            self._down(user)

    def node_gone(self, node: str) -> None:
        """``node`` is dead, or another process runs under its name: its users left."""
        self._node_xor.pop(node, None)
        self._asked.pop(node, None)
        for user in self.nodes.pop(node, ()):
            self._down(user)

    def wants_snapshot(self, node: str, digest: Any, now: float) -> bool:
        """``node``'s heartbeat carried ``digest``: true when the view here disagrees with
        it and ``node`` was not asked for its set lately (ask it now)."""
        if type(digest) is not list or len(digest) != 2:
            return False
        if digest == [len(self.nodes.get(node, ())), self._node_xor.get(node, 0)]:
            return False
        if now - self._asked.get(node, -ASK_EVERY) < ASK_EVERY:
            return False
        self._asked[node] = now
        self.stats["snapshots_asked"] += 1
        return True

    # -- what clients ask --------------------------------------------------------------

    def online(self, user: str) -> bool:
        return user in self.where

    def everyone(self) -> list[str]:
        return sorted(self.where)

    def watch(self, watcher: Watcher, users: list[str] | None) -> None:
        """Tell ``watcher`` of ``users``' changes (None: of everyone's it may see)."""
        mine = self.watching.setdefault(watcher, set())
        if users is None:
            self._everyone[watcher] = None
            return
        for user in users:
            if user not in mine:
                mine.add(user)
                self._of.setdefault(user, {})[watcher] = None

    def unwatch(self, watcher: Watcher, users: list[str] | None) -> None:
        """No more of ``users``' changes (None: of everyone's; the users it watches by name
        it still watches)."""
        mine = self.watching.get(watcher)
        if mine is None:
            return
        if users is None:
            self._everyone.pop(watcher, None)
            users = []
        for user in users:
            if user in mine:
                mine.discard(user)
                of = self._of[user]
                del of[watcher]
                if not of:
                    del self._of[user]
        if not mine and watcher not in self._everyone:
            del self.watching[watcher]

    def gone(self, watcher: Watcher) -> None:
        """The connection closed: it watches nothing more."""
        mine = self.watching.get(watcher)
        if mine is not None:
            self.unwatch(watcher, [*mine])
            self.unwatch(watcher, None)

    # -- changes -----------------------------------------------------------------------

    def _up(self, user: str) -> None:
        self.where[user] += 1
        if self.where[user] == 1:
            self._tell(user, True)

    def _down(self, user: str) -> None:
        if _one_less(self.where, user):
            self._tell(user, False)

    def _tell(self, user: str, online: bool) -> None:
        self.stats["changes"] += 1
        told: set[Watcher] = set()
        for watcher in self._of.get(user, ()):
            told.add(watcher)
            if watcher.may_see(user):  # its rights may have changed since it asked
                watcher.presence_changed(user, online)
        for watcher in self._everyone:
            if watcher not in told and watcher.may_see(user):
                watcher.presence_changed(user, online)
