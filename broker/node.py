"""One broker node: its listening socket, its sessions, the router, the deadline sweep.

``Node.run()`` serves until ``stop()`` (SIGTERM/SIGINT in ``rpcbus node``), then
shuts down in bounded steps, like uvicorn: refuse new connections (HTTP 503;
``/readyz`` keeps answering 503 "draining") and report not ready; tell every client (``ERROR nil
SHUTTING_DOWN``: the SDK moves to
another node) and PING it, and read on until it answers (PONG) or leaves, for at most
``NOTICE_WAIT`` s (broker/lifecycle.py, where the drain's order is): its REQUESTs sent
before it heard the notice are then read, so none is
lost with the connection; answer new REQUESTs with SHUTTING_DOWN; let calls in flight finish for
up to ``server.drain_timeout`` seconds (a second ``stop()`` cuts that short);
answer SHUTTING_DOWN to calls still waiting for discovery (none ran: the SDK sends
them to another node) and abandon the rest; close every connection with 1001 (going away); return.
Cancelling ``run()``
skips the drain and closes at once.

The same port answers plain HTTP (``Node.http``):
``GET /healthz`` (liveness: 200 when serving, 503 otherwise), ``GET /readyz``
(readiness: also 503 while the cluster bus is down or not yet joined, with
the reason), ``GET /stats`` (JSON counters: the router's outcomes and drops,
frames and messages per direction) and ``GET /metrics`` (Prometheus). With
``server.admin_token_sha256`` set, /stats, /metrics, /cluster and /dashboard answer
only requests with that token (``Authorization: Bearer`` or ``?token=``); the
probes stay open.
"""

from __future__ import annotations

import asyncio
import secrets
import ssl
import time
from collections import Counter
from functools import partial
from typing import Any, Callable, cast

import structlog

from rpcbus import errors
from rpcbus.broker import endpoints, readouts
from rpcbus.broker.config import Config, ConfigError
from rpcbus.broker.ds_session import DeepstreamSession
from rpcbus.broker.events import Events
from rpcbus.broker.gate import Gate
from rpcbus.broker.history import SCAN_INTERVAL
from rpcbus.broker.lifecycle import (
    ANNOUNCE,
    CLOSE,
    CUT_OFF,
    HAND_BACK,
    REACHABLE_AGAIN,
    TELL,
    WAIT,
    Drain,
    Watch,
)
from rpcbus.broker.notify import Notifier
from rpcbus.broker.presence import Presence
from rpcbus.broker.router import Router
from rpcbus.broker.session import CUT_OFF_NOTICE, Session
from rpcbus.broker.session_rules import SessionRules
from rpcbus.broker.weights import WeightsError, WeightsFile
from rpcbus.cluster.messages import event_channel, new_incarnation
from rpcbus.cluster.warnings import SparseWarnings
from rpcbus.handshake import HttpRequest
from rpcbus.protocol import DRAIN_PING, ERROR, GAP, OK, PING
from rpcbus.transport import CloseCode
from rpcbus.websocket import HttpAnswer

log = structlog.get_logger(module="rpcbus.node")
BUS_WAIT_S = 5.0  # how long a starting node waits for Redis before taking clients

WEIGHTS_CHECK = 2.0  # s between looks at the weights file's modification time


class Node:
    """Composition root of one node; see the module docstring for its life."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.name = config.node.name or f"node-{secrets.token_hex(3)}"
        self.router = Router(
            ack_timeout=config.rpc.ack_timeout,
            response_timeout=config.rpc.response_timeout,
            max_timeout=config.rpc.max_timeout,
            granularity=config.rpc.timer_granularity,
            max_name=config.limits.max_name_length,
            now=time.monotonic(),  # asyncio's clock
            prefer_local=config.cluster.prefer_local,
            affinity=config.cluster.affinity,
            policy=config.cluster.policy,
            clock=time.perf_counter if config.server.per_rpc_metrics else None,
            ack_timeout_max=config.rpc.ack_timeout_max,
            queue_target=config.rpc.queue_target,
            queue_interval=config.rpc.queue_interval,
            max_concurrency=config.rpc.max_concurrency,
            max_fanout=config.limits.max_fanout,
            name=self.name,
        )
        self.link: Any = None  # the ClusterLink when cluster.redis_url is set
        self.history: Any = None  # cluster.history.History when history.dir is set
        from rpcbus.broker.config import check_serving

        check_serving(config)  # raises ConfigError: no users and auth not off on purpose
        self.weights_file: WeightsFile | None = None
        if config.rpc.weights_file:
            try:
                self.weights_file = WeightsFile(config.rpc.weights_file)
            except WeightsError as e:
                raise ConfigError(f"rpc.weights_file: {e}") from None
            self.router.draws.set_weights(self.weights_file.weights)
        self.gate = Gate(config)
        self.events = Events(new_incarnation())  # with the cluster's bus once run() has one
        self.presence = Presence()  # the same
        # SUBSCRIBEs answered once Redis hears their channels: (session, ref, channels)
        self._unconfirmed: list[tuple[SessionRules, int, list[str]]] = []
        self.sessions: set[Session] = set()     # connections upgraded to WebSocket
        self.connections: set[Session] = set()  # every TCP connection, HTTP ones too
        self.stats: Counter[str] = Counter()
        self.warnings = SparseWarnings(log)   # what a flood repeats: once a second at most
        self.ready = False
        self.failed: str | None = None   # why the node stopped by itself (exit code 1)
        self.draining = False
        # the stall hold and the cut-off rule (broker/lifecycle.py); the drain once stopping
        self._watch = Watch(time.monotonic(), config.cluster.evacuate_after)
        self._drain: Drain | None = None
        self.url = ""
        self.port = 0
        self._session_seq = 0
        self.started = time.time()   # the wall clock at start: uptime (broker/readouts.py)
        self._stop = asyncio.Event()
        self._unheard: set[SessionRules] = set()  # draining: clients yet to answer the notice
        self.closed_totals: Counter[str] = Counter()   # closed sessions' frame counters
        self.notifier = Notifier()
        # re-reads the configuration for a reload (SIGHUP, POST /reload): set by the CLI
        self.config_source: Callable[[], Config] | None = None

    # -- life ----------------------------------------------------------------------------

    def stop(self) -> None:
        """Begin the graceful shutdown; called again during it, skip the rest of the drain.

        Safe from a signal handler: a second SIGTERM or Ctrl-C forces a quick exit.
        """
        if self._stop.is_set() and self._drain is not None and self._drain.phase != "closed":
            log.warning("drain_skipped", node=self.name, abandoned=self.router.pending)
            self._drain.skip()
        if not self._stop.is_set():
            self.notifier.stopping("draining: calls in flight finish, new ones go elsewhere")
        self._stop.set()

    async def run(self) -> None:
        cfg = self.config
        self._warn_if_open()
        tls = None
        if cfg.server.tls_cert:
            tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            tls.load_cert_chain(cfg.server.tls_cert, cfg.server.tls_key)
        server = await asyncio.get_running_loop().create_server(
            lambda: Session(self), cfg.node.host, cfg.node.port, ssl=tls)
        self.port = server.sockets[0].getsockname()[1]
        host = cfg.node.host if ":" not in cfg.node.host else f"[{cfg.node.host}]"
        self.url = f"{'wss' if tls else 'ws'}://{host}:{self.port}"
        bus = None
        if cfg.cluster.redis_url:
            from rpcbus.cluster.link import ClusterLink
            self.link = ClusterLink(self.router, cfg.cluster, self.name, self.url,
                                    partial(readouts.heartbeat, self))
            link_bus = self.link.bus
            self.events = Events(self.link.core.incarnation, cfg.cluster.namespace,
                                 link_bus.outbox.publish,
                                 link_bus.listen, cfg.cluster.event_max_age)
            self.link.core.on_event = self.events.heard
            control = self.link.core.control
            self.presence = Presence(lambda msg: link_bus.outbox.publish(control, msg))
            self.link.core.presence = self.presence
            link_bus.on_listening = self._confirm_subscriptions
            self.link.on_lost = self._events_cut_off
            bus = asyncio.create_task(self.link.run(), name="rpcbus-bus")
            bus.add_done_callback(self._bus_ended)
        if cfg.history.dir:
            from rpcbus.broker.history import History, HistoryWriter

            self.history = History(self.name, cfg.history.window,
                                   HistoryWriter(cfg.history.dir, self.name,
                                                 cfg.history.max_queued), time.time(),
                                   policy=cfg.cluster.policy)
            self.router.record(self.history)
        ticker = asyncio.create_task(self._tick_forever(), name="rpcbus-ticker")
        try:
            if self.link is not None:
                await self._wait_for_bus()
            self.ready = True
            if self.link is not None:
                self.link.set_state("ready")
            self.notifier.ready(f"serving on {self.url}")
            log.info("node_ready", node=self.name, url=self.url, port=self.port,
                     cluster=bool(self.link))
            await self._stop.wait()
            await self._shutdown(server)
        finally:
            ticker.cancel()
            if bus is not None:  # its Redis links closed before this returns
                bus.cancel()
                await asyncio.wait((bus,), timeout=5.0)
            server.close()
            for connection in list(self.connections):  # what is left: closed at once
                connection.transport.abort()
            await server.wait_closed()
            self.gate.close()
            self.notifier.close()
            if self.history is not None:  # the last (partial) window, then the file
                self.history.roll(time.time(), self.router.history_pending(), force=True,
                                  weights=self.router.draws.weights,
                                  provided=self.router.provided_pairs)
                await asyncio.to_thread(self.history.writer.close)
            log.info("node_stopped", node=self.name, **self.router.stats.as_dict())

    def _bus_ended(self, task: asyncio.Task[None]) -> None:
        """The bus reconnects after any error; should its task still end, the node stops
        loudly (exit code 1) rather than serve on, cut off, behind a green /readyz."""
        if task.cancelled() or self._stop.is_set():
            return
        exc = task.exception()
        self.failed = f"the cluster bus stopped: {exc!r}"
        log.critical("bus_task_ended", node=self.name, error=repr(exc))
        self.stop()

    async def _wait_for_bus(self) -> None:
        """Take no clients until the cluster bus is up and a first round of heartbeats has
        been heard (the node knows its peers), for at most BUS_WAIT_S: a call that arrived
        first (a client reconnecting at once to a restarted node) would fail
        CLUSTER_UNAVAILABLE, or wait for the join to find its providers. Meanwhile the
        WebSocket handshake is answered 503 "starting", which the SDKs take as "try again,
        or another URL". Past BUS_WAIT_S, serve local calls and say why in /readyz."""
        assert self.link is not None
        try:
            async with asyncio.timeout(BUS_WAIT_S):
                await self.link.wait_joined()
        except TimeoutError:
            log.warning("node_ready_without_bus", node=self.name, waited_s=BUS_WAIT_S,
                        detail="cross-node calls fail CLUSTER_UNAVAILABLE until Redis answers")

    def _warn_if_open(self) -> None:
        """Say so at start when clients or the cluster bus are not protected."""
        cfg = self.config
        loopback = cfg.node.host in ("127.0.0.1", "::1", "localhost")
        if cfg.auth.mode == "none":
            (log.warning if loopback else log.error)(
                "auth_disabled", detail="every client may provide and call anything",
                host=cfg.node.host, loopback_only=loopback)
        if not cfg.server.tls_cert and not loopback:
            log.warning("tls_disabled", detail="clients connect with ws://: credentials and "
                        "data cross the network in clear", host=cfg.node.host)
        if cfg.cluster.redis_url and cfg.cluster.seal == "none":
            log.warning("cluster_bus_unsealed", detail="whoever can publish on Redis can make "
                        "this node run calls: set cluster.seal to sign or encrypt")
        if not cfg.server.admin_token_sha256 and not loopback:
            log.warning("admin_endpoints_open", detail="/metrics, /stats, /cluster and "
                        "/dashboard answer anyone who reaches the port: set "
                        "server.admin_token_sha256 (rpcbus new-token)", host=cfg.node.host)

    async def _shutdown(self, server: Any) -> None:
        """The drain, in broker/lifecycle.py ``Drain``'s order, a step per sweep."""
        self.ready = False
        self.draining = True
        self.router.drain()
        loop = asyncio.get_running_loop()
        drain = self._drain = Drain(self.config.server.drain_timeout)
        interval = self.config.rpc.timer_granularity
        while True:
            step = drain.next(loop.time(), self._bus_flushed(), len(self._unheard),
                              self.in_flight, self.router.pending)
            if step == WAIT:
                await asyncio.sleep(interval)
            elif step == ANNOUNCE:
                if self.link is not None:
                    self.link.set_state("terminating")  # other nodes stop sending new calls
            elif step == TELL:
                for session in list(self.sessions):  # clients move to another node now
                    session.send([ERROR, None, errors.SHUTTING_DOWN,
                                  "this node is shutting down: connect to another node"])
                    if session.core.authenticated:
                        session.send([PING, DRAIN_PING])
                        self._unheard.add(session.core)
                log.info("node_draining", node=self.name,
                         deadline_s=self.config.server.drain_timeout, pending=self.in_flight)
            elif step == HAND_BACK:  # drain cut short: calls no provider took go elsewhere
                log.warning("drain_timeout", node=self.name, pending=self.router.pending)
                handed = self.router.hand_back()
                log.warning("drain_unfinished", node=self.name, handed_back=handed,
                            abandoned=self.router.pending)
            else:
                assert step == CLOSE, step
                break
        if drain.unheard:
            log.info("drain_notice_unanswered", node=self.name, clients=drain.unheard)
        for session in list(self.sessions):
            session.flush()
            session.fail_now(CloseCode.GOING_AWAY, "node shutting down")

    def _bus_flushed(self) -> bool:
        """The bus has nothing queued or unanswered (or it is down, or there is none)."""
        return self.link is None or self.link.bus.idle

    @property
    def in_flight(self) -> int:
        """Calls this node still has under way: routed here, or starting from other nodes."""
        return self.router.pending + (self.link.starting if self.link is not None else 0)

    def notice_heard(self, session: SessionRules) -> None:
        """``session`` answered the draining PING, or closed."""
        self._unheard.discard(session)

    async def _tick_forever(self) -> None:
        """The one timer of the node: sweeps deadlines every ``rpc.timer_granularity``,
        after a stall only once the backlog was read, and sends clients elsewhere when
        the node stalled or was cut off that long (broker/lifecycle.py ``Watch``)."""
        loop = asyncio.get_running_loop()
        interval = self.config.rpc.timer_granularity
        router = self.router
        watch = self._watch
        watch.last = loop.time()  # the sweeps start now: the start-up is not a stall
        weights_due = watch.last + WEIGHTS_CHECK
        history_due = watch.last
        while True:
            await asyncio.sleep(interval)
            now = loop.time()
            run, stalled, evacuate = watch.swept(now, self.draining)
            if stalled:
                log.warning("node_stalled", node=self.name, stalled_s=round(stalled, 3))
                if self.link is not None:
                    self.link.stalled(now)
                    if evacuate:  # the cluster gave it up meanwhile
                        self._send_clients_elsewhere(stalled, "this node was stalled")
            if not run:
                continue
            router.read_at = time.perf_counter()   # outcomes' time (per-rpc latency)
            router.tick(now)
            if self.events.tick():
                self.warnings.warn("events_shed", shed=self.events.stats["shed"])
            if self.link is not None:
                self.link.tick(now)
                said, for_s = watch.bus(now, self.link.available, self.draining)
                if said == CUT_OFF:
                    self._send_clients_elsewhere(for_s, "the cluster bus (Redis) is "
                                                 "unreachable")
                elif said == REACHABLE_AGAIN:
                    log.info("cluster_reachable_again", node=self.name)
            if self.history is not None and now >= history_due:
                history_due = now + SCAN_INTERVAL
                pending = router.history_pending()
                self.history.scan(pending)
                self.history.roll(time.time(), pending, weights=router.draws.weights,
                                  provided=router.provided_pairs)
            if self.weights_file is not None and now >= weights_due:
                weights_due = now + WEIGHTS_CHECK
                self._reload_weights()

    @property
    def cut_off(self) -> bool:
        """The bus has been down past ``cluster.evacuate_after``: clients were sent on."""
        return self._watch.cut_off

    def _send_clients_elsewhere(self, for_s: float, reason: str) -> None:
        """Tell every client to move to another node it knows (CUT_OFF_NOTICE)."""
        told = [s for s in self.sessions if s.core.authenticated]
        for session in told:
            session.send(CUT_OFF_NOTICE)
        self.stats["clients_sent_elsewhere"] += len(told)
        log.warning("clients_sent_elsewhere", node=self.name, clients=len(told),
                    for_s=round(for_s, 3), reason=reason)

    def _reload_weights(self) -> None:
        """The weights file changed: use it (a bad one is logged, the old weights stay)."""
        assert self.weights_file is not None  # only watched when there is one
        try:
            weights = self.weights_file.reload()
        except WeightsError as e:
            log.error("weights_file_invalid", node=self.name, error=str(e),
                      hint="the weights loaded before stay in use")
            return
        if weights is not None:
            self.router.set_weights(weights)
            log.info("weights_reloaded", node=self.name, path=self.weights_file.path,
                     rpcs=len(weights.rpcs))

    # -- reload --------------------------------------------------------------------------

    def reload(self) -> tuple[bool, str]:
        """Read the configuration again (``config_source``) and apply what may change
        while running (broker/reload.py): users and permissions (sessions whose rights
        shrank lose them now; their calls in flight finish), limits (new connections and
        every rate check), the weights file, the admin token. What needs a restart is
        kept and named. A configuration that does not load is refused whole and the
        running one kept. Returns (applied, one line saying what happened)."""
        from rpcbus.broker import reload as reloading

        if self.config_source is None:
            return False, "this node has no configuration source to read again"
        self.notifier.reloading()
        try:
            config = self.config_source()
            weights_file = self.weights_file
            if config.rpc.weights_file != self.config.rpc.weights_file:
                weights_file = (WeightsFile(config.rpc.weights_file)
                                if config.rpc.weights_file else None)
        except (ConfigError, WeightsError, OSError) as exc:
            log.error("config_reload_refused", node=self.name, error=str(exc))
            self.notifier.ready(f"serving on {self.url} (the last reload was refused)")
            return False, f"refused, the running configuration kept: {exc}"
        said = reloading.summary(self.config, config)
        self.config = reloading.merged(self.config, config)
        self.gate.reload(self.config)
        self.router.limits_changed(self.config.limits.max_fanout)
        if weights_file is not self.weights_file:
            self.weights_file = weights_file
            self.router.set_weights(weights_file.weights if weights_file else None)
        for session in list(self.sessions):
            session.core.rights_changed()
        log.info("config_reloaded", node=self.name, **said)
        if said["needs_restart"]:
            log.warning("config_reload_needs_restart", node=self.name,
                        keys=said["needs_restart"])
        self.notifier.ready(f"serving on {self.url}")
        line = "reloaded: " + (", ".join(said["applied"]) or "nothing changed")
        if said["needs_restart"]:
            line += "; kept until a restart: " + ", ".join(said["needs_restart"])
        return True, line

    # -- sessions ------------------------------------------------------------------------

    def session_opened(self, session: Session) -> None:
        """A connection upgraded to WebSocket: a session (``sessions``) until it closes."""
        self.sessions.add(session)
        self.stats["connections"] += 1

    def new_session_id(self) -> str:
        self._session_seq += 1
        return f"s{self._session_seq}"

    def session_closed(self, session: Session) -> None:
        core = session.core
        if session in self.sessions:
            self.sessions.discard(session)
            self.notice_heard(core)
        self.router.read_at = time.perf_counter()
        self.router.drop_peer(core, asyncio.get_running_loop().time())
        self.events.gone(core)
        self.presence.gone(core)
        if core.present_as is not None:
            self.presence.logout(core.present_as)
        self.closed_totals.update(readouts.session_counters(session))
        # one line per client; connections that never logged in are counted (/stats) and
        # logged at debug only, so a flood of them cannot flood the log
        (log.info if core.authenticated else log.debug)(
            "session_closed", session=core.sid, label=core.label,
            frames_in=session.frames_in, frames_out=session.frames_out,
            dropped_out=session.dropped_out)

    # -- events (broker/events.py) -------------------------------------------------------

    def subscribed(self, session: SessionRules, ref: int, topics: list[str]) -> None:
        """OK for the SUBSCRIBE ``ref`` once Redis hears its topics' channels for this node:
        from then on every event emitted anywhere in the cluster reaches the subscriber.
        At once when they are heard already, or cannot be (no cluster, the bus down)."""
        if self.link is None:
            session.send([OK, ref])
            return
        listening = self.link.bus.listening
        channels = [event_channel(self.config.cluster.namespace, t) for t in topics]
        if not self.link.available or all(listening.get(c) for c in channels):
            session.send([OK, ref])
        else:
            self._unconfirmed.append((session, ref, channels))

    def _confirm_subscriptions(self) -> None:
        """Redis confirmed event channels: the SUBSCRIBEs waiting for them are answered."""
        listening = self.link.bus.listening
        waiting: list[tuple[SessionRules, int, list[str]]] = []
        for session, ref, channels in self._unconfirmed:
            if all(listening.get(c, True) for c in channels):  # (or no longer wanted)
                session.send([OK, ref])
            else:
                waiting.append((session, ref, channels))
        self._unconfirmed = waiting

    def _events_cut_off(self) -> None:
        """The bus went down: events from other nodes are lost until it is back. Each
        subscriber is told (a GAP without topic or count), and the SUBSCRIBEs waiting
        for Redis are answered."""
        for session, ref, _ in self._unconfirmed:
            session.send([OK, ref])
        self._unconfirmed = []
        subscribers = self.events.every_subscriber()
        self.stats["events_cut_off_notices"] += len(subscribers)
        for sub in subscribers:
            sub.send([GAP, None, None])

    # -- HTTP ----------------------------------------------------------------------------

    def http(self, request: HttpRequest) -> HttpAnswer | None:
        """The answer to a plain HTTP request on the client port (broker/endpoints.py),
        or None to take it as a WebSocket client."""
        return endpoints.answer(self, request)

    def deepstream(self, session: Session, request: HttpRequest) -> HttpAnswer | None:
        """A request for ``[deepstream] path``: with ``[deepstream] enabled`` the session
        becomes a DeepstreamSession (deepstream's protocol from its first frame), else 404
        saying how to enable it; 503 while the node starts or drains, as for every client
        (a draining node closes its deepstream clients once idle: taking them back would
        loop)."""
        if not self.config.deepstream.enabled:
            return 404, (b"deepstream's protocol is not enabled on this node: set "
                         b"[deepstream] enabled = true (or rpcbus node --deepstream)\n"), {}
        if not request.wants_websocket:
            return 426, b"this path speaks deepstream's protocol over WebSocket\n", {}
        refused = endpoints.not_taking(self)  # as for any client: it backs off, comes back
        if refused is not None:
            return refused
        session.__class__ = DeepstreamSession  # the path comes after the connection
        cast(DeepstreamSession, session).became_deepstream()
        return None

    def not_ready(self) -> str | None:
        """Why this node should get no traffic now (``/readyz``), or None when ready."""
        if self.draining:
            return "draining"
        if not self.ready:
            return "starting"
        if self.link is not None:
            if not self.link.available:
                return "cluster bus (Redis) unreachable"
            now = asyncio.get_running_loop().time()
            if not self.link.joined(now):
                return "joining the cluster"
            skew: str | None = self.link.clock_problem(now)
            if skew is not None:
                return skew
        return None

    def discover(self, name: str | None, may_call: Callable[[str], bool]) -> Any:
        """DISCOVER's answer (broker/readouts.py)."""
        return readouts.discover(self, name, may_call)

    def cluster_view(self) -> dict[str, Any]:
        """This node and every node it hears (``/cluster``; broker/readouts.py)."""
        return readouts.cluster_view(self)

    @property
    def state(self) -> str:
        return "draining" if self.draining else ("ready" if self.ready else "starting")

    def snapshot(self) -> dict[str, Any]:
        """Counters for /stats and the benchmarks (broker/readouts.py)."""
        return readouts.snapshot(self)
