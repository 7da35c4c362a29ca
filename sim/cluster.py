"""Nodes, providers and callers of one simulated run, built from the real cores.

A ``SimNode`` is a node's router (broker/router.py), cluster core
(cluster/core.py) with its outbox, and one ``SessionRules`` (broker/session_rules.py)
per client connection, swept every ``timer_granularity`` as broker/node.py does.
Providers and callers (sim/clients.py) serve and call through the SDK's real rules
and record every outcome in the ``Ledger``. A node that drains tells its clients,
which move to another node as the SDK does. Client connections carry frames in
order, after a delay; a paused node or a blocked provider reads them when it runs
again.

With ``streams``, a quarter of the calls are streams (a window of 1-3): the provider
sends its parts as the credit the caller gives back allows, and the caller checks that
each part is its own, in order, never more than the window ahead of its credit, and that
a stream that ends cleanly brought every part (some readers are slow to give credit).
A tenth are call_alls: each provider (connection) runs one at most once, every REPLY is
its own call's (its answer or its application error), from a provider that ran it, no
provider replies twice, and the end counts the replies that came.
"""

from __future__ import annotations

from collections import Counter
from functools import partial
from typing import TYPE_CHECKING, Any, Callable

from rpcbus import errors
from rpcbus.broker.config import Config
from rpcbus.broker.events import Events
from rpcbus.broker.gate import Gate
from rpcbus.broker.lifecycle import ANNOUNCE, CLOSE, CUT_OFF, HAND_BACK, TELL, WAIT, Drain, Watch
from rpcbus.broker.presence import Presence
from rpcbus.broker.router import Router
from rpcbus.broker.session_policy import CUT_OFF_NOTICE
from rpcbus.broker.session_rules import SessionRules
from rpcbus.cluster.core import ClusterCore
from rpcbus.protocol import (
    DRAIN_PING,
    ERROR,
    OK,
    PING,
    RESPONSE,
)
from rpcbus.sim.world import LOOP_TICK, BusEnd, Redis, World

if TYPE_CHECKING:
    from rpcbus.sim.clients import Client

GRACE = 1.0            # s the SDK waits past a call's timeout before failing it itself
SWEEP = 0.05           # s between the SDK's sweeps of its deadlines
LATE = 2 * SWEEP       # s an SDK's own deadline may fire late (bucket, then sweep)
HIDDEN_AGE = 0.25      # s a call's age may be underestimated on its way to a handler
DRAIN_TIMEOUT = 3.0    # server.drain_timeout here
APP_CODE = "SIM_SAID_NO"  # the application error every 16th call of a caller answers
DID_NOT_RUN = errors.DID_NOT_RUN
DOCUMENTED = DID_NOT_RUN | {errors.RESPONSE_TIMEOUT, errors.ACCEPT_TIMEOUT, errors.PROVIDER_GONE,
                            errors.CONNECTION_LOST, errors.CLUSTER_UNAVAILABLE,
                            errors.PROVIDER_ERROR, APP_CODE}


def node_config(ack_timeout: float, policy: str) -> Config:
    config = Config()
    config.rpc.ack_timeout = ack_timeout
    config.cluster.policy = policy
    config.cluster.redis_url = "redis://sim"
    config.cluster.seal = "none"
    config.auth.mode = "none"
    config.cluster.heartbeat_interval = 0.5
    config.cluster.handover_wait = 1.0
    # within the partitions and pauses the faults draw (up to 4 s and 3 s), so cut-off
    # and stalled nodes send their clients elsewhere in some schedules
    config.cluster.evacuate_after = 1.5
    return config


class Ledger:
    """Every call: when it was made, its deadline, its outcomes, the handler runs."""

    def __init__(self) -> None:
        self.calls: dict[tuple[str, int], dict[str, Any]] = {}
        self.violations: list[str] = []
        self.outcomes: Counter[str] = Counter()
        # handlers started after their call's deadline are violations, except in runs that
        # pause nodes or block providers: REQUESTs held there reach a provider late
        # together, and a provider learns its offset to the node from the quickest it has
        # seen, so it may take them for fresh (a known gap: docs/reliability.md)
        self.check_starts = True

    def made(self, key: tuple[str, int], now: float, timeout: float) -> None:
        self.calls[key] = {"at": now, "deadline": now + timeout, "outcomes": [], "runs": 0,
                           "may_run": 1}

    def abandoned(self, key: tuple[str, int]) -> None:
        """Its caller died: no outcome is due (it may still run, once)."""
        self.calls[key]["abandoned"] = True

    def resent(self, key: tuple[str, int]) -> None:
        """An idempotent call is sent again after its connection was lost: its caller
        allowed one more run."""
        self.calls[key]["may_run"] += 1

    def ran(self, key: tuple[str, int], provider: str, now: float) -> None:
        call = self.calls.get(key)
        if call is None:
            self.violations.append(f"{key}: a handler ran a call nobody made")
            return
        call["runs"] += 1
        # no handler starts once its caller stopped waiting. Ages are judged from the least
        # delay seen on each hop (caller to node, the bus, node to provider: up to 50 ms
        # each here) and a held provider's frames within its tick: that much may hide
        if now > call["deadline"] + HIDDEN_AGE and self.check_starts:
            self.violations.append(f"{key}: a handler started {now - call['deadline']:.3f} s "
                                   "after the call's deadline")
        if "ran_on" in call:  # a call_all: once on each provider
            if provider in call["ran_on"]:
                self.violations.append(f"{key}: a call_all ran twice on {provider} at "
                                       f"{now:.3f}")
            call["ran_on"].add(provider)
        elif call["runs"] > call["may_run"]:
            self.violations.append(f"{key}: ran {call['runs']} times (again on {provider} "
                                   f"at {now:.3f})")

    def ended(self, key: tuple[str, int], code: str, now: float, data: Any = None) -> None:
        call = self.calls[key]
        call["outcomes"].append((code, now))
        self.outcomes[code] += 1
        if len(call["outcomes"]) > 1:
            self.violations.append(f"{key}: a second outcome {code} at {now:.3f}")
        if code == APP_CODE and (data != f"{key[0]}:{key[1]}" or not call["runs"]):
            self.violations.append(f"{key}: an application error not its own ({data!r}), "
                                   f"or from a handler that never ran")
        if code == "OK" and data != f"{key[0]}:{key[1]}":
            self.violations.append(f"{key}: given another call's answer {data!r}")
        if code != "OK" and code not in DOCUMENTED:
            self.violations.append(f"{key}: undocumented code {code}")
        if now > call["deadline"] + GRACE + LATE + 1e-6:
            self.violations.append(f"{key}: outcome {code} {now - call['deadline']:.3f} s "
                                   "after its deadline")

    def check_end(self) -> None:
        for key, call in self.calls.items():
            if not call["outcomes"] and not call.get("abandoned"):
                self.violations.append(f"{key}: no outcome")
            elif call["outcomes"] and call["outcomes"][0][0] in DID_NOT_RUN and call["runs"]:
                self.violations.append(f"{key}: {call['outcomes'][0][0]} but it ran")


class Pipe:
    """One direction of a client connection: frames in order, each after a delay, read
    by ``deliver`` (which may defer reading while its process is stopped); ``None`` after
    the last frame says the writer closed it (as TCP's FIN does)."""

    def __init__(self, world: World,
                 deliver: Callable[[list[list[Any]] | None], None]) -> None:
        self.world = world
        self.deliver = deliver
        self.out: list[list[Any]] = []
        self.open = True            # takes messages
        self.carrying = True        # delivers what is on its way
        self.hold_until = 0.0       # its process is held (a blocking handler): no writes
        self._last = 0.0
        self._flush_queued = False

    def send(self, msg: list[Any]) -> None:
        if not self.open:
            return
        self.out.append(msg)
        if not self._flush_queued:
            self._flush_queued = True
            self.world.after(LOOP_TICK, self.flush)

    def flush(self) -> None:
        if self.world.now < self.hold_until:
            self._flush_queued = True
            self.world.at(self.hold_until, self.flush)
            return
        self._flush_queued = False
        if not self.out or not self.open:
            self.out = []
            return
        frame, self.out = self.out, []
        due = max(self.world.now + 0.0002 + self.world.rand.random() * 0.001, self._last)
        self._last = due
        self.world.at(due, lambda: self.carrying and self.deliver(frame))

    def close(self) -> None:
        """The writer died: what it had not written is lost, what it wrote arrives, then
        the end of the connection."""
        self.open = False
        self.out = []
        due = max(self.world.now + 0.0002, self._last)
        self.world.at(due, lambda: self.carrying and self.deliver(None))

    def cut(self) -> None:
        """Nothing more is delivered, not even what was on its way."""
        self.open = self.carrying = False


class SimSession:
    """The node's side of one client connection, holding the real session rules
    (``core``) as broker/session.py's ``Session`` does."""

    def __init__(self, node: "SimNode", sid: str) -> None:
        self.sid = sid
        self.sim_node = node
        self.to_client: Pipe | None = None
        self.on_close: Callable[[], None] = lambda: None
        self.answers: Counter[int] = Counter()  # outcomes sent per caller id
        # frames that came while its node was paused, read in order when it runs again
        self.backlog: list[list[list[Any]] | None] = []
        self.core = SessionRules(node, sid, self)  # type: ignore[arg-type]  # a NodeView in all it reads

    def send(self, msg: list[Any]) -> None:
        if (msg[0] == RESPONSE or msg[0] == ERROR) and msg[1] is not None:
            self.answers[msg[1]] += 1
            if self.answers[msg[1]] > 1:
                self.sim_node.sim.ledger.violations.append(
                    f"{self.sid}: node sent a second outcome for call {msg[1]}")
        if self.to_client is not None:
            self.to_client.send(msg)

    def flush(self) -> None:
        if self.to_client is not None:
            self.to_client.flush()

    def is_open(self) -> bool:
        return not self.core.closed

    def close_for_policy(self, reason: str) -> None:
        self.sim_node.sim.ledger.violations.append(f"{self.sid} closed by the node: {reason}")
        self.sim_node.close_session(self)

    def later(self, delay: float, callback: Callable[[], None]) -> None:
        self.sim_node.world.after(delay, callback)

    def logged_in(self) -> None:
        pass  # no login timer here

    def check_login(self, params: dict[str, Any], done: Callable[..., None]) -> None:
        raise AssertionError("the simulated nodes take clients as they say (auth mode none)")


class SimNode:
    """One node process: router, cluster core, sessions, its bus connection."""

    def __init__(self, sim: "Simulation", name: str, generation: int, offset: float) -> None:
        self.sim = sim
        self.world = sim.world
        self.name = name
        self.offset = offset                 # its monotonic clock minus the world's
        self.config = node_config(sim.ack_timeout, sim.policy)
        self.config.server.drain_timeout = DRAIN_TIMEOUT
        rpc = self.config.rpc
        self.router = Router(ack_timeout=rpc.ack_timeout, response_timeout=rpc.response_timeout,
                             max_timeout=rpc.max_timeout, now=self.clock(),
                             granularity=rpc.timer_granularity, rand=self.world.rand.random,
                             affinity=self.config.cluster.affinity,
                             policy=self.config.cluster.policy, clock=None,
                             ack_timeout_max=rpc.ack_timeout_max,
                             queue_target=rpc.queue_target,
                             queue_interval=rpc.queue_interval,
                             max_concurrency=rpc.max_concurrency)
        self.gate = Gate(self.config)
        self.stats: Counter[str] = Counter()
        self.draining = False
        self.alive = True
        self.sessions: list[SimSession] = []
        self.unheard: set[SessionRules] = set()  # draining: clients yet to answer the notice
        self.end = BusEnd(sim.redis, name, self._on_batch, self._on_up, self._on_down,
                          self.clock)
        self.core = ClusterCore(self.router, self.config.cluster, name, f"ws://{name}",
                                self._heartbeat_info,
                                outbox=self.end.outbox, clock=self.clock,
                                stale=self.end.stale,
                                incarnation=generation * 100 + sim.node_index(name),
                                started=float(generation))
        # events and presence, as broker/node.py wires them
        cluster = self.config.cluster
        self.events = Events(self.core.incarnation, cluster.namespace,
                             self.end.outbox.publish, self.end.listen,
                             cluster.event_max_age, clock=self.clock)
        self.core.on_event = self.events.heard
        self.presence = Presence(partial(self.end.outbox.publish, self.core.control))
        self.core.presence = self.presence
        self.end.incarnation = self.core.incarnation
        sim.redis.ends[name] = self.end
        # the stall hold and the cut-off rule, as the node's shell feeds them
        self.watch = Watch(self.clock(), self.config.cluster.evacuate_after)
        self._seq = 0
        self.world.after(0.0, self.end.reconnect)
        self.world.after(self.config.rpc.timer_granularity, self._sweep)

    def _heartbeat_info(self) -> dict[str, Any]:
        """What a node's heartbeat tells the others' ``local-first`` choice and presence
        (broker/node.py)."""
        served = self.router.figures.rates(64)
        return {"served": served, "latency": self.router.figures.latencies(served),
                "presence": self.presence.digest()}

    def subscribed(self, session: SimSession, ref: int, topics: list[str]) -> None:
        """A SUBSCRIBE's OK: the simulated Redis hears a channel from the moment it is
        asked to (broker/node.py waits for Redis' confirmation)."""
        session.send([OK, ref])

    def clock(self) -> float:
        return self.world.now + self.offset

    def paused(self) -> bool:
        return self.sim.redis.node_paused(self.name)

    # the bus's events
    def _on_batch(self, batch: Any) -> None:
        if self.alive:
            self.router.read_at = now = self.clock()  # as the node's shell sets it
            self.core.on_batch(batch, now)

    def _on_up(self) -> None:
        self.core.on_up(self.clock())

    def _on_down(self, why: str) -> None:
        self.core.on_down(why, self.clock())

    def _sweep(self) -> None:
        if not self.alive:
            return
        if self.paused():
            self.world.at(self.sim.redis.paused[self.name], self._sweep)
            return
        now = self.clock()
        run, stalled, evacuate = self.watch.swept(now, self.draining)
        if stalled:
            self.core.stalled(now)
            if evacuate:
                self._send_clients_elsewhere()
        if run:
            self.router.read_at = now
            self.router.tick(now)
            self.events.tick()
            self.core.tick(now)
            if self.watch.bus(now, self.core.available, self.draining)[0] == CUT_OFF:
                self._send_clients_elsewhere()
            if self.core.state == "starting" and self.core.joined(now):
                self.core.set_state("ready", now)
        self.world.after(self.config.rpc.timer_granularity, self._sweep)

    @property
    def cut_off(self) -> bool:
        return self.watch.cut_off

    def _send_clients_elsewhere(self) -> None:
        """Every client is told to move to another node (CUT_OFF_NOTICE), as the node's."""
        for session in self.sessions:
            if session.core.authenticated and not session.core.closed:
                session.send(CUT_OFF_NOTICE)
                session.flush()
        self.sim.sent_elsewhere += 1

    def _bus_flushed(self) -> bool:
        end = self.end
        return not end.up or (not end.outbox.queued and not end.rounds)

    # clients
    def notice_heard(self, session: Any) -> None:
        self.unheard.discard(session)

    @property
    def in_flight(self) -> int:
        return self.router.pending + self.core.starting

    def drain(self, then: Callable[[], None]) -> None:
        """SIGTERM, in broker/lifecycle.py ``Drain``'s order, a step per sweep as the
        node's shell takes them; then the connections close and the process exits;
        ``then`` runs after."""
        self.draining = True
        self.router.drain()
        drain = Drain(DRAIN_TIMEOUT)

        def step() -> None:
            if not self.alive:
                return
            if self.paused():
                self.world.at(self.sim.redis.paused[self.name], step)
                return
            while True:
                now = self.clock()
                action = drain.next(now, self._bus_flushed(), len(self.unheard),
                                    self.in_flight, self.router.pending)
                if action == WAIT:
                    self.world.after(self.config.rpc.timer_granularity, step)
                    return
                if action == ANNOUNCE:
                    self.core.set_state("terminating", now)
                elif action == TELL:
                    for session in self.sessions:
                        if session.core.closed:
                            continue
                        session.send([ERROR, None, errors.SHUTTING_DOWN,
                                      "this node is shutting down"])
                        if session.core.authenticated:
                            session.send([PING, DRAIN_PING])
                            self.unheard.add(session.core)
                        session.flush()
                elif action == HAND_BACK:
                    self.router.hand_back()
                else:
                    assert action == CLOSE, action
                    stop()
                    return

        def stop() -> None:
            if not self.alive:
                return
            for session in list(self.sessions):
                if not session.core.closed:
                    session.core.end()
                    if session.to_client is not None:
                        session.to_client.flush()
                        session.to_client.close()  # what it wrote arrives, then the end
                    self.router.drop_peer(session.core, self.clock())
                    self._left(session)
            self.alive = False
            self.end.alive = False
            then()
        step()

    def connect(self, to_client: Callable[[list[list[Any]] | None], None]
                ) -> tuple[SimSession, Pipe]:
        """A client connects: its session here, and the pipe it writes to."""
        self._seq += 1
        session = SimSession(self, f"{self.name}.s{self._seq}")
        session.to_client = Pipe(self.world, to_client)
        self.sessions.append(session)
        return session, Pipe(self.world, lambda frame: self._read(session, frame))

    def _read(self, session: SimSession, frame: list[list[Any]] | None) -> None:
        """A frame from a client, read now, or after what came before it when the node
        was paused (in order, as a process reads its socket)."""
        if session.core.closed or not self.alive:
            return
        if self.paused() or session.backlog:
            session.backlog.append(frame)
            if len(session.backlog) == 1:
                self.world.at(max(self.sim.redis.paused.get(self.name, 0.0), self.world.now),
                              partial(self._read_backlog, session))
            return
        self._take(session, frame)

    def _read_backlog(self, session: SimSession) -> None:
        if session.core.closed or not self.alive:
            return
        if self.paused():  # paused again meanwhile
            self.world.at(self.sim.redis.paused[self.name], partial(self._read_backlog, session))
            return
        backlog, session.backlog = session.backlog, []
        for frame in backlog:
            if session.core.closed:
                return
            self._take(session, frame)

    def _take(self, session: SimSession, frame: list[list[Any]] | None) -> None:
        self.router.read_at = now = self.clock()
        if frame is None:  # the client closed the connection (or died)
            self.close_session(session)
            return
        session.core.handle(frame, now)
        session.flush()

    def close_session(self, session: SimSession) -> None:
        """The connection is gone (either end): the router forgets the peer."""
        if session.core.closed:
            return
        session.core.end()
        if session.to_client is not None:
            session.to_client.cut()
        self.router.drop_peer(session.core, self.clock())
        self._left(session)
        session.on_close()

    def _left(self, session: SimSession) -> None:
        """Its topics, watchers and presence go with it (broker/node.py session_closed)."""
        self.events.gone(session.core)
        self.presence.gone(session.core)
        if session.core.present_as is not None:
            self.presence.logout(session.core.present_as)

    def kill(self) -> None:
        """SIGKILL: nothing more from this process; its clients see their connections
        drop."""
        self.alive = False
        self.end.alive = False
        for session in list(self.sessions):
            if not session.core.closed:
                session.core.end()
                if session.to_client is not None:
                    session.to_client.cut()
            session.on_close()



class Simulation:
    """One run: its world, Redis, nodes, clients and ledger."""

    def __init__(self, world: World, redis: Redis, ack_timeout: float,
                 policy: str = "local-first", streams: bool = False) -> None:
        self.world = world
        self.streams = streams  # a quarter of the calls are streams
        self.redis = redis
        self.ack_timeout = ack_timeout
        self.policy = policy  # cluster.policy of every node
        self.nodes: dict[str, SimNode] = {}
        self.generations: Counter[str] = Counter()
        self.ledger = Ledger()
        self.clients: list[Client] = []
        # the run's faults only slow things (no loss, partition, restart, drain): a live
        # provider is reachable all along, so NO_PROVIDER for its name is a violation
        self.overload_only = False
        self.sent_elsewhere = 0  # times a node sent its clients elsewhere (cut off, stalled)

    def node_index(self, name: str) -> int:
        return int(name[1:])

    def start_node(self, name: str, offset: float) -> SimNode:
        self.generations[name] += 1
        node = SimNode(self, name, self.generations[name], offset)
        self.nodes[name] = node
        return node
