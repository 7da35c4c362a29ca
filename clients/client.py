"""The Python SDK: connect to a node (or any of several), provide RPCs, call them.

A ``Client`` holds one WebSocket connection at a time ("wire"). Calls are
correlated by ids the client assigns; each pending call is one future in one
map, removed in ``finally`` whatever happens. The node enforces every
deadline; the client keeps a safety deadline of its own (the call's timeout
plus ``grace``) swept by one task, so a call ends even if no node answers.

Losing the connection: calls already sent on it fail at once with
CONNECTION_LOST — except those made with ``idempotent=True``, which are sent
again on the next connection (should a node then answer one with a code that
says "did not run", it fails CONNECTION_LOST instead: it may have run on the
lost one). The caller's rules are a pure core, ``rpcbus.calling.Calls``; this
class keeps the futures and the connections. Unless ``reconnect=False``, the client then
connects again, with backoff and jitter, to the next of its URLs, provides
again every name it provided, and goes on; calls made meanwhile wait for the
connection (they were not sent, so they cannot have run) until their
deadline. A node that is shutting down tells its clients: the client moves to
another URL at once, while calls and handlers already on the old connection
finish there; a call the node refused with SHUTTING_DOWN never ran, so it is
sent again on the next connection (not failed). A node cut off from the
cluster says so too (a CLUSTER_UNAVAILABLE notice): the client moves to another
of its URLs if one answers, the same way, else it stays (local calls still
work there). A node still starting answers 503 "starting", one with too many
connections 503 "busy"/"full" or 429: ``connect`` waits for it within
``open_timeout`` (not for a node draining: 503 "draining" fails at once).
``on_state`` hears "connected", "reconnecting" and "closed".

Providing: a handler gets the request's data (and, if it takes a second
positional argument, a ``CallContext``). A coroutine function runs on the
client's loop, in a context of its own: its first step at once, in the tick that
read the REQUEST, and the rest (if it suspends) in a Task, so one that answers
without suspending costs no Task; a plain function runs in a worker thread (at most
``handler_threads`` at once; more calls wait for a thread), so it may block.
Every call's ACCEPT is written to the socket before any of its handler's code
runs, and a REQUEST read after half the node's ack timeout is refused unrun
(REJECT), judged per REQUEST: so however long a handler blocks — a thread, or
an ``async def`` that holds the loop — the node never moves a call that started
here, and never runs one twice. ``Reject`` hands the call to another
provider; ``AppError`` reaches the caller whole (code, message, data); any other
exception answers PROVIDER_ERROR "Type: text", never a traceback (logged here,
with the rpc's name and the call id). A CANCEL from the node (it gave the attempt
up) cancels the Task; a plain function not yet started in its thread never
starts, one running cannot be stopped (its answer is dropped). The provider's rules
are a pure core too, ``rpcbus.provider.Serving``; running the handlers is
``rpcbus.running.Runner``'s.

Cancelling ``call()`` is safe: the call is forgotten here and a late answer is
dropped. Cancelling ``provide()`` may leave the name provided on the node.

Why one module this long (about 1,100 lines): ``Client`` is the SDK's whole public
surface (calling, streams, call_all, providing, events, presence, discovery, close and
drain), and every one of those reads and writes the same connection and the same
futures, through reconnects and moves between nodes. The rules are in pure cores
(``calling``, ``provider``, ``streaming``, ``events``, ``credentials``); what is left
here is the shell that feeds them, and running handlers is ``running``'s.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import ssl
import time
from typing import Any, Callable, Sequence, TypedDict, Unpack

from rpcbus import errors
from rpcbus.backoff import Backoff
from rpcbus.calling import Calls, Reply, reply_of
from rpcbus.credentials import RETRY, Credentials, TokenSource, renew_in
from rpcbus.events import EventHandler, GapHandler, PresenceHandler, Subscriptions, Watchers
from rpcbus.found import ProviderInfo, RpcInfo
from rpcbus.handlers import (
    CallContext,
    Handler,
    describe,
)
from rpcbus.protocol import (
    ALL,
    AUTH,
    AUTH_FAIL,
    AUTH_OK,
    CANCEL,
    CREDIT,
    DISCOVER,
    EMIT,
    ERROR,
    EVENT,
    FOUND,
    GAP,
    MAX_WINDOW,
    OK,
    PART,
    PING,
    PONG,
    PRESENCE,
    PRESENCE_GET,
    PRESENCE_SUBSCRIBE,
    PRESENCE_UNSUBSCRIBE,
    PROTOCOL_VERSION,
    PROVIDE,
    REPLY,
    REQUEST,
    RESPONSE,
    STREAM,
    SUBSCRIBE,
    UNPROVIDE,
    UNSUBSCRIBE,
    decode_each,
    valid_name,
)
from rpcbus.provider import Held, Serving
from rpcbus.running import Entry, Runner
from rpcbus.streaming import DEFAULT_WINDOW
from rpcbus.streams import Flow, Stream
from rpcbus.transport import OPEN, FrameData
from rpcbus.websocket import ClientConnection, HandshakeError, HandshakeRefused, dial

__all__ = ["CallContext", "Client", "connect"]

log = logging.getLogger("rpcbus.client")  # no handler of ours: the application decides




# how a node's HTTP 503 begins when it will take this client soon (not when it drains)
SOON = (b"starting", b"busy", b"full")
SWEEP = 0.05  # s between sweeps of the calls' deadlines (and ticks of ``Held``)


class _Wire(ClientConnection):
    """One WebSocket connection of a Client; frames go to the Client as they arrive."""

    owner: Client
    url: str
    auth: asyncio.Future[dict[str, Any]]
    session: dict[str, Any]                # the node's AUTH_OK
    draining = False                       # its node is shutting down: no new calls here
    expired = False                        # its session's token expired: rights ended
    serving: Serving                       # its provider side (clients/provider.py)

    def frame_received(self, data: FrameData) -> None:
        self.owner._on_frame(self, data)

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        owner = getattr(self, "owner", None)
        if owner is not None:
            owner._on_lost(self, exc)

    def unencodable(self, msg: list[Any], exc: Exception) -> list[Any] | None:
        if msg[0] == PART:
            self.stop_stream(msg[1])
        return self.owner._unencodable(msg, exc)

    def oversized(self, msg: list[Any], size: int) -> list[Any] | None:
        if msg[0] == PART:
            self.stop_stream(msg[1])
        return self.owner._oversized(msg, size, self.max_out_frame)

    def stop_stream(self, attempt: int) -> None:
        """A part of a stream served here could not be sent: its generator stops (the
        node hears the error in the part's place)."""
        task = self.serving.cancel(attempt)
        if task is not None:
            task.cancel()


class Options(TypedDict, total=False):
    """The options of ``connect`` and ``connect_sync`` (``Client``'s keywords): a
    misspelt one is a type error under mypy and a TypeError at run time."""

    name: str | None
    user: str | None
    password: str | None
    # a token, or a function (plain or async) returning one: called for each login and
    # before a JWT expires, to renew the session's rights on the same connection
    # (clients/credentials.py)
    token: TokenSource | None
    open_timeout: float
    grace: float
    max_size: int
    ping_interval: float | None
    reconnect: bool
    backoff: Backoff | None
    on_state: Callable[[str], None] | None
    ca_file: str | None
    ssl_context: ssl.SSLContext | None
    handler_threads: int


class Client:
    """Connections to one or several nodes. Build it with ``rpcbus.connect(...)``."""

    _calls: Calls[_Wire]   # the caller rules; made by connect(), on the loop's clock

    def __init__(self, urls: str | Sequence[str], *, name: str | None = None,
                 user: str | None = None, password: str | None = None,
                 token: TokenSource | None = None, open_timeout: float = 10.0,
                 grace: float = 1.0,
                 max_size: int = 16 << 20, ping_interval: float | None = 20.0,
                 reconnect: bool = True, backoff: Backoff | None = None,
                 on_state: Callable[[str], None] | None = None,
                 ca_file: str | None = None, ssl_context: ssl.SSLContext | None = None,
                 handler_threads: int = 32) -> None:
        self.urls = [urls] if isinstance(urls, str) else list(urls)
        if not self.urls:
            raise ValueError("connect needs at least one URL")
        if type(handler_threads) is not int or handler_threads < 1:
            raise ValueError("handler_threads must be a positive integer")
        for url in self.urls:
            if not isinstance(url, str) or not url.startswith(("ws://", "wss://")):
                raise ValueError(f"not a WebSocket URL (ws:// or wss://): {url!r}")
        self.name = name
        self.state = "connecting"
        self._creds = Credentials(user, password, token)
        self._renewal: asyncio.TimerHandle | None = None  # the next token renewal
        self._renewing: asyncio.Task[None] | None = None
        self._open_timeout, self._grace = open_timeout, grace
        self._max_size, self._ping_interval = max_size, ping_interval
        self._reconnect, self._backoff = reconnect, backoff or Backoff(0.05, 5.0)
        self._on_state = on_state
        # wss://: the server's certificate is verified (system CAs, or ca_file's)
        self._ssl = ssl_context or (ssl.create_default_context(cafile=ca_file) if ca_file
                                    else None)
        self._next_url = 0
        self._wire: _Wire | None = None        # the connection new calls go to
        self._connected = asyncio.Event()
        self._ids = itertools.count(1)
        self._handlers: dict[str, Entry] = {}
        self._frame_read: tuple[float, float] | None = None  # the frame being read's
        self._events = Subscriptions()         # event topics and their handlers
        self._watchers = Watchers()            # presence handlers
        self._wires: set[_Wire] = set()        # open connections (new calls use _wire)
        self._runner = Runner(handler_threads)  # the handlers: threads, counts
        self._sweeper: asyncio.Task[None] | None = None
        self._reconnecting: asyncio.Task[None] | None = None
        self._moving: asyncio.Task[None] | None = None    # off a node cut off from the cluster
        self._retiring: set[asyncio.Task[None]] = set()   # closing connections left behind
        self._closed = False
        self.session: dict[str, Any] = {}     # the current node's AUTH_OK fields
        self._default_timeout = 10.0
        self._max_timeout = 0.0  # the node's longest timeout (AUTH_OK), 0 until told
        self._last_url: str | None = None  # of the last connection used (logs)
        self._last_error = ""
        self._last_exc: Exception | None = None
        self.stale_requests = 0               # REQUESTs refused unrun: read too late
        self._full = self._runner.workers_full  # Serving.request's ``full``, bound once
        self.messages_dropped = 0             # from the node, undecodable (logged)
        self._starting_seen = False           # the last pass met a node saying "soon"

    @property
    def url(self) -> str:
        """The URL of the current (or last) connection."""
        return self._wire.url if self._wire is not None else self.urls[self._next_url - 1]

    @property
    def closed(self) -> bool:
        return self._closed

    # -- life ----------------------------------------------------------------------------

    async def _open(self) -> "Client":
        loop = asyncio.get_running_loop()
        self._calls = Calls[_Wire](loop.time(), self._grace, SWEEP)
        # Nodes still starting (joining the cluster) answer 503 "starting", nodes with too
        # many connections 503 "busy"/"full" or 429: wait for them within open_timeout,
        # trying every URL again; any other failure (a node draining) is final here.
        give_up = loop.time() + self._open_timeout
        again = Backoff(0.05, 0.5)
        while True:
            wire = await self._connect_any(avoid=None)
            if wire is not None or not self._starting_seen:
                break
            delay = again.next()
            if loop.time() + delay >= give_up:
                break
            await asyncio.sleep(delay)
        if wire is None:
            self._set_state("closed")
            self._closed = True
            if isinstance(self._last_exc, errors.RpcError):  # e.g. refused credentials
                raise self._last_exc
            raise errors.ConnectFailedError(None, f"cannot connect to {self._last_error}")
        self._use(wire)
        # ticked from now, as the sweeper is: the time connecting took (a node starting,
        # or holding an address) is no stall of this loop, nor are frames read after it late
        self._held = Held(SWEEP, loop.time())
        self._sweeper = loop.create_task(self._sweep_forever(), name="rpcbus-client-sweeper")
        return self

    async def _connect_any(self, avoid: str | None, skip: bool = False) -> _Wire | None:
        """One pass over the URLs (``avoid`` last, or not at all with ``skip``); the first
        authenticated wire, or None."""
        order = [self.urls[(self._next_url + i) % len(self.urls)] for i in range(len(self.urls))]
        if avoid in order and len(order) > 1:
            order.remove(avoid)
            if not skip:
                order.append(avoid)
        self._last_error, self._last_exc = "no URL tried", None
        self._starting_seen = False
        for url in order:
            self._next_url = (self.urls.index(url) + 1) % len(self.urls)
            try:
                return await self._handshake(url)
            except (OSError, TimeoutError, HandshakeError, errors.RpcError) as exc:
                said = str(exc) or (f"no answer within open_timeout ({self._open_timeout:g} s)"
                                    if isinstance(exc, TimeoutError) else type(exc).__name__)
                self._last_error, self._last_exc = f"{url}: {said}", exc
                if isinstance(exc, HandshakeRefused) and (
                        exc.status == 429 or (exc.status == 503
                                              and exc.body.startswith(SOON))):
                    self._starting_seen = True  # starting, or too many connecting: soon
        return None

    async def _handshake(self, url: str) -> _Wire:
        loop = asyncio.get_running_loop()
        wire: _Wire | None = None
        try:
            async with asyncio.timeout(self._open_timeout):
                wire = await dial(_Wire, url, self._ssl)
                wire.max_size = self._max_size
                wire.start_keepalive(self._ping_interval, self._ping_interval)
                wire.owner, wire.url = self, url
                wire.serving = Serving(wire.send, self._handlers.get)
                try:
                    creds = await self._creds.params()
                except Exception as exc:  # the application's token function failed
                    raise errors.NotAuthenticatedError(
                        None, f"the token function raised {exc!r}") from exc
                # event_origins: it takes EVENTs with their origin and number (and drops
                # one it had already: clients/events.py ``Seen``)
                params: dict[str, Any] = {"protocol": PROTOCOL_VERSION, **creds,
                                          "event_origins": True}
                if self.name:
                    params["name"] = self.name
                busy = Backoff(0.05, 1.0)
                while True:  # AUTH_FAIL BUSY: the node could not check it now; again, later
                    wire.auth = loop.create_future()
                    wire.send([AUTH, params])
                    try:
                        wire.session = await wire.auth
                        break
                    except errors.BusyError:
                        await asyncio.sleep(busy.next())
                wire.serving.freshness.stale_after_ms = wire.session.get(
                    "ack_timeout_ms", 1000) / 2
                wire.serving.accept_upto = wire.session.get("accept_upto") is True
                wire.stamps = wire.session.get("sent") is True
                max_frame = wire.session.get("max_frame")
                if type(max_frame) is int and max_frame > 0:  # never send more than that
                    wire.max_out_frame = max_frame
                max_messages = wire.session.get("max_frame_messages")
                if type(max_messages) is int and max_messages > 0:
                    wire.max_out_messages = max_messages
            self._renew_later()
            return wire
        except BaseException:
            if wire is not None:
                wire.owner = None  # type: ignore[assignment]  # its loss is not ours
                wire.transport.abort()
            raise

    def _use(self, wire: _Wire) -> None:
        """Make ``wire`` the connection for new calls; send what waited for one."""
        self._wire = wire
        self._last_url = wire.url
        self._wires.add(wire)
        self.session = wire.session
        self._default_timeout = self.session.get("response_timeout_ms", 10000) / 1000
        self._max_timeout = self.session.get("max_timeout_ms", 0) / 1000  # 0: not told
        if self._handlers:  # provide again everything provided before
            wire.send([PROVIDE, next(self._ids), list(self._handlers)])
        topics = self._events.topics
        if topics:  # and subscribe again (the events in between were lost: told at the loss)
            for i in range(0, len(topics), 100):  # within any node's max_names_per_message
                wire.send([SUBSCRIBE, next(self._ids), topics[i:i + 100]])
        for users in self._watchers.asked():  # and watch presence again
            for i in range(0, len(users or [None]), 100):
                wire.send([PRESENCE_SUBSCRIBE, next(self._ids),
                           None if users is None else users[i:i + 100]])
        self._send_queued(wire)
        self._connected.set()
        self._backoff.reset()
        self._set_state("connected")

    def _send_queued(self, wire: _Wire) -> None:
        """Send on ``wire`` the calls that waited for a connection."""
        for msg in self._calls.send_queued(wire, wire.loop.time()):
            wire.send_call(msg)

    def _set_state(self, state: str) -> None:
        if state != self.state:
            self.state = state
            # the node it is (or was last) connected to; never connected: the URLs it tried
            url = self._wire.url if self._wire else self._last_url or ",".join(self.urls)
            log.info("client_%s url=%s", state, url)
            if self._on_state is not None:
                try:
                    self._on_state(state)
                except Exception:  # an application callback must not break the client
                    log.exception("on_state_failed state=%s", state)

    async def close(self) -> None:
        """Close the connection(s); pending calls fail with CONNECTION_LOST (the node is
        told to CANCEL them, so their providers' handlers stop). Idempotent.

        Handlers still running are cancelled; the node was told they started (ACCEPT
        leaves before a handler does), so their callers get PROVIDER_GONE and the calls
        are not run again elsewhere. REQUESTs that arrive from now on are refused unrun.
        Plain-function handlers running in threads are not waited for."""
        if self._closed:
            return
        self._closed = True
        if self._reconnecting is not None:
            self._reconnecting.cancel()
        if self._renewal is not None:
            self._renewal.cancel()
        if self._renewing is not None:
            self._renewing.cancel()
        for sent_on, cancel in self._calls.cancels():  # nobody waits for these answers now
            if sent_on.state is OPEN:
                sent_on.send(cancel)
        wires = self._calls.wires() | ({self._wire} if self._wire else set())
        for wire in wires:
            wire.flush()
            await wire.close()
        self._fail_all(errors.ConnectionLostError(None, "the client was closed"))
        self._events.close()
        self._runner.close()
        self._set_state("closed")

    async def drain(self, timeout: float | None = None) -> None:
        """Stop taking calls, let the handlers running finish, then close.

        The names this client provides are withdrawn first (the node sends new calls to
        other providers; a REQUEST already on its way is refused unrun, REJECT, and goes
        elsewhere too), then the handlers running finish. Those still running after
        ``timeout`` seconds are cancelled as by ``close()`` (their callers get
        PROVIDER_GONE). Cancelling ``drain`` leaves the client open, its names withdrawn.
        """
        if self._closed:
            return
        names = list(self._handlers)
        self._handlers.clear()  # from now on every REQUEST is refused unrun
        if names and self._wire is not None:
            try:
                await self._control(UNPROVIDE, names)
            except errors.RpcError:
                pass  # the connection is gone: nothing is routed here any more
        running = [task for wire in self._wires for task in wire.serving.running.values()
                   if not task.done()]
        if running:
            await asyncio.wait(running, timeout=timeout)
        await self.close()

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    # -- calling -------------------------------------------------------------------------

    async def call(self, name: str, data: Any = None, *, timeout: float | None = None,
                   idempotent: bool = False, traceparent: str | None = None) -> Any:
        """Call ``name`` with ``data``; returns the provider's answer or raises RpcError.

        ``timeout`` (seconds) bounds the whole call; default: the node's
        response timeout. One over the node's longest (``rpc.max_timeout``, 300 s by
        default) raises ValueError, as does one not positive. Cancelling the call
        (``task.cancel()``, ``asyncio.timeout``, ``wait_for``) tells the node, which
        cancels the provider's handler if it runs.
        ``idempotent=True`` lets the client send the call again on a new connection if
        the one it went out on is lost.
        ``traceparent`` (W3C trace context, e.g. from OpenTelemetry) reaches the
        provider's handler as ``CallContext.traceparent``, through any nodes.
        """
        self._check_call(timeout)
        loop = asyncio.get_running_loop()
        cid = next(self._ids)
        fut = loop.create_future()
        timeout_ms = None if timeout is None else (int(timeout * 1000) or 1)
        until = loop.time() + (timeout or self._default_timeout)
        wire = self._wire
        msg = self._calls.make(cid, name, data, timeout_ms,
                               None if traceparent is None else {"traceparent": traceparent},
                               until, idempotent, wire, REQUEST, fut)
        if wire is not None and msg is not None:
            wire.send_call(msg)
        try:
            return await fut  # every outcome set on ``fut`` took the call off the table
        except asyncio.CancelledError:
            # The caller gave up (task.cancel, asyncio.timeout, wait_for): tell the node,
            # which cancels the provider's handler, on this node or another.
            # (Cancelling this task cancelled ``fut``; one with an outcome set has ended.)
            sent_on = self._calls.give_up(cid, answered=fut.done() and not fut.cancelled())
            if sent_on is not None and sent_on.state is OPEN:
                sent_on.send([CANCEL, cid])
            raise

    async def call_all(self, name: str, data: Any = None, *, timeout: float | None = None,
                       max_replies: int | None = None,
                       traceparent: str | None = None) -> list[Reply]:
        """Call ``name`` on every provider of it across the cluster: one ``Reply`` per
        provider (``.provider``, ``.node``, ``.value`` or ``.error``), in the order they
        came. Returns when every provider answered, ``max_replies`` did, or ``timeout``
        passed (a provider still working then gets its ``ResponseTimeoutError``); each
        provider runs it at most once. No provider: an empty list. Raises as ``call``
        does when the call_all itself fails (``ConnectionLostError``, ...); cancelling
        it cancels every provider's handler still running."""
        self._check_call(timeout)
        if max_replies is not None and (type(max_replies) is not int or max_replies < 1):
            raise ValueError("max_replies must be a positive integer")
        loop = asyncio.get_running_loop()
        cid = next(self._ids)
        fut = loop.create_future()
        replies: list[Reply] = []
        meta: dict[str, Any] = {}
        if max_replies is not None:
            meta["max_replies"] = max_replies
        if traceparent is not None:
            meta["traceparent"] = traceparent
        wire = self._wire
        msg = self._calls.make(cid, name, data, None if timeout is None else
                               (int(timeout * 1000) or 1), meta or None,
                               loop.time() + (timeout or self._default_timeout), False, wire,
                               ALL, fut, replies)
        if wire is not None and msg is not None:
            wire.send_call(msg)
        try:
            await fut
            return replies
        except asyncio.CancelledError:
            sent_on = self._calls.give_up(cid, answered=fut.done() and not fut.cancelled())
            if sent_on is not None and sent_on.state is OPEN:
                sent_on.send([CANCEL, cid])
            raise

    def _check_call(self, timeout: float | None) -> None:
        if self._closed:
            raise errors.ConnectionLostError(None, "the client is closed")
        if timeout is not None and (timeout <= 0 or 0 < self._max_timeout < timeout):
            raise ValueError("timeout must be positive" if timeout <= 0 else
                             f"timeout={timeout:g} s is over the node's longest, "
                             f"{self._max_timeout:g} s (rpc.max_timeout): shorten it, or "
                             "raise rpc.max_timeout on the nodes")

    def stream(self, name: str, data: Any = None, *, timeout: float | None = None,
               window: int = DEFAULT_WINDOW, traceparent: str | None = None) -> Stream:
        """Call ``name`` as a stream: ``async for part in client.stream(name, data)``
        (clients/streams.py ``Stream``). The provider's handler is an async generator or a
        generator; a plain handler's answer comes as one part. ``timeout`` (seconds)
        bounds the whole stream, as a call's does; ``window`` (1-1024) is how many parts
        the provider may send ahead of the reading. Nothing is sent until the first
        part is asked for."""
        if type(window) is not int or not 0 < window <= MAX_WINDOW:
            raise ValueError(f"window must be an integer of 1-{MAX_WINDOW}")
        self._check_call(timeout)
        return Stream(self, name, data, timeout, window, traceparent)

    def _open_stream(self, name: str, data: Any, timeout: float | None, window: int,
                     traceparent: str | None) -> Flow:
        """Send a STREAM (or queue it for the next connection): its ``Flow``."""
        self._check_call(timeout)
        loop = asyncio.get_running_loop()
        cid = next(self._ids)
        flow = Flow(cid, window, loop.create_future())
        meta: dict[str, Any] = {"window": window}
        if traceparent is not None:
            meta["traceparent"] = traceparent
        wire = self._wire
        msg = self._calls.make(cid, name, data, None if timeout is None else
                               (int(timeout * 1000) or 1), meta,
                               loop.time() + (timeout or self._default_timeout), False, wire,
                               STREAM, flow.ended, flow)
        if wire is not None and msg is not None:
            wire.send_call(msg)
        return flow

    def _credit(self, cid: int, read: int) -> None:
        """The application has read ``read`` parts of stream ``cid``: tell its node."""
        wire = self._calls.wire_of(cid)
        if wire is not None and wire.state is OPEN:
            wire.send([CREDIT, cid, read])

    def _abandon_stream(self, flow: Flow) -> None:
        """The application stopped reading an unfinished stream: CANCEL to its node."""
        wire = self._calls.give_up(flow.cid, answered=flow.ended.done())
        if wire is not None and wire.state is OPEN:
            wire.send([CANCEL, flow.cid])

    def _forget_stream(self, flow: Flow) -> None:
        """A stream ended (or was given up): it leaves every table."""
        self._calls.forget(flow.cid)
        if flow.ended.done() and not flow.ended.cancelled():
            flow.ended.exception()  # looked at: an error after a break is no warning
        else:
            flow.ended.cancel()

    # -- providing -----------------------------------------------------------------------

    async def provide(self, name: str, handler: Handler) -> None:
        """Serve ``name`` with ``handler`` until ``unprovide`` or close (across reconnects)."""
        if not valid_name(name):
            raise ValueError(f"invalid rpc name {name!r}")
        self._handlers[name] = describe(handler)
        try:
            await self._control(PROVIDE, [name])
        except BaseException:
            self._handlers.pop(name, None)
            raise

    async def unprovide(self, name: str) -> None:
        """Stop serving ``name``; calls already running finish."""
        self._handlers.pop(name, None)
        await self._control(UNPROVIDE, [name])

    # -- events (docs/events.md) ---------------------------------------------------------

    async def subscribe(self, topic: str, handler: EventHandler, *,
                        on_gap: GapHandler | None = None) -> None:
        """Hand every event emitted to ``topic`` from now on, by any client on any node,
        to ``handler(data)`` (across reconnects, until ``unsubscribe``); returns once
        the cluster hears the topic for this client. ``on_gap(topic, count)`` is told of
        events lost: ``count`` the node dropped while this client read too slowly, or
        None (its node lost the cluster bus, or this client its connection). See
        rpcbus.events for how handlers run. Raises PermissionDeniedError,
        LimitExceededError, ValueError for a bad topic."""
        if not valid_name(topic):
            raise ValueError(f"invalid topic {topic!r}")
        if self._events.add(topic, handler, on_gap):
            try:
                await self._control(SUBSCRIBE, [topic])
            except BaseException:
                self._events.remove(topic)
                raise

    async def unsubscribe(self, topic: str, handler: EventHandler | None = None) -> None:
        """Stop handing ``topic``'s events to ``handler`` (to any handler: None); the node
        stops sending them once no handler is left."""
        if self._events.remove(topic, handler) and self._wire is not None:
            await self._control(UNSUBSCRIBE, [topic])

    async def emit(self, topic: str, data: Any = None) -> None:
        """Send an event to every subscriber of ``topic`` on any node: at most once, in
        order with this client's other events of ``topic``, no answer. Waits for a
        connection (up to ``open_timeout``: ConnectionLostError). An emit the user may
        not make is refused by the node (logged: ``node_error``); data over the node's
        frame limit is dropped here (logged: ``event_too_large``)."""
        if not valid_name(topic):
            raise ValueError(f"invalid topic {topic!r}")
        wire = self._wire
        if wire is None:
            if self._closed:
                raise errors.ConnectionLostError(None, "the client is closed")
            async with asyncio.timeout(self._open_timeout):
                await self._connected.wait()
            wire = self._wire
            if wire is None:
                raise errors.ConnectionLostError(None, "the connection was lost")
        wire.send([EMIT, topic, data])

    async def presence(self, users: Sequence[str] | None = None) -> Any:
        """Who is logged in across the cluster: every user online that this client's user
        may see (a sorted list), or for each of ``users`` whether it is (a dict). Raises
        PermissionDeniedError for a user it may not see."""
        return await self._control(PRESENCE_GET, None,
                                   [None if users is None else list(users)])

    async def watch_presence(self, handler: PresenceHandler,
                             users: Sequence[str] | None = None) -> None:
        """``handler(user, online)`` whenever one of ``users`` (None: any user this client's
        user may see) comes online anywhere in the cluster, or leaves it everywhere; across
        reconnects (a change while disconnected is not told: ask ``presence()``)."""
        wanted = None if users is None else list(users)
        entry = self._watchers.add(handler, wanted)
        try:
            await self._control(PRESENCE_SUBSCRIBE, None, [wanted])
        except BaseException:
            self._watchers.drop(entry)
            raise

    async def unwatch_presence(self, users: Sequence[str] | None = None) -> None:
        """Stop every handler (None), or watching ``users`` (a handler of everyone goes on)."""
        gone = None if users is None else list(users)
        named = [u for _, of in self._watchers.handlers if of is not None for u in of]
        self._watchers.remove(gone)
        if self._wire is not None:
            await self._control(PRESENCE_UNSUBSCRIBE, None, [gone])
            if gone is None and named:  # nil stops the watching of everyone only
                await self._control(PRESENCE_UNSUBSCRIBE, None, [sorted(set(named))])

    @property
    def events_lost(self) -> int:
        """Events the nodes said they dropped for this client (it read too slowly)."""
        return self._events.lost

    @property
    def events_repeated(self) -> int:
        """Events dropped here as had already (this client moved to another node, and it
        gave again what the first one had: clients/events.py ``Seen``)."""
        return self._events.repeats

    async def ping(self) -> None:
        """A protocol-level round trip to the node."""
        await self._control(PING, None)

    async def rpcs(self) -> list[RpcInfo]:
        """What the cluster provides that this client's user may call, by name: ``[{"rpc",
        "providers", "nodes": {node: count}}]`` (docs/protocol.md, "Discovery")."""
        found: list[RpcInfo] = await self._control(DISCOVER, None, [None])
        return found

    async def providers(self, name: str) -> list[ProviderInfo]:
        """The providers of ``name`` across the cluster: ``[{"provider", "node", "weight",
        "calls_per_s", "ms", "outstanding", "calls", "errors", "p50_ms", "p99_ms"}]``, the
        last four over about the last minute (None: not measured); a node that provides
        it too little to say more gives ``{"provider": None, "node", "count"}``. Raises
        PermissionDeniedError for a name the user may not call."""
        found: list[ProviderInfo] = await self._control(DISCOVER, None, [name])
        return found

    async def _control(self, kind: int, names: list[str] | None,
                       fields: list[Any] | None = None) -> Any:
        if self._closed:
            raise errors.ConnectionLostError(None, "the client is closed")
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(self._open_timeout):
            await self._connected.wait()
        wire = self._wire
        if wire is None:  # lost again since it connected
            raise errors.ConnectionLostError(None, "the connection was lost")
        ref = next(self._ids)
        fut = loop.create_future()
        self._calls.control(ref, kind, wire, loop.time() + self._open_timeout, fut)
        wire.send([kind, ref, *fields] if fields is not None else
                  [kind, ref] if names is None else [kind, ref, names])
        try:
            return await fut  # every outcome set on ``fut`` took it off the table
        finally:
            self._calls.forget(ref)  # cancelled: nobody waits for its answer

    # -- frames in -----------------------------------------------------------------------

    def _on_frame(self, wire: _Wire, data: FrameData) -> None:
        self._frame_read = None  # (when, how late) it was read: at its first REQUEST
        msgs, bad = decode_each(data)
        if bad:  # only those are lost; the rest of the frame is taken as usual
            self.messages_dropped += bad
            log.warning("bad_messages_from_node url=%s dropped=%d kept=%d", wire.url, bad,
                        len(msgs))
        for msg in msgs:
            try:
                self._on_message(wire, msg)
            except Exception:  # a malformed message from the node must not kill the client
                log.exception("bad_message_from_node url=%s kind=%s", wire.url, msg[0])
        if wire.serving.starting:
            # The calls' ACCEPTs go to the socket first: no handler code has run yet, so
            # however long one holds this loop, the node knows every call here started.
            runner = self._runner
            runner.frame_jobs = 0
            starting = wire.serving.take_starting()
            wire.flush()
            for attempt, name, entry, request in starting:
                runner.start(wire, attempt, name, entry, request)

    def _on_message(self, wire: _Wire, msg: list[Any]) -> None:
        kind = msg[0]
        if kind == RESPONSE or kind == OK or kind == FOUND:
            self._settle(msg[1], msg[2] if kind != OK else None, None)
        elif kind == REPLY:
            call = self._calls.get(msg[1])
            if call is not None and call.kind == ALL:
                call.parts.append(reply_of(msg))
        elif kind == PART:
            call = self._calls.get(msg[1])
            if call is not None and call.kind == STREAM and not call.parts.arrived(msg[2]):
                self._settle(msg[1], None, errors.error_from_code(
                    errors.INVALID_MESSAGE, "the node sent more parts than the window"))
                self._abandon_stream(call.parts)
        elif kind == CREDIT:
            waiter = wire.serving.credit(msg[1], msg[2])
            if waiter is not None and not waiter.done():
                waiter.set_result(None)
        elif kind == REQUEST or kind == STREAM:  # taken (started at frame's end) or refused
            # read once per frame: no handler runs before the frame's end (its REQUESTs
            # start then), so each of its REQUESTs was read when the first was
            read = self._frame_read
            if read is None:
                now = wire.loop.time()
                read = self._frame_read = (now, self._held.late_by(now))
            if not wire.serving.request(msg, read[0],
                                        not self._closed and wire.state is OPEN,
                                        read[1], self._full):
                # a REQUEST read after its ack window: refused unrun, and the node sends
                # it elsewhere or later (part of overload, not an error: info)
                self.stale_requests += 1
                if self.stale_requests & (self.stale_requests - 1) == 0:  # 1, 2, 4, 8, ...
                    log.info("stale_requests_refused url=%s total=%d", wire.url,
                             self.stale_requests)
        elif kind == EVENT:  # after the kinds every call carries
            if len(msg) == 5 and type(msg[3]) is int and type(msg[4]) is int:
                self._events.deliver(msg[1], msg[2], msg[3], msg[4])
            else:
                self._events.deliver(msg[1], msg[2])
        elif kind == GAP:
            self._events.gap(msg[1], msg[2])
        elif kind == PRESENCE:
            self._watchers.changed(msg[1], msg[2])
        elif kind == ERROR:
            ref, code, message = msg[1], msg[2], msg[3]
            if ref is None and code == errors.CLUSTER_UNAVAILABLE:
                self._node_cut_off(wire)  # a notice: the node cannot reach the cluster
                return
            if ref is None and code == errors.NOT_AUTHENTICATED:  # its token expired
                wire.expired = True
                if self._creds.renews:
                    self._renew_later(0.0)
                    return
            if code == errors.SHUTTING_DOWN:
                self._node_draining(wire)
                if ref is None:
                    return
                if (self._reconnect and not self._closed
                        and self._calls.refused_unrun(ref, wire)):
                    if self._wire is not None:  # it never ran: send it elsewhere
                        self._send_queued(self._wire)
                    return
            if ref is None or self._calls.get(ref) is None:
                log.warning("node_error url=%s code=%s error=%s ref=%s", wire.url, code,
                            message, ref)
            else:
                self._settle(ref, None, self._calls.error(
                    ref, code, message, msg[4] if len(msg) > 4 else None))
        elif kind == CANCEL:
            task = wire.serving.cancel(msg[1])
            if task is not None:
                task.cancel()
        elif kind == PING:
            wire.send([PONG, msg[1] if len(msg) > 1 else None])
        elif kind == PONG:
            if len(msg) > 1 and type(msg[1]) is int:
                self._settle(msg[1], None, None)
        elif kind == AUTH_OK or kind == AUTH_FAIL:
            if not wire.auth.done():
                if kind == AUTH_OK:
                    wire.auth.set_result(msg[1])
                else:
                    wire.auth.set_exception(errors.error_from_code(msg[1], msg[2]))

    def _settle(self, ref: int, result: Any, exc: BaseException | None) -> None:
        """Call (or control) ``ref`` ended with ``result`` or ``exc``: it leaves the
        table now, and its waiter gets the outcome. An answer to one ended here already
        (given up, timed out) is dropped."""
        call = self._calls.forget(ref)
        if call is None:
            return
        fut = call.waiter
        if not fut.done():
            if exc is None:
                fut.set_result(result)
            else:
                fut.set_exception(exc)

    def _unencodable(self, msg: list[Any], exc: Exception) -> list[Any] | None:
        kind = msg[0]
        if kind == RESPONSE:
            return [ERROR, msg[1], errors.PROVIDER_ERROR, f"result is not serializable: {exc}"]
        if kind == ERROR and len(msg) > 4:  # an AppError whose data msgpack cannot carry
            return [ERROR, msg[1], errors.PROVIDER_ERROR,
                    f"AppError {msg[4][0]}: its data is not serializable: {exc}"]
        if kind == PART:  # the stream ends here (its generator is stopped: _Wire)
            return [ERROR, msg[1], errors.PROVIDER_ERROR, f"a part is not serializable: {exc}"]
        if kind == REQUEST or kind == STREAM or kind == ALL:  # it was not sent
            self._settle(msg[1], None, TypeError(f"call data is not serializable: {exc}"))
        return None

    def _oversized(self, msg: list[Any], size: int, limit: int) -> list[Any] | None:
        """A message over the node's frame limit: a call fails here (nothing was sent), an
        answer becomes PAYLOAD_TOO_LARGE for its caller (the call ran: never re-run)."""
        kind = msg[0]
        if kind == REQUEST or kind == STREAM or kind == ALL:
            self._settle(msg[1], None, errors.PayloadTooLargeError(
                None, f"the call's data makes a {size}-byte message, over the node's "
                      f"limit of {limit} bytes (max_frame); nothing was sent"))
            return None
        if kind == EMIT:  # at most once: dropped, and said
            log.warning("event_too_large topic=%s size=%d limit=%d", msg[1], size, limit)
            return None
        if kind == RESPONSE or kind == PART:
            log.warning("answer_too_large call_id=%s size=%d limit=%d", msg[1], size, limit)
            return [ERROR, msg[1], errors.PAYLOAD_TOO_LARGE,
                    f"the answer makes a {size}-byte message, over the node's limit of "
                    f"{limit} bytes (max_frame)"]
        return msg

    # -- failure -------------------------------------------------------------------------

    async def _sweep_forever(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(SWEEP)
            self._held.tick(loop.time())
            for call, exc in self._calls.expire(loop.time()):
                if not call.waiter.done():
                    call.waiter.set_exception(exc)

    def _node_draining(self, wire: _Wire) -> None:
        """The node shuts down: new calls wait for a connection to another node."""
        if wire.draining:
            return
        wire.draining = True
        log.info("node_draining url=%s", wire.url)
        if wire is self._wire and not self._closed:
            self._wire = None
            self._connected.clear()
            self._start_reconnect(avoid=wire.url, at_once=True)

    def _node_cut_off(self, wire: _Wire) -> None:
        """The node cannot reach the cluster: move to another URL if one answers (calls and
        handlers under way on this connection finish there), else stay."""
        if (wire is not self._wire or self._closed or not self._reconnect
                or len(self.urls) < 2 or self._moving is not None):
            return
        log.info("node_cut_off url=%s", wire.url)
        self._moving = wire.loop.create_task(self._move_from(wire), name="rpcbus-client-move")

    async def _move_from(self, wire: _Wire) -> None:
        try:
            new = await self._connect_any(avoid=wire.url, skip=True)
        finally:
            self._moving = None
        if new is None:
            log.info("node_cut_off_staying url=%s error=%s", wire.url, self._last_error)
            return
        if self._closed or self._wire is not wire:  # closed, or it moved meanwhile
            new.owner = None  # type: ignore[assignment]  # its loss is not ours
            new.transport.abort()
            return
        wire.draining = True
        self._use(new)  # provides here what it provided, sends what waited
        if self._handlers and wire.state is OPEN:  # nothing new for it there
            wire.send([UNPROVIDE, next(self._ids), list(self._handlers)])
        retiring = wire.loop.create_task(self._close_when_idle(wire))
        self._retiring.add(retiring)
        retiring.add_done_callback(self._retiring.discard)

    async def _close_when_idle(self, wire: _Wire) -> None:
        """Close a connection new calls no longer use once its calls and handlers ended
        (each ends by its deadline)."""
        while not self._closed:
            under_way = [call.waiter for call in self._calls.on(wire)]
            under_way += list(wire.serving.running.values())
            if not under_way:
                break
            await asyncio.wait(under_way)
        await wire.close()

    def _on_lost(self, wire: _Wire, exc: BaseException | None) -> None:
        lost = errors.ConnectionLostError(
            None, f"connection to {wire.url} lost" + (f": {exc}" if exc else ""))
        self._wires.discard(wire)
        for task in wire.serving.lost():
            task.cancel()                       # its answer has nowhere to go
        # idempotent calls wait for the next wire; the others may have run: they fail
        for call in self._calls.lost(wire, resend=self._reconnect and not self._closed):
            if not call.waiter.done():
                call.waiter.set_exception(lost)
        if wire is not self._wire:
            return                              # a draining wire: the client already moved
        self._wire = None
        self._connected.clear()
        if self._closed:
            return
        if self._events.handlers:  # what is emitted until the next connection is lost
            self._events.gap(None, None)
        if not self._reconnect:
            self._closed = True
            self._fail_all(lost)
            self._set_state("closed")
            return
        self._start_reconnect(avoid=wire.url, at_once=False)

    # -- token renewal (clients/credentials.py) -----------------------------------------

    def _renew_later(self, delay: float | None = None, least: float = 0.0) -> None:
        """Renew the token after ``delay`` seconds (None: when the current one says, but
        not before ``least``: a token function that hands out a token near its expiry
        again is asked again only every ``RETRY`` seconds)."""
        if not self._creds.renews or self._closed:
            return
        if delay is None:
            delay = renew_in(self._creds.token or "", time.time())
            if delay is None:
                return
            delay = max(delay, least)
        if self._renewal is not None:
            self._renewal.cancel()
        self._renewal = asyncio.get_running_loop().call_later(delay, self._renew_now)

    def _renew_now(self) -> None:
        self._renewal = None
        if not self._closed and (self._renewing is None or self._renewing.done()):
            self._renewing = asyncio.get_running_loop().create_task(
                self._renew(), name="rpcbus-client-renew-token")

    async def _renew(self) -> None:
        """A new token from the token function, sent as AUTH on every open connection (the
        node keeps the session and gives it the new token's rights); names withdrawn when
        the old one expired are provided again. A failure is logged and tried again
        after ``RETRY`` seconds."""
        loop = asyncio.get_running_loop()
        try:
            token = await self._creds.fetch()
            for wire in [w for w in self._wires if w.state is OPEN]:
                wire.auth = loop.create_future()
                wire.send([AUTH, {"token": token}])
                async with asyncio.timeout(self._open_timeout):
                    await wire.auth
                if wire.expired:
                    wire.expired = False
                    if self._handlers:
                        wire.send([PROVIDE, next(self._ids), list(self._handlers)])
        except Exception as exc:  # the token function, a refusal, no answer in time
            log.warning("token_renewal_failed url=%s error=%r (again in %.0f s)",
                        self.url, exc, RETRY)
            self._renew_later(RETRY)
            return
        self._renew_later(least=RETRY)

    def _start_reconnect(self, avoid: str, at_once: bool) -> None:
        self._set_state("reconnecting")
        if self._reconnecting is None or self._reconnecting.done():
            self._reconnecting = asyncio.get_running_loop().create_task(
                self._reconnect_forever(avoid, at_once), name="rpcbus-client-reconnect")

    async def _reconnect_forever(self, avoid: str, at_once: bool) -> None:
        """Until connected or closed: wait (backoff with jitter), try every URL once."""
        first = True
        while not self._closed:
            if not (first and at_once):
                await asyncio.sleep(self._backoff.next())
            first = False
            wire = await self._connect_any(avoid)
            if wire is not None and not self._closed:
                self._use(wire)
                return
            log.info("client_reconnect_failed error=%s", self._last_error)

    def _fail_all(self, exc: errors.RpcError) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for call in self._calls.clear():
            if not call.waiter.done():
                call.waiter.set_exception(exc)
        for wire in self._wires:
            for task in wire.serving.lost():
                task.cancel()


class _Connector:
    """What ``connect`` returns: await it for a Client, or use it with ``async with``."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def __await__(self) -> Any:
        return self._client._open().__await__()

    async def __aenter__(self) -> Client:
        return await self._client._open()

    async def __aexit__(self, *exc: Any) -> None:
        await self._client.close()


def connect(urls: str | Sequence[str], **options: Unpack[Options]) -> _Connector:
    """Connect to the first reachable node of ``urls`` (``ws://host:port``, one or a list).

    ``async with rpcbus.connect(url) as c: ...`` or ``c = await rpcbus.connect(url)``.
    ``Options`` lists the options (``name``, ``reconnect``, ``on_state``, ...); an
    unknown one raises TypeError. Raises ConnectFailedError when no node can be
    reached (with each URL's reason), and a node's AUTH_FAIL as an RpcError.
    """
    return _Connector(Client(urls, **options))
