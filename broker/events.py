"""Events on this node: who subscribes to what, and where an emit goes. Pure: no I/O.

``Events`` keeps, per topic, this node's connections subscribed to it, in the
order they subscribed. ``emit`` hands an event to each of them
(``Subscriber.event``: the session queues it, or counts it lost while its client
reads too slowly, broker/session.py) and, in a cluster, queues it once on the
topic's event channel (``rpcbus.cluster.messages.event_channel``): every other
node listening on that channel hands it to its own subscribers (``heard``). So
an emit crosses the bus once, to each node that listens, whatever the number of
subscribers; the bus batches a round's events of one channel into one PUBLISH.

A node listens only on the channels of its own subscribers' topics: ``listen(
channel, on)`` is the shell's (the bus subscribes on Redis, or unsubscribes),
called when a channel gains its first topic here or loses its last. A topic
shares its channel with others (``EVENT_CHANNELS`` per namespace), so a node may
hear events nobody here subscribes to: they are counted (``unheard``) and
dropped.

What it promises (docs/events.md): at most once; in order per publishing
connection and topic (one node hands them on in the order read, one Redis
channel carries them in the order published); nothing lost while the nodes and
Redis are healthy and subscribers read. Across a subscriber's move too: each
event is numbered at its origin (``origin``, this node's process; ``seq``
counting up) and carries both to every node and to each subscriber that takes
them (``Subscriber.origins``), which drops one it had already
(clients/events.py ``Seen``): a subscriber that moved from the origin node to
another would otherwise get there, off the bus, what the origin gave it first.

A node that cannot keep up sheds instead of falling behind or stalling: an
event heard more than ``max_age`` seconds after it was published, and any event
once handing events on has taken ``slice_s`` of ``clock`` since the last
``tick`` (one frame of a publisher, or one read of the bus, can carry thousands
of events, each for thousands of subscribers), is not handed on here; its
topic's subscribers here are told how many in a GAP at the next ``tick`` (one per
topic, however many). So the node's loop is never held long by events (its calls
and heartbeats go on), it reads its Redis subscription about as fast as Redis
writes it (a backlog there past Redis' pub/sub output limit closes the
subscription, and the node's calls pay for it too), and a local emit still
crosses the bus for the other nodes.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any, Callable, Hashable, Iterable, Protocol

from rpcbus.cluster import messages as m
from rpcbus.protocol import EVENT, GAP

#: An origin as the SDKs get it: an incarnation's low 53 bits (its random bits and 100 days
#: of its start time), which JavaScript's numbers hold exactly
EXACT_IN_JS = (1 << 53) - 1


class Subscriber(Protocol, Hashable):
    """A connection that subscribes (broker/session_rules.py ``SessionRules``)."""

    topics: set[str]     # what it subscribes to (kept by ``Events``)
    echoes: bool         # it hears its own events (an rpcbus SDK; deepstream's does not)
    origins: bool        # it takes EVENTs with origin and number (an rpcbus SDK that said so)

    def event(self, msg: list[Any]) -> None:
        """Queue the EVENT ``msg`` for the client (one list, shared by every subscriber: it
        is never changed), or count it lost (the client reads too slowly)."""

    def send(self, msg: list[Any]) -> None:
        """Queue a message for the client (a notice: GAP)."""


class Events:
    """See the module docstring. ``origin`` is this node's process (its incarnation: no
    two processes share one); ``namespace`` and ``publish(channel, message)`` are the
    cluster's (None: a node alone); ``listen(channel, on)`` as above."""

    def __init__(self, origin: int, namespace: str | None = None,
                 publish: Callable[[str, list[Any]], None] | None = None,
                 listen: Callable[[str, bool], None] | None = None,
                 max_age: float = 1.0, slice_s: float = 0.05,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.origin = origin
        self._seq = 0                     # the number of this node's latest emit
        self.subscribers: dict[str, dict[Subscriber, None]] = {}
        self.max_age = max_age
        self._slice = slice_s
        self._clock = clock
        self._until = 0.0                 # handing on stops then, until the next tick
        self._late: dict[str, int] = {}   # events shed since the last tick, by topic
        self._namespace = namespace
        self._publish = publish
        self._listen = listen
        self._channels: Counter[str] = Counter()   # topics subscribed here, by channel
        self.stats: Counter[str] = Counter()

    @property
    def channels(self) -> list[str]:
        """The event channels this node listens on (the bus subscribes again to these
        after a reconnect)."""
        return list(self._channels)

    def subscribe(self, sub: Subscriber, topics: Iterable[str]) -> None:
        for topic in topics:
            if topic in sub.topics:
                continue
            sub.topics.add(topic)
            subs = self.subscribers.get(topic)
            if subs is None:
                subs = self.subscribers[topic] = {}
                self._channel_gains(topic)
            subs[sub] = None
        self._check(sub)

    def unsubscribe(self, sub: Subscriber, topics: Iterable[str]) -> None:
        for topic in topics:
            if topic not in sub.topics:
                continue
            sub.topics.discard(topic)
            subs = self.subscribers[topic]
            del subs[sub]
            if not subs:
                del self.subscribers[topic]
                self._channel_loses(topic)
        self._check(sub)

    def gone(self, sub: Subscriber) -> None:
        """The connection closed: it leaves every topic at once."""
        if sub.topics:
            self.unsubscribe(sub, sorted(sub.topics))  # in an order the same every run

    def emit(self, sender: Subscriber | None, topic: str, data: Any) -> None:
        """An event a client of this node emitted: to the subscribers here (``sender``
        too if it subscribes and ``echoes``), and once to the cluster."""
        self.stats["emitted"] += 1
        self._seq += 1
        seq = self._seq
        subs = self.subscribers.get(topic)
        if subs and self._spent():  # busy: shed here, told at the tick (still published)
            self._late[topic] = self._late.get(topic, 0) + 1
        elif subs:
            self._hand_on(subs, sender, topic, data, self.origin, seq)
        if self._publish is not None:
            assert self._namespace is not None
            self._publish(m.event_channel(self._namespace, topic),
                          [m.EVENT, topic, data, seq])

    def heard(self, topic: str, data: Any, age: float = 0.0, origin: int | None = None,
              seq: int | None = None) -> None:
        """An event another node's client emitted (an EVENT off the bus), ``age`` seconds
        under way, numbered ``seq`` by its node's process ``origin`` (None: a node that
        does not number them)."""
        subs = self.subscribers.get(topic)
        if not subs:
            self.stats["unheard"] += 1
            return
        if age > self.max_age or self._spent():  # behind, or busy: shed, told at the tick
            self._late[topic] = self._late.get(topic, 0) + 1
            return
        self.stats["heard"] += 1
        self._hand_on(subs, None, topic, data, origin, seq)

    def _hand_on(self, subs: dict[Subscriber, None], sender: Subscriber | None, topic: str,
                 data: Any, origin: int | None, seq: int | None) -> None:
        """The event to each subscriber here (but ``sender`` unless it echoes): the client
        protocol's EVENT, one list for all of them, with its origin and number to those
        that take them."""
        plain = [EVENT, topic, data]
        numbered = plain if seq is None or origin is None else \
            [EVENT, topic, data, origin & EXACT_IN_JS, seq]
        delivered = 0
        for sub in subs:
            if sub is not sender or sub.echoes:
                sub.event(numbered if sub.origins else plain)
                delivered += 1
        self.stats["delivered"] += delivered

    def _spent(self) -> bool:
        """This slice of handing events on is used up (the first event after a tick
        starts one)."""
        now = self._clock()
        if not self._until:
            self._until = now + self._slice
            return False
        return now > self._until

    def tick(self) -> int:
        """A new slice; tell the subscribers of each topic that had events shed how many
        (a GAP each). Returns how many were shed."""
        self._until = 0.0
        if not self._late:
            return 0
        late, self._late = self._late, {}
        for topic, count in late.items():
            for sub in self.subscribers.get(topic, ()):
                sub.send([GAP, topic, count])
        shed = sum(late.values())
        self.stats["shed"] += shed
        return shed

    def every_subscriber(self) -> list[Subscriber]:
        """Each connection subscribed to anything, once."""
        return list({sub: None for subs in self.subscribers.values() for sub in subs})

    # -- channels ----------------------------------------------------------------------

    def _channel_gains(self, topic: str) -> None:
        if self._namespace is None:
            return
        channel = m.event_channel(self._namespace, topic)
        self._channels[channel] += 1
        if self._channels[channel] == 1 and self._listen is not None:
            self._listen(channel, True)

    def _channel_loses(self, topic: str) -> None:
        if self._namespace is None:
            return
        channel = m.event_channel(self._namespace, topic)
        self._channels[channel] -= 1
        if not self._channels[channel]:
            del self._channels[channel]
            if self._listen is not None:
                self._listen(channel, False)

    def _check(self, sub: Subscriber) -> None:
        """The tables agree (cheap: one connection's topics)."""
        for topic in sub.topics:
            assert sub in self.subscribers[topic], topic
