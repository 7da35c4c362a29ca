"""The simulation's client processes, built from the SDK's real rules.

A ``Provider`` serves through the SDK's provider rules (clients/provider.py
``Serving``): frames in, ACCEPT_UPTO out, then its handlers start. A ``Caller``
calls through the SDK's caller rules (clients/calling.py ``Calls``: idempotent calls
sent again after a lost connection, calls refused SHUTTING_DOWN sent elsewhere, its
own deadline at the call's timeout plus ``GRACE``) and records every outcome in the
run's ``Ledger`` (sim/cluster.py). A client told that its node drains moves to
another node as the SDK does; frames and the loss of a connection reach it only while
no handler holds the process. The nodes, the ledger and the run are in sim/cluster.py.
"""

from __future__ import annotations

import heapq
from functools import partial
from typing import TYPE_CHECKING, Any, Callable

from rpcbus import errors
from rpcbus.calling import Calls
from rpcbus.protocol import (
    ALL,
    AUTH,
    AUTH_OK,
    CANCEL,
    CREDIT,
    ERROR,
    PART,
    PING,
    PONG,
    PROTOCOL_VERSION,
    PROVIDE,
    REPLY,
    REQ_WINDOW,
    REQUEST,
    RESPONSE,
    STREAM,
    UNPROVIDE,
)
from rpcbus.provider import Held, Serving
from rpcbus.sim.cluster import APP_CODE, GRACE, SWEEP, Pipe, SimNode, SimSession

if TYPE_CHECKING:
    from rpcbus.sim.cluster import Simulation


class Conn:
    """One client connection: the node's session for it, the pipe the client writes to,
    and (for a provider) its provider rules."""

    __slots__ = ("node", "session", "pipe", "serving", "gone", "opened")

    def __init__(self, node: SimNode, session: SimSession, pipe: Pipe) -> None:
        self.node, self.session, self.pipe = node, session, pipe
        self.serving: Serving | None = None
        self.gone = False
        self.opened = node.world.now


class Client:
    """A client process: one connection for new work at a time, to a live node,
    reconnecting; told that its node drains, it moves to another while what is under
    way on the old connection finishes there. Frames and the loss of a connection reach
    it only while no handler holds the process, each with the connection it
    concerns."""

    event_origins = False   # its AUTH asks for EVENTs with origin and number

    def __init__(self, sim: "Simulation", name: str) -> None:
        self.sim = sim
        self.world = sim.world
        self.name = name
        self.conn: Conn | None = None
        self.alive = True
        self.blocked_until = 0.0
        self.ready = False

    def connect(self) -> None:
        if not self.alive:
            return
        # a node takes clients once it has joined (broker/node.py: 503 "starting" before)
        # (503 "draining" from one that drains)
        nodes = [n for n in self.sim.nodes.values()
                 if n.alive and not n.draining and n.core.joined(n.clock())]
        if not nodes:
            self.world.after(0.1, self.connect)
            return
        node = self.world.rand.choice(nodes)
        conn: Conn | None = None

        def read(frame: list[list[Any]] | None) -> None:
            assert conn is not None
            if frame is None:  # the node closed the connection
                self._when_running(self._lost, conn)
            else:
                self._when_running(self._frame, conn, frame)
        session, pipe = node.connect(read)
        conn = self.conn = Conn(node, session, pipe)
        session.on_close = partial(self._when_running, self._lost, conn)
        params: dict[str, Any] = {"protocol": PROTOCOL_VERSION, "name": self.name}
        if self.event_origins:
            params["event_origins"] = True
        pipe.send([AUTH, params])

    def _when_running(self, fn: Callable[..., None], *args: Any) -> None:
        if not self.alive:
            return
        if self.world.now < self.blocked_until:  # a handler holds this process
            self.world.at(self.blocked_until, partial(self._when_running, fn, *args))
            return
        fn(*args)

    def _frame(self, conn: Conn, frame: list[list[Any]]) -> None:
        """What the SDKs do with any connection's PINGs and notices, then ``frame``."""
        for msg in frame:
            if msg[0] == PING:
                conn.pipe.send([PONG, msg[1] if len(msg) > 1 else None])
            elif msg[0] == ERROR and msg[2] == errors.SHUTTING_DOWN:
                self.move_off(conn)  # the notice, or a call refused so: the node drains
            elif msg[0] == ERROR and msg[1] is None and msg[2] == errors.CLUSTER_UNAVAILABLE:
                self.cut_off(conn)  # the node cannot reach the cluster
        self.frame(conn, frame)

    def cut_off(self, conn: Conn) -> None:
        """As the SDK does: another connection for new work (what is under way here ends
        here); nodes exist in a simulation, so there is always another to try."""
        self.move_off(conn)

    def frame(self, conn: Conn, frame: list[list[Any]]) -> None:
        raise NotImplementedError

    def move_off(self, conn: Conn) -> None:
        """The node drains: new work goes to a connection to another node at once."""
        if conn is self.conn:
            self.conn = None
            self.ready = False
            self.connect()

    def _lost(self, conn: Conn) -> None:
        if conn.gone:
            return
        conn.gone = True
        self.lost(conn)
        if conn is not self.conn:
            return
        self.conn = None
        self.ready = False
        self.world.after(0.05 + self.world.rand.random() * 0.1, self.connect)

    def lost(self, conn: Conn) -> None:
        raise NotImplementedError

    def kill(self) -> None:
        self.alive = False
        if self.conn is not None:
            self.conn.pipe.close()


class Provider(Client):
    """A provider process serving ``names`` through the SDK's provider rules."""

    takes_streams = True  # (sim/run.py ``RunsFirstProvider`` refuses every stream)

    def __init__(self, sim: "Simulation", name: str, names: list[str], slow: float,
                 blocks: float) -> None:
        super().__init__(sim, name)
        self.names = names
        self.slow = slow          # most a handler takes, s
        self.quick = 0.02         # most the other nine in ten take, s
        # when the times its workers come free (an overload schedule sets 8): handlers
        # beyond them wait for one, and a REQUEST whose wait would pass half its time
        # left is refused BUSY, as the SDK's plain-function handlers are; None: no limit
        self.workers: list[float] | None = None
        self.blocks = blocks      # chance a handler holds the whole process while it runs
        self.held = Held(SWEEP, self.world.now)  # the SDK's sweeper ticks it
        self.world.after(SWEEP, self._tick)

    def _tick(self) -> None:
        if self.alive:
            self.held.tick(self.world.now)
            self.world.after(SWEEP, partial(self._when_running, self._tick))

    def connect(self) -> None:
        super().connect()
        conn = self.conn
        if conn is not None:
            conn.serving = Serving(conn.pipe.send, lambda n: n if n in self.names else None,
                                   accept_upto=True,
                                   stale_after_ms=self.sim.ack_timeout * 500)
            conn.pipe.send([PROVIDE, 1, list(self.names)])

    def cut_off(self, conn: Conn) -> None:
        """As the SDK does: provide through another node, and no longer here (its handlers
        under way here finish)."""
        if conn is self.conn:
            self.move_off(conn)
            conn.pipe.send([UNPROVIDE, 2, list(self.names)])

    def frame(self, conn: Conn, frame: list[list[Any]]) -> None:
        serving = conn.serving
        if serving is None:
            return
        now = self.world.now
        for msg in frame:
            kind = msg[0]
            if kind == REQUEST or kind == STREAM:  # a connection lost (or moved off)
                serving.request(msg, now, not conn.gone, self.held.late_by(now),  # takes none
                                None if self.workers is None else self._full)
            elif kind == CANCEL:
                serving.cancel(msg[1])
            elif kind == CREDIT:
                waiter = serving.credit(msg[1], msg[2])
                if waiter is not None:
                    waiter()
        self.start(conn, serving.take_starting())

    def start(self, conn: Conn, starting: list[tuple[int, str, Any, list[Any]]]) -> None:
        """The rule: the ACCEPTs are written, then the handlers start."""
        conn.pipe.flush()
        for attempt, _name, _entry, request in starting:
            self.run(conn, attempt, request)

    def _full(self, entry: Any, left_ms: Any) -> bool:
        """The SDK's rule for worker threads: refused BUSY when no worker would start it
        within half its time left."""
        assert self.workers is not None
        return type(left_ms) is int and self.workers[0] - self.world.now > left_ms / 2000

    def run(self, conn: Conn, attempt: int, request: list[Any]) -> None:
        serving = conn.serving
        assert serving is not None
        key = _key(request[3])
        serving.started(attempt, key)
        rand = self.world.rand
        took = rand.random() * (self.slow if rand.random() < 0.1 else self.quick)
        blocks = rand.random() < self.blocks
        if self.workers is None:
            self.begin(conn, attempt, request, took, blocks)
            return
        start = max(self.world.now, heapq.heappop(self.workers))
        heapq.heappush(self.workers, start + took)
        self.world.at(start, partial(self._when_running, self.begin, conn, attempt, request,
                                     took, blocks))

    def begin(self, conn: Conn, attempt: int, request: list[Any], took: float,
              blocks: bool) -> None:
        """The handler starts (a worker came free): unless its call was cancelled
        meanwhile, or its connection is gone."""
        serving = conn.serving
        assert serving is not None
        if attempt not in serving.running:
            return
        key = _key(request[3])
        # a provider is one connection (as a call_all counts them): a client moving between
        # nodes provides through both for a moment
        self.sim.ledger.ran(key, f"{self.name}@{conn.session.sid}", self.world.now)
        if blocks:  # it holds the process: nothing read or written
            self.blocked_until = max(self.blocked_until, self.world.now + took)
            conn.pipe.hold_until = self.blocked_until

        def done() -> None:
            if self.alive and serving.finished(attempt):  # not cancelled, connection kept
                conn.pipe.send([RESPONSE, attempt, None if request[0] == STREAM else
                                request[3]] if key[1] % 16 else
                               [ERROR, attempt, errors.APP_ERROR, "no", [APP_CODE, request[3]]])
        if request[0] == STREAM:
            self.stream(conn, serving, attempt, request, took, done)
        else:
            self.world.after(took, done)

    def stream(self, conn: Conn, serving: Serving, attempt: int, request: list[Any],
               took: float, done: Callable[[], None]) -> None:
        """Parts ``data#0`` .. ``data#n-1`` (n from the call's id), as credit allows, a
        part every ``took / n`` s, then ``done``."""
        flow = serving.stream(attempt, request[REQ_WINDOW])
        n = parts_of(_key(request[3]))

        def step() -> None:
            if not self.alive or attempt not in serving.running:
                return  # cancelled, or its connection is gone
            if flow.sent == n:
                done()
            elif flow.credit > 0:
                conn.pipe.send([PART, attempt, f"{request[3]}#{flow.sent}"])
                flow.sent += 1
                self.world.after(took / n, partial(self._when_running, step))
            else:
                flow.waiter = step
        step()

    def lost(self, conn: Conn) -> None:
        if conn.serving is not None:
            conn.serving.lost()


class Caller(Client):
    """A caller process: calls at random through the SDK's caller rules, some of them
    idempotent, each with a timeout, every outcome in the ledger."""

    def __init__(self, sim: "Simulation", name: str, names: list[str], rate: float) -> None:
        super().__init__(sim, name)
        self.names = names
        self.rate = rate
        self.cid = 0
        self.calls = Calls[Conn](self.world.now, GRACE, SWEEP)
        self.keys: dict[int, tuple[str, int]] = {}  # calls under way: their ledger key
        # streams under way: [window, parts received, read, read as last told (CREDIT)]
        self.reading: dict[int, list[int]] = {}
        self.gathering: dict[int, list[str]] = {}  # call_alls under way: who replied
        self.world.after(SWEEP, self._sweep)

    def start_load(self, until: float) -> None:
        def tick() -> None:
            if not self.alive or self.world.now >= until:
                return
            for _ in range(1 + int(self.world.rand.random() * 3)):
                self.call()
            self.world.after(self.world.rand.expovariate(self.rate), tick)
        self.world.after(self.world.rand.random() * 0.05, tick)

    def call(self) -> None:
        """One call; made while there is no connection, it waits for one."""
        rand = self.world.rand
        self.cid += 1
        cid = self.cid
        key = (self.name, cid)
        timeout = 0.3 + rand.random() * 2.5
        self.sim.ledger.made(key, self.world.now, timeout)
        self.keys[cid] = key
        conn = self.conn if self.ready else None
        name, idempotent = rand.choice(self.names), rand.random() < 0.3
        self.sim.ledger.calls[key]["name"] = name
        draw = rand.random() if self.sim.streams else 1.0
        window = 1 + int(rand.random() * 3) if draw < 0.25 else 0
        if window:
            self.reading[cid] = [window, 0, 0, 0]
        elif draw < 0.35:  # a call_all
            self.gathering[cid] = []
            self.sim.ledger.calls[key]["ran_on"] = set()
        kind = STREAM if window else ALL if cid in self.gathering else REQUEST
        msg = self.calls.make(cid, name, f"{key[0]}:{key[1]}", int(timeout * 1000),
                              {"window": window} if window else None,
                              self.world.now + timeout, idempotent and kind == REQUEST, conn,
                              kind)
        if conn is not None and msg is not None:
            conn.pipe.send(msg)

    def _sweep(self) -> None:
        if not self.alive:
            return
        for call, exc in self.calls.expire(self.world.now):
            self._end(call.cid, exc.code)
        self.world.after(SWEEP, self._sweep)

    def _end(self, cid: int, code: str, data: Any = None) -> None:
        key = self.keys.pop(cid, None)
        self.calls.forget(cid)
        stream = self.reading.pop(cid, None) is not None
        self.gathering.pop(cid, None)
        if key is not None:  # else after its own deadline: dropped, as the SDK does
            if code == errors.NO_PROVIDER:
                self._no_provider(key, stream)
            self.sim.ledger.ended(key, code, self.world.now, data)

    def _no_provider(self, key: tuple[str, int], stream: bool) -> None:
        """NO_PROVIDER says nobody provides the name: in a run whose faults only slow
        things (``sim.overload_only``), a violation while a provider of it kept one
        connection from a second before the call to its end (for a stream, one that
        takes streams: a provider's REJECT is "not me", and when every provider said so
        the call ends NO_PROVIDER, as docs/protocol.md says)."""
        if not self.sim.overload_only:
            return
        call = self.sim.ledger.calls[key]
        name, made = call["name"], call["at"]
        for client in self.sim.clients:
            conn = client.conn
            if (isinstance(client, Provider) and client.alive and name in client.names
                    and (client.takes_streams or not stream)
                    and conn is not None and not conn.gone and conn.opened <= made - 1.0):
                self.sim.ledger.violations.append(
                    f"{key}: NO_PROVIDER while {client.name} provided {name!r} on "
                    f"{conn.node.name} all the call's life")
                return

    def _send_queued(self) -> None:
        conn = self.conn
        if conn is not None and self.ready and not conn.gone:
            for msg in self.calls.send_queued(conn, self.world.now):
                conn.pipe.send(msg)

    def frame(self, conn: Conn, frame: list[list[Any]]) -> None:
        for msg in frame:
            kind = msg[0]
            if kind == AUTH_OK:
                self.ready = conn is self.conn
                self._send_queued()
            elif kind == PART:
                self._part(msg[1], msg[2])
            elif kind == REPLY:
                self._reply(msg)
            elif kind == RESPONSE and msg[1] in self.gathering:
                key = self.keys.get(msg[1])
                if key is not None:
                    if msg[2] != len(self.gathering[msg[1]]):
                        self.sim.ledger.violations.append(
                            f"{key}: a call_all ended counting {msg[2]} replies, "
                            f"{len(self.gathering[msg[1]])} came")
                    self._end(msg[1], "OK", f"{key[0]}:{key[1]}")
            elif kind == RESPONSE:
                stream = self.reading.get(msg[1])
                key = self.keys.get(msg[1])
                if stream is not None and key is not None:  # a stream's clean end
                    if msg[2] is not None or stream[1] != parts_of(key):
                        self.sim.ledger.violations.append(
                            f"{key}: a stream ended with {stream[1]} of {parts_of(key)} "
                            f"parts (end data {msg[2]!r})")
                    self._end(msg[1], "OK", f"{key[0]}:{key[1]}")
                else:
                    self._end(msg[1], "OK", msg[2])
            elif kind == ERROR and msg[1] is not None:
                if msg[2] == errors.SHUTTING_DOWN and self.calls.refused_unrun(msg[1], conn):
                    self._send_queued()  # it never ran: elsewhere, now or when connected
                else:
                    exc = self.calls.error(msg[1], msg[2], msg[3], msg[4] if len(msg) > 4 else None)
                    self._end(msg[1], exc.code, getattr(exc, "data", None))

    def _reply(self, msg: list[Any]) -> None:
        """A REPLY to a call_all: its own answer (or application error), from a provider
        that ran it, once per provider."""
        replied, key = self.gathering.get(msg[1]), self.keys.get(msg[1])
        if replied is None or key is None:
            return  # ended here already
        own = f"{key[0]}:{key[1]}"
        provider = str(msg[2])
        error = msg[5] if len(msg) > 5 else None
        who = provider or f"node {msg[3]}"  # a node that did not answer for its providers
        if who in replied:
            self.sim.ledger.violations.append(f"{key}: {who} replied twice")
        replied.append(who)
        if error is None or error[0] == errors.APP_ERROR:
            ran_on = self.sim.ledger.calls[key]["ran_on"]
            answer = msg[4] if error is None else error[2][1]
            if answer != own or provider not in ran_on:
                self.sim.ledger.violations.append(
                    f"{key}: a reply {answer!r} from {provider} (ran on {sorted(ran_on)})")

    def _part(self, cid: int, data: Any) -> None:
        """A part: its own, the next in order, within the window beyond what was told
        read; read now or a little later (a slow reader)."""
        stream, key = self.reading.get(cid), self.keys.get(cid)
        if stream is None or key is None:
            return  # ended here already (its deadline): dropped, as the SDK does
        window, received, _, told = stream
        if data != f"{key[0]}:{key[1]}#{received}":
            self.sim.ledger.violations.append(f"{key}: part {received} was {data!r}")
        if received + 1 > told + window:
            self.sim.ledger.violations.append(
                f"{key}: part {received + 1} came with {told} told read (window {window})")
        stream[1] = received + 1
        rand = self.world.rand
        self.world.after(0.0 if rand.random() < 0.7 else rand.random() * 0.3,
                         partial(self._read, cid, stream))

    def _read(self, cid: int, stream: list[int]) -> None:
        """One part read: the parts read in all go to the node (CREDIT), at times left
        for the next read to tell, never the last."""
        conn = self.calls.wire_of(cid)
        if self.alive and self.reading.get(cid) is stream and conn is not None \
                and not conn.gone:
            stream[2] += 1
            if stream[2] == stream[1] or self.world.rand.random() < 0.5:
                stream[3] = stream[2]
                conn.pipe.send([CREDIT, cid, stream[2]])

    def kill(self) -> None:
        """Its calls under way get no outcome: nobody is left to see one."""
        super().kill()
        for key in self.keys.values():
            self.sim.ledger.abandoned(key)

    def lost(self, conn: Conn) -> None:
        on = self.calls.on(conn)
        failed = self.calls.lost(conn, resend=True)
        for call in on:
            if call not in failed:  # idempotent: the caller allowed another run
                self.sim.ledger.resent(self.keys[call.cid])
        for call in failed:
            self._end(call.cid, errors.CONNECTION_LOST)
        self._send_queued()


def parts_of(key: tuple[str, int]) -> int:
    """How many parts a stream's provider sends: 1-4, from the call's id."""
    return key[1] % 4 + 1


def _key(data: str) -> tuple[str, int]:
    caller, cid = data.rsplit(":", 1)
    return caller, int(cid)
