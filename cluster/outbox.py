"""What a node has queued for the cluster bus, round by round. Pure: no I/O, no asyncio.

``publish(topic, msg)`` queues a message for this round's batch of ``topic``; the
bus (cluster/bus.py, or the simulator's) takes a whole round with ``take_round``,
sends one batch per topic, and says how it went: ``answered`` (Redis has it: the
round's ``then`` callbacks run) or ``failed`` (the round's answers are kept).

Addressing: a topic's queue holds messages for one incarnation of its node
(``to``): queueing for a newer one drops what waited for the older (that process
is gone), and a message for an older one is dropped. Everything dropped is
counted in ``stats["dropped"]``.

Holds across bus resets: a message published with ``hold_until`` (an answer to
another node's call: the call ran here, its outcome must reach the origin) is
kept while the bus is down, and in a round that fails, and queued again after the
reconnect if ``hold_until`` has not passed on ``clock`` (at most ``MAX_HELD``;
more are dropped and counted). Everything else queued when the bus goes down is
dropped.

Held for a node that did not hear them: when Redis says a round's PUBLISH on a
node's private topic reached no subscriber (``answered(round, unheard)``: that
node's subscription is gone, dropped by Redis or reconnecting), the answers it
carried for that topic wait in ``unheard`` until the node is heard again
(``heard(topic, to)``: a batch of its came, so it subscribed again) and are queued
then, unless their ``hold_until`` passed (``expire``) or they were for an earlier
process of that node.
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from typing import Any, Callable, Iterable, NamedTuple

MAX_HELD = 100_000  # answers kept while the bus is down, for the reconnect

Held = tuple[str, int, list[Any], float]  # (topic, to, message, hold_until)


class Round(NamedTuple):
    """What one round sends: messages per topic, the incarnation each is for, the
    callbacks to run once Redis has them all, the held answers among them, and the bus
    session it went out on."""

    out: dict[str, list[list[Any]]]
    to: dict[str, int]
    then: list[Callable[[], None]]
    holds: list[Held]
    session: int


_new_tuple = tuple.__new__


class Outbox:
    """See the module docstring. ``on_queued`` is called when a round gets its first
    message for a topic (the bus wakes its writer)."""

    def __init__(self, clock: Callable[[], float],
                 on_queued: Callable[[], None] = lambda: None) -> None:
        self.clock = clock
        self.up = False
        self.stats = {"dropped": 0, "held": 0, "held_sent": 0, "unheard": 0}
        self._on_queued = on_queued
        self._out: dict[str, list[list[Any]]] = {}
        self._to: dict[str, int] = {}   # topic -> the incarnation its queue is for
        self._held: list[Held] = []     # kept while down
        self._holds: list[Held] = []    # those queued in _out
        self._then: list[Callable[[], None]] = []  # run after this round is in Redis
        self.session = 0                # bus sessions: the count of those that ended
        # topic -> answers whose PUBLISH reached nobody there, until its node is heard
        self.unheard: dict[str, list[Held]] = {}
        self._unheard_n = 0

    @property
    def queued(self) -> bool:
        return bool(self._out)

    def publish(self, topic: str, msg: list[Any], then: Callable[[], None] | None = None,
                to: int = 0, hold_until: float = 0.0) -> None:
        """Queue ``msg`` for ``topic`` (for incarnation ``to`` of its node; 0 on the control
        topic); it leaves with this round's batch. Dropped while down, unless
        ``hold_until`` (on ``clock``) is later than now: then kept for the reconnect.

        ``then`` runs once Redis has taken the round (never, if the round fails).
        """
        if not self.up:
            if hold_until:
                self._hold((topic, to, msg, hold_until))
            else:
                self.stats["dropped"] += 1
            return
        if hold_until:  # kept with its round until Redis has it (a failed round is resent)
            self._holds.append((topic, to, msg, hold_until))
        box = self._out.get(topic)
        if box is not None and self._to[topic] != to:
            if to < self._to[topic]:  # for a process that has been replaced
                self.stats["dropped"] += 1
                return
            self.stats["dropped"] += len(box)  # the old process's messages: it is gone
            box.clear()
        if then is not None:
            self._then.append(then)
        if box is None:
            self._out[topic] = [msg]
            self._to[topic] = to
            self._on_queued()
        else:
            self._to[topic] = to
            box.append(msg)

    def take_round(self) -> Round:
        """Everything queued, as one round; the next round starts empty."""
        # tuple.__new__: a round per PUBLISH, without the Python-level Round.__new__
        assert len(self._to) == len(self._out), "a topic queued without its incarnation"
        taken = _new_tuple(Round, (self._out, self._to, self._then, self._holds,
                                   self.session))
        self._out, self._to, self._then, self._holds = {}, {}, [], []
        return taken

    def answered(self, round: Round, unheard: AbstractSet[str] = frozenset()) -> bool:
        """Redis has taken every batch of ``round``; ``unheard``: its topics whose PUBLISH
        reached no subscriber (their answers wait for their node: ``heard``). Returns
        whether the next round has messages queued already."""
        for callback in round.then:
            callback()
        if unheard:
            for entry in round.holds:
                if entry[0] in unheard:
                    if self._unheard_n < MAX_HELD:
                        self.unheard.setdefault(entry[0], []).append(entry)
                        self._unheard_n += 1
                        self.stats["unheard"] += 1
                    else:
                        self.stats["dropped"] += 1
        return bool(self._out)

    def heard(self, topic: str, to: int) -> None:
        """The node of ``topic`` (process ``to``) is heard: it listens again. What waited
        for it is queued (answers for an earlier process of it are dropped)."""
        entries = self.unheard.pop(topic, None)
        if entries is None:
            return
        self._unheard_n -= len(entries)
        if not self.up:
            self._hold(*entries)  # kept for the reconnect, as any held answer
            return
        mine = [e for e in entries if e[1] == to]
        self.stats["dropped"] += len(entries) - len(mine)
        self._requeue(mine)

    def expire(self) -> None:
        """Drop what waits for a node past its ``hold_until`` (a node that never came
        back); counted."""
        now = self.clock()
        for topic in list(self.unheard):
            entries = self.unheard[topic]
            live = [e for e in entries if e[3] > now]
            self.stats["dropped"] += len(entries) - len(live)
            self._unheard_n -= len(entries) - len(live)
            if live:
                self.unheard[topic] = live
            else:
                del self.unheard[topic]

    def failed(self, round: Round) -> None:
        """``round`` did not reach Redis: its answers are kept. Its session is ending:
        when that is still the current one, nothing more goes out on it (``went_down``)
        and they wait for the next; a round of an earlier session has them queued again
        in this one. (Queued again on the ending session, they would fail again at once:
        a writer that does not wait between rounds would spin until their deadlines.)"""
        assert round.session <= self.session, "a round of a session not begun"
        if round.session == self.session:
            self.went_down()
        self._hold(*round.holds)

    def came_up(self) -> None:
        """A new bus session: queue again the answers kept while down."""
        self.up = True
        held, self._held = self._held, []
        self._requeue(held)

    def went_down(self) -> None:
        """The session ended: what this round queued is dropped, its answers kept."""
        if not self.up:
            return
        self.up = False
        self.session += 1  # a round taken from now on belongs to the next session
        self.stats["dropped"] += sum(len(v) for v in self._out.values()) - len(self._holds)
        self._hold(*self._holds)
        self._out, self._to, self._then, self._holds = {}, {}, [], []

    def _hold(self, *entries: Held) -> None:
        """Keep answers of a round that did not reach Redis: for the reconnect, or queued
        again at once when a new session is already up."""
        if self.up:
            self._requeue(entries)
            return
        for entry in entries:
            if len(self._held) < MAX_HELD:
                self._held.append(entry)
                self.stats["held"] += 1
            else:
                self.stats["dropped"] += 1
        assert len(self._held) <= MAX_HELD

    def _requeue(self, entries: Iterable[Held]) -> None:
        """Queue held answers again (held again if this round fails too); drop the late."""
        now = self.clock()
        for topic, to, msg, until in entries:
            if until > now:
                self.stats["held_sent"] += 1
                self.publish(topic, msg, to=to, hold_until=until)
            else:
                self.stats["dropped"] += 1
