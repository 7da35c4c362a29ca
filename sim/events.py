"""Event schedules for the simulator: publishers and subscribers over the nodes' real
events core (broker/events.py), and what they must see (docs/events.md).

``Publisher`` emits numbered events to a few topics at random times, through whatever
node it is connected to; ``Subscriber`` subscribes to them, subscribes again on every new
connection (as the SDKs do), and keeps every event it gets and every loss it is told of
(GAP counts, and the unknown losses: a GAP without count, a lost connection).
``check`` holds the promise:

- at most once, in order: from each publisher's connection, each subscriber's events
  of a topic come with increasing numbers, none twice (a publisher that moved to another
  node is another connection: its events from there may overtake what it emitted
  before, still on the bus), across the subscriber's moves between nodes, and when
  the seed drew ``duplicate`` (the simulated Redis delivers some batches twice, which
  the real bus drops only when sealed, cluster/seal.py's replay guard). The
  subscriber keeps what the SDKs keep (clients/events.py ``Seen``, fed the EVENTs'
  origins and numbers) and drops what it had already;
- nothing lost unsaid: with no fault drawn, a subscriber told of no unknown loss got
  every event emitted to its topics from its subscription's OK to the end of the
  load, but for the ones a GAP counted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rpcbus.events import Seen
from rpcbus.protocol import AUTH_OK, EMIT, EVENT, GAP, OK, SUBSCRIBE
from rpcbus.sim.clients import Client, Conn

if TYPE_CHECKING:
    from rpcbus.sim.cluster import Simulation

TOPICS = ("ev.a", "ev.b", "ev.c")
SETTLE = 0.05   # s after a subscription's OK before an event must reach it (the node's
                # own processing and Redis' latency are modelled: this is slack)


class Publisher(Client):
    """Emits ``[name, n, connection]`` to a random topic of TOPICS, n counting up per
    topic, ``connection`` per connection."""

    def __init__(self, sim: Simulation, name: str, rate: float) -> None:
        super().__init__(sim, name)
        self.rate = rate
        self.sent: dict[str, list[tuple[int, float]]] = {t: [] for t in TOPICS}
        self._last_conn: Conn | None = None   # the connection it emitted on last
        self._conns = 0                        # its connections it emitted on

    def start(self, until: float) -> None:
        def tick() -> None:
            if not self.alive or self.world.now >= until:
                return
            conn = self.conn
            if conn is not None and self.ready and not conn.gone:
                topic = self.world.rand.choice(TOPICS)
                n = len(self.sent[topic])
                self.sent[topic].append((n, self.world.now))
                if conn is not self._last_conn:
                    self._last_conn, self._conns = conn, self._conns + 1
                conn.pipe.send([EMIT, topic, [self.name, n, self._conns]])
            self.world.after(self.world.rand.expovariate(self.rate), tick)
        self.world.after(self.world.rand.random() * 0.05, tick)

    def frame(self, conn: Conn, frame: list[list[Any]]) -> None:
        for msg in frame:
            if msg[0] == AUTH_OK:
                self.ready = conn is self.conn

    def lost(self, conn: Conn) -> None:
        pass


class Subscriber(Client):
    """Subscribes to some of TOPICS; keeps what it gets (but what it had already, as the
    SDKs drop it) and the losses it is told of."""

    event_origins = True

    def __init__(self, sim: Simulation, name: str, topics: list[str]) -> None:
        super().__init__(sim, name)
        self.topics = topics
        self.seen = Seen()
        # (topic, publisher) -> [(number, the publisher's connection), ...]
        self.got: dict[tuple[str, str], list[tuple[int, int]]] = {}
        self.told: dict[str, int] = {}                     # topic -> counted losses
        self.unknown = False          # a loss of unknown extent (connection, bus)
        self.since: float | None = None   # its first subscription's OK
        self._ref = 0

    def frame(self, conn: Conn, frame: list[list[Any]]) -> None:
        for msg in frame:
            kind = msg[0]
            if kind == AUTH_OK and conn is self.conn:
                self.ready = True
                self._ref += 1
                conn.pipe.send([SUBSCRIBE, self._ref, self.topics])
            elif kind == OK and self.since is None:
                self.since = self.world.now
            elif kind == EVENT and conn is self.conn:
                if len(msg) == 5 and not self.seen.fresh(msg[1], msg[3], msg[4]):
                    continue
                publisher, n, via = msg[2]
                self.got.setdefault((msg[1], publisher), []).append((n, via))
            elif kind == GAP:
                if msg[2] is None:
                    self.unknown = True
                else:
                    self.told[msg[1]] = self.told.get(msg[1], 0) + msg[2]

    def move_off(self, conn: Conn) -> None:
        if conn is self.conn:
            self.unknown = True   # what is emitted until it subscribed elsewhere is lost
        super().move_off(conn)

    def lost(self, conn: Conn) -> None:
        if conn is self.conn:
            self.unknown = True


def check(sim: Simulation, publishers: list[Publisher], subscribers: list[Subscriber],
          load_end: float, healthy: bool) -> None:
    """The promise above; what breaks it goes to the ledger's violations."""
    found = sim.ledger.violations
    for sub in subscribers:
        for (topic, publisher), got in sub.got.items():
            if not _in_order(got):
                found.append(f"{sub.name}: events of {publisher} on {topic} out of order "
                             f"or twice: {[n for n, _ in got][:20]}")
            if topic not in sub.topics:
                found.append(f"{sub.name}: an event of {topic}, never subscribed to")
        if not healthy or sub.unknown or sub.since is None:
            continue
        for topic in sub.topics:
            missing = 0
            for pub in publishers:
                due = {n for n, at in pub.sent[topic] if sub.since + SETTLE <= at <= load_end}
                missing += len(due - {n for n, _ in sub.got.get((topic, pub.name), [])})
            if missing > sub.told.get(topic, 0):
                found.append(f"{sub.name}: {missing} events of {topic} lost, "
                             f"{sub.told.get(topic, 0)} told")


def _in_order(got: list[tuple[int, int]]) -> bool:
    """Each publisher connection's numbers come increasing (so none twice: an event
    carries the connection it was emitted on)."""
    last: dict[int, int] = {}   # a publisher's connection -> its last number here
    for n, via in got:
        if n <= last.get(via, -1):
            return False
        last[via] = n
    return True
