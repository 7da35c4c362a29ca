"""Event schedules for the simulator: publishers and subscribers over the nodes' real
events core (broker/events.py), and what they must see (docs/events.md).

``Publisher`` emits numbered events to a few topics at random times, through whatever
node it is connected to; ``Subscriber`` subscribes to them, subscribes again on every new
connection (as the SDKs do), and keeps every event it gets and every loss it is told of
(GAP counts, and the unknown losses: a GAP without count, a lost connection).
``check`` holds the promise:

- at most once, in order: from each publisher, each subscriber's events of a topic
  come with increasing numbers, none twice (unless the seed drew ``duplicate``: the
  simulated Redis then delivers some batches twice, which the real bus drops only
  when sealed, cluster/seal.py's replay guard; Redis itself delivers once);
- nothing lost unsaid: with no fault drawn, a subscriber told of no unknown loss got
  every event emitted to its topics from its subscription's OK to the end of the
  load, but for the ones a GAP counted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rpcbus.protocol import AUTH_OK, EMIT, EVENT, GAP, OK, SUBSCRIBE
from rpcbus.sim.clients import Client, Conn

if TYPE_CHECKING:
    from rpcbus.sim.cluster import Simulation

TOPICS = ("ev.a", "ev.b", "ev.c")
SETTLE = 0.05   # s after a subscription's OK before an event must reach it (the node's
                # own processing and Redis' latency are modelled: this is slack)


class Publisher(Client):
    """Emits ``[name, n]`` to a random topic of TOPICS, n counting up per topic."""

    def __init__(self, sim: Simulation, name: str, rate: float) -> None:
        super().__init__(sim, name)
        self.rate = rate
        self.sent: dict[str, list[tuple[int, float]]] = {t: [] for t in TOPICS}

    def start(self, until: float) -> None:
        def tick() -> None:
            if not self.alive or self.world.now >= until:
                return
            conn = self.conn
            if conn is not None and self.ready and not conn.gone:
                topic = self.world.rand.choice(TOPICS)
                n = len(self.sent[topic])
                self.sent[topic].append((n, self.world.now))
                conn.pipe.send([EMIT, topic, [self.name, n]])
            self.world.after(self.world.rand.expovariate(self.rate), tick)
        self.world.after(self.world.rand.random() * 0.05, tick)

    def frame(self, conn: Conn, frame: list[list[Any]]) -> None:
        for msg in frame:
            if msg[0] == AUTH_OK:
                self.ready = conn is self.conn

    def lost(self, conn: Conn) -> None:
        pass


class Subscriber(Client):
    """Subscribes to some of TOPICS; keeps what it gets and the losses it is told of."""

    def __init__(self, sim: Simulation, name: str, topics: list[str]) -> None:
        super().__init__(sim, name)
        self.topics = topics
        self.got: dict[tuple[str, str], list[int]] = {}   # (topic, publisher) -> numbers
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
                publisher, n = msg[2]
                self.got.setdefault((msg[1], publisher), []).append(n)
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
          load_end: float, healthy: bool, replays: bool) -> None:
    """The promise above; what breaks it goes to the ledger's violations."""
    found = sim.ledger.violations
    for sub in subscribers:
        for (topic, publisher), numbers in sub.got.items():
            if not replays and any(b <= a for a, b in zip(numbers, numbers[1:], strict=False)):
                found.append(f"{sub.name}: events of {publisher} on {topic} out of order "
                             f"or twice: {numbers[:20]}")
            if topic not in sub.topics:
                found.append(f"{sub.name}: an event of {topic}, never subscribed to")
        if not healthy or sub.unknown or sub.since is None:
            continue
        for topic in sub.topics:
            missing = 0
            for pub in publishers:
                due = {n for n, at in pub.sent[topic] if sub.since + SETTLE <= at <= load_end}
                missing += len(due - set(sub.got.get((topic, pub.name), [])))
            if missing > sub.told.get(topic, 0):
                found.append(f"{sub.name}: {missing} events of {topic} lost, "
                             f"{sub.told.get(topic, 0)} told")
