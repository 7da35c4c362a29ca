"""The simulated world: one seeded clock and event queue, and a simulated Redis.

Everything happens at a virtual time, in the order of a heap of events; every
random choice comes from one ``random.Random(seed)``, so a run is repeated
exactly by its seed. Nothing here sleeps, opens a socket or starts a thread.

``Redis`` models what the cluster bus relies on of Redis pub/sub: a node's
rounds (cluster/outbox.py) reach Redis after a delay, their ``then`` callbacks
run when the answer gets back, and each batch reaches every subscriber of its
topic after a delay of its own, in the order it was published on that topic by
that node (batches of different topics or nodes may overtake each other). The
faults (``Faults``) bend that: a node's link may lose everything for a while
(its bus session then ends, as a broken connection does), be one way or both
ways partitioned, deliver a batch twice (a replay), or be slow. As with TCP, a
connection never loses a message and then delivers later ones: loss ends the
session.
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from dataclasses import dataclass, field
from functools import partial
from typing import Callable

from rpcbus.cluster import messages as m
from rpcbus.cluster.outbox import Outbox, Round

LOOP_TICK = 0.0002   # s between a node queueing a message and its round leaving
ROUND_TIMEOUT = 2.0  # cluster/bus.py: a round Redis does not answer ends the session


class World:
    """The clock, the event queue and the random generator of one run."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.now = 0.0
        self.rand = random.Random(seed)
        self._events: list[tuple[float, int, Callable[[], object]]] = []
        self._seq = 0
        self.events_run = 0

    def at(self, when: float, fn: Callable[[], object]) -> None:
        self._seq += 1
        heapq.heappush(self._events, (max(when, self.now), self._seq, fn))

    def after(self, delay: float, fn: Callable[[], object]) -> None:
        self.at(self.now + delay, fn)

    def run(self, until: float) -> None:
        events = self._events
        while events and events[0][0] <= until:
            when, _, fn = heapq.heappop(events)
            self.now = when
            self.events_run += 1
            fn()
        self.now = max(self.now, until)


@dataclass
class Faults:
    """Which faults a run injects (chosen per seed by rpcbus.sim.run)."""

    slow: bool = False          # bus latency up to 50 ms instead of 2 ms
    duplicate: float = 0.0      # chance a delivered batch is delivered again (a replay)
    loss: bool = False          # a node loses every batch for a while; its session ends
    partition: bool = False     # a node is cut off from Redis both ways for a while
    deaf: bool = False          # a node can publish but its reads stall for a while
    pause: bool = False         # a node process stops (SIGSTOP) for a while
    restart: bool = False       # a node is killed and started again under its name
    drain: bool = False         # a node drains (SIGTERM), exits, starts again: a deploy
    kill_clients: bool = False  # callers and providers die with calls in flight
    block: bool = False         # handlers that block their provider's process
    skew: bool = False          # node clocks far apart (monotonic offsets)
    names: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return ",".join(self.names) or "none"


ALL_FAULTS = ("slow", "duplicate", "loss", "partition", "deaf", "pause", "restart",
              "kill_clients", "block", "skew", "drain")


class BusEnd:
    """One node's connection to the simulated Redis: its outbox, its rounds in flight."""

    def __init__(self, redis: "Redis", name: str, on_batch: Callable[[m.Batch], None],
                 on_up: Callable[[], None], on_down: Callable[[str], None],
                 clock: Callable[[], float]) -> None:
        self.redis = redis
        self.name = name
        self.clock = clock
        self.on_batch, self.on_up, self.on_down = on_batch, on_up, on_down
        self.outbox = Outbox(clock, self._queued)
        self.incarnation = 0
        self.session = 0          # bumped by every session end: late events of it are void
        self.alive = True
        self._pending_flush = False
        self.rounds: list[tuple[int, Round]] = []  # rounds sent, not yet answered
        self.listening: set[str] = set()  # event channels it subscribes to

    def listen(self, channel: str, on: bool) -> None:
        """Subscribe to an event channel (``on``) or leave it, at once."""
        if on:
            self.listening.add(channel)
        else:
            self.listening.discard(channel)

    @property
    def up(self) -> bool:
        return self.outbox.up

    # the node side

    def _queued(self) -> None:
        if not self._pending_flush:
            self._pending_flush = True
            self.redis.world.after(LOOP_TICK, self._flush)

    def _flush(self) -> None:
        self._pending_flush = False
        if not self.up or not self.alive or not self.outbox.queued:
            return
        if self.redis.node_paused(self.name):  # a stopped process writes nothing
            self.redis.world.after(0.01, self._flush)
            self._pending_flush = True
            return
        taken = self.outbox.take_round()
        self.redis.send_round(self, taken)

    def stale(self, why: str) -> None:
        """The core's self-suspicion: end the session and connect again."""
        if self.up:
            self.end_session(why)

    def end_session(self, why: str) -> None:
        if not self.up:
            return
        self.session += 1
        self.outbox.went_down()
        rounds, self.rounds = self.rounds, []
        for _, taken in rounds:  # never answered: their answers are kept for the reconnect
            self.outbox.failed(taken)
        self.on_down(why)
        self.redis.world.after(0.05 + self.redis.world.rand.random() * 0.1, self.reconnect)

    def reconnect(self) -> None:
        if not self.alive or self.up:
            return
        if not self.redis.reachable(self.name):
            self.redis.world.after(0.1 + self.redis.world.rand.random() * 0.2, self.reconnect)
            return
        self.outbox.up = True
        self.on_up()
        self.outbox.came_up()


class Redis:
    """The simulated Redis pub/sub: control and private topics, faults per node."""

    def __init__(self, world: World, faults: Faults, namespace: str = "rpcbus") -> None:
        self.world = world
        self.faults = faults
        self.control = m.control_topic(namespace)
        self.namespace = namespace
        self.ends: dict[str, BusEnd] = {}          # node name -> its current connection
        self.cut: dict[str, float] = {}            # node -> until (both ways)
        self.deaf: dict[str, float] = {}           # node -> until (its reads stall)
        self.deaf_private: dict[str, float] = {}   # node -> until (its own topic's shard)
        self.losing: set[str] = set()              # nodes whose connection broke
        self.paused: dict[str, float] = {}         # node -> until (its process stopped)
        # Redis reads each node's rounds in order (one connection), and delivers each topic
        # to a subscriber in the order it took them (one shard per topic on a Redis
        # Cluster: different topics may interleave)
        self._sent: dict[str, float] = {}                # node -> last arrival at Redis
        self._fifo: dict[tuple[str, str], float] = {}    # (topic, to) -> last arrival
        # (topic, its subscriber's connection) -> batches arrived and not yet read: read
        # strictly in order, however stalls and pauses come and go (``_read``)
        self._unread: dict[tuple[str, BusEnd], deque[tuple[int, bytes]]] = {}
        self.batches = 0

    def latency(self) -> float:
        top = 0.05 if self.faults.slow else 0.002
        return 0.0002 + self.world.rand.random() * top

    def node_paused(self, name: str) -> bool:
        return self.paused.get(name, -1.0) > self.world.now

    def reachable(self, name: str) -> bool:
        return self.cut.get(name, -1.0) <= self.world.now

    def send_round(self, end: BusEnd, taken: Round) -> None:
        """A round leaves the node: Redis has it after a trip; while the node is cut off
        it waits on the way (TCP retransmits) and gets there when the cut heals, unless
        the session ends first: a round unanswered for ROUND_TIMEOUT ends it."""
        world = self.world
        session = end.session
        end.rounds.append((session, taken))
        sent_at = end.clock()
        arrive = max(world.now + self.latency(), self._sent.get(end.name, 0.0))
        self._sent[end.name] = arrive

        def timed_out() -> None:
            if end.session == session and any(r[1] is taken for r in end.rounds):
                end.end_session("round timeout")
        world.after(ROUND_TIMEOUT, timed_out)

        def at_redis() -> None:
            if end.session != session or not end.alive:
                return  # the session ended first: Redis never had it (failed, kept)
            if not self.reachable(end.name):  # stuck on the way until the cut heals
                world.at(self.cut[end.name], at_redis)
                return
            unheard = set()  # private topics whose PUBLISH reached no subscriber
            for topic, msgs in taken.out.items():
                payload = m.encode_batch(end.name, end.incarnation, taken.to[topic],
                                         sent_at, msgs)
                if not self._publish(end.name, topic, payload) and topic != self.control:
                    unheard.add(topic)

            def answered() -> None:
                if end.session != session or not end.alive:
                    return
                end.rounds = [r for r in end.rounds if r[1] is not taken]
                end.outbox.answered(taken, unheard)
            world.after(self.latency(), answered)
        world.at(arrive, at_redis)

    def _publish(self, sender: str, topic: str, payload: bytes) -> int:
        """Deliver to the topic's subscribers; returns how many there were (PUBLISH's
        reply: a connection that broke unnoticed still counts)."""
        self.batches += 1
        if topic == self.control:
            targets = list(self.ends.values())
        elif m.is_event_channel(self.namespace, topic):
            targets = [end for end in self.ends.values() if topic in end.listening]
        else:
            node = topic.rsplit(":", 1)[1]
            target = self.ends.get(node)
            targets = [target] if target is not None else []
        reached = 0
        for end in targets:
            if not end.up or not end.alive:
                continue
            reached += 1
            copies = 2 if self.world.rand.random() < self.faults.duplicate else 1
            for _ in range(copies):
                key = (topic, end.name)
                due = max(self.world.now + self.latency(), self._fifo.get(key, 0.0))
                self._fifo[key] = due
                self.world.at(due, partial(self._arrive, end, end.session, topic, payload))
        return reached

    def _arrive(self, end: BusEnd, session: int, topic: str, payload: bytes) -> None:
        """A batch reaches the node's connection; it is read after those before it."""
        if end.name in self.losing:
            return  # lost with a connection that breaks: the session ends
        unread = self._unread.setdefault((topic, end), deque())
        unread.append((session, payload))
        if len(unread) == 1:  # else a read of this queue is already due
            self._read(end, topic)

    def _read(self, end: BusEnd, topic: str) -> None:
        """Read the queue in order: what a cut, a stalled subscription or a stopped
        process holds back arrives late, never before what came earlier."""
        unread = self._unread[(topic, end)]
        while unread:
            session, payload = unread[0]
            if (end.session != session or not end.up or not end.alive
                    or end.name in self.losing):
                unread.popleft()  # a session that ended, or a connection that breaks
                continue
            stalled = max(self.deaf.get(end.name, -1.0), self.cut.get(end.name, -1.0),
                          -1.0 if topic == self.control
                          or m.is_event_channel(self.namespace, topic)
                          else self.deaf_private.get(end.name, -1.0))
            if self.node_paused(end.name):
                stalled = max(stalled, self.paused[end.name])
            if stalled > self.world.now:  # cut off, its reads stall, or it is stopped
                self.world.at(stalled, partial(self._read, end, topic))
                return
            unread.popleft()
            end.on_batch(m.decode_batch(payload))

    # faults

    def cut_off(self, name: str, duration: float) -> None:
        """Both ways: nothing reaches Redis or the node until the cut heals (then in
        order, late), unless the node's session ends first (a round times out, or the
        core suspects itself) and loses it."""
        self.cut[name] = self.world.now + duration

    def deafen(self, name: str, duration: float, private_only: bool = False) -> None:
        """The node's subscription stalls (its publishes still go out): what it should
        hear arrives in order when the stall ends, unless its session ends first (the
        core's self-suspicion: its own heartbeats stop coming back). ``private_only``:
        only its own topic's (a Redis Cluster shard stalls; the control topic, on
        another, goes on)."""
        (self.deaf_private if private_only else self.deaf)[name] = self.world.now + duration

    def lose(self, name: str, duration: float) -> None:
        """The node's connection breaks: everything sent to it is lost until its bus
        notices, ``duration`` later (a read error), and connects again."""
        end = self.ends.get(name)
        if end is None:
            return
        self.losing.add(name)
        session = end.session

        def noticed() -> None:
            self.losing.discard(name)
            if end.session == session:
                end.end_session("connection lost")
        self.world.after(duration, noticed)
