"""One client connection to the node: the socket side of a session (the shell).

A ``Session`` is the server end of that client's WebSocket connection
(``rpcbus.websocket.ServerConnection``: the node's listening socket makes one per
TCP connection); its plain HTTP requests go to the node (``Node.http``), and
``FrameIO`` hands it data frames as they arrive. Each frame is decoded once and
its messages handed to the session's rules (broker/session_rules.py ``SessionRules``: AUTH, checks,
limits, the router); nothing here creates a Task.

What lives here is about the socket: connection counts per address and the
refusal of a handshake (broker/gate.py), byte budgets before login, WebSocket
ping and pong budgets, the login timer (``limits.auth_timeout`` from the TCP
connect: the connection closes, 1008), and backpressure: a session with
``limits.max_inflight_per_connection`` calls pending stops being read until
half of them have finished; a subscriber whose unsent output passes
``limits.max_event_buffer_bytes`` loses its events (counted, and told in a
GAP per topic once the transport has written the backlog: ``resume_writing``).
"""

from __future__ import annotations

from time import perf_counter
from typing import TYPE_CHECKING, Any

import structlog

from rpcbus import errors
from rpcbus.broker.session_policy import CUT_OFF_NOTICE
from rpcbus.broker.session_rules import SessionRules
from rpcbus.handshake import HttpRequest
from rpcbus.protocol import ERROR, PART, PONG, REQUEST, RESPONSE, STREAM, ProtocolError, decode
from rpcbus.transport import CONNECTING, OPEN, CloseCode, FrameData
from rpcbus.websocket import HttpAnswer, ServerConnection

if TYPE_CHECKING:
    from rpcbus.broker.auth import User
    from rpcbus.broker.node import Node
    from rpcbus.broker.session_policy import Login

log = structlog.get_logger(module="rpcbus.session")


__all__ = ["CUT_OFF_NOTICE", "Session"]


class Session(ServerConnection):
    """A client of this node: the connection, holding its rules (``core``, a
    ``SessionRules``: the router's ``Peer`` for this client)."""

    def __init__(self, node: "Node") -> None:
        limits = node.config.limits
        self.max_head = limits.max_handshake_bytes
        super().__init__()  # the connection's (ServerConnection's) init
        self.node = node
        # its id and the client's address are the rules' (``core.sid``, ``core.address``)
        self.core = SessionRules(node, node.new_session_id(), self)
        self.max_size = limits.max_frame_bytes
        self.close_timeout = node.config.server.close_timeout
        self.max_out_frame = limits.max_frame_bytes
        self.max_write_buffer = limits.max_write_buffer_bytes
        self._max_inflight = limits.max_inflight_per_connection
        self._max_frame_messages = limits.max_messages_per_frame
        self._reading_paused = False
        self._auth_timer: Any = None
        self._counted = False            # in the gate's connection counts
        self._handshake_bytes = 0        # received while the handshake is in progress
        self._bytes_before_auth = 0      # received after it, before AUTH_OK
        self._control_frames = 0         # pings and pongs in this window
        self._held: list[bytes] | None = None  # held by the gate: bytes come unread
        self._control_window_end = 0.0

    # -- the connection's hooks --------------------------------------------------------

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        peer = transport.get_extra_info("peername")
        self.core.address = peer[0] if peer else ""
        self.node.connections.add(self)
        self._counted = True
        refusal = self.node.gate.opened(self.core.address)
        if refusal is not None:
            status, text = refusal
            self._refuse_handshake(status, text)
            return
        self._auth_timer = self.loop.call_later(self.node.config.limits.auth_timeout,
                                                self._auth_timeout)
        hold = self.node.gate.hold_for(self.core.address)
        if hold:  # its address failed or flooded lately: read it later (Gate.hold_for)
            self.node.stats["connections_held"] += 1
            self._held = []
            self.loop.call_later(hold, self._read_held)
        # past this much unsent, the transport pauses us: a subscriber's events are lost
        # (counted, told in a GAP) until it has read what is buffered
        transport.set_write_buffer_limits(high=self.node.config.limits.max_event_buffer_bytes)

    def _read_held(self) -> None:
        """A held connection's wait is over: what it sent meanwhile is read."""
        held, self._held = self._held, None
        if held is None or self.transport.is_closing():
            return
        self.transport.resume_reading()
        if held:
            self.data_received(b"".join(held))

    def pause_writing(self) -> None:
        self.core.events_held = True

    def resume_writing(self) -> None:
        if self.core.events_held:
            lost = self.core.events_caught_up()
            if lost:
                self.node.events.stats["lost"] += lost
                self.node.warnings.warn("events_lost_slow_subscriber", session=self.core.sid,
                                        address=self.core.address, lost=lost)

    def _refuse_handshake(self, status: int, text: str) -> None:
        """Answer with HTTP ``status`` and close, whatever of the request has arrived."""
        self.node.warnings.warn("connection_refused", address=self.core.address, status=status,
                                 reason=text)
        self.answer_and_close(status, text.encode() + b"\n")

    def http_request(self, request: HttpRequest) -> HttpAnswer | None:
        if request.path.partition("?")[0] == self.node.config.deepstream.path:
            return self.node.deepstream(self, request)  # this becomes a DeepstreamSession
        return self.node.http(request)

    def upgraded(self) -> None:
        self.node.session_opened(self)
        server = self.node.config.server
        self.start_keepalive(server.ping_interval or None, server.ping_timeout or None)

    def data_received(self, data: bytes) -> None:
        if not self.core.authenticated:
            if self._held is not None:  # waiting (``_read_held``): kept, unread; reading
                self._held.append(data)  # stops (pausing in connection_made does not
                self.transport.pause_reading()  # hold with every event loop)
                return
            if not self._within_budget(len(data)):
                return
        super().data_received(data)

    def _within_budget(self, n: int) -> bool:
        """Bytes from a connection not logged in: the handshake within
        ``limits.max_handshake_bytes``, then within ``limits.max_bytes_before_auth``."""
        if self._failed or self.transport.is_closing():
            return False
        limits = self.node.config.limits
        if self.state is CONNECTING:
            self._handshake_bytes += n
            if self._handshake_bytes > limits.max_handshake_bytes:
                self.node.stats["handshakes_too_large"] += 1
                self._refuse_handshake(431, "the upgrade request is over "
                                       f"{limits.max_handshake_bytes} bytes")
                return False
            return True
        self._bytes_before_auth += n
        if self._bytes_before_auth > limits.max_bytes_before_auth:
            self.node.stats["closed_before_auth"] += 1
            self.node.warnings.warn("closing_before_auth", session=self.core.sid,
                                     address=self.core.address, received=self._bytes_before_auth)
            self.fail_now(CloseCode.POLICY_VIOLATION, "too much data before AUTH")
            return False
        return True

    def control_received(self) -> bool:
        """A WebSocket ping or pong: ``limits.max_control_frames`` per ``invalid_window``;
        one more closes the connection (1008), answered or not."""
        now = self.loop.time()
        if now >= self._control_window_end:
            self._control_window_end = now + self.node.config.limits.invalid_window
            self._control_frames = 0
        self._control_frames += 1
        if self._control_frames <= self.node.config.limits.max_control_frames:
            return True
        self.close_for_flood(self._control_frames, "too many ping or pong frames")
        return False

    def close_for_flood(self, frames: int, reason: str) -> None:
        """Close (1008) a connection past its budget of pings (or, on /deepstream, of
        messages in a frame before login). Before login its address counts as failing
        (``Gate.abused``): its next connections wait before they are read, so a client
        reconnecting in a loop holds connections instead of churning handshakes."""
        if self.transport.is_closing() or self._failed:
            return
        self.node.stats["closed_for_control_frames"] += 1
        self.node.warnings.warn("closing_control_flood", session=self.core.sid,
                                address=self.core.address, frames=frames)
        if not self.core.authenticated:
            self.node.gate.abused(self.core.address)
        self.fail_now(CloseCode.POLICY_VIOLATION, reason)
        # a flooding peer is not read for the grace (its bytes would only be dropped): it
        # costs this process nothing more, and a peer that stops sending still closes
        self.transport.pause_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self.node.connections.discard(self)
        self._ended()

    def fail_now(self, code: int, reason: str) -> None:
        """The connection is failed (see FrameIO.fail_now): the session ends on the next
        loop turn, as it would on the connection's loss (its calls, its address's room,
        its counts), while the socket drops what the peer still sends for a moment."""
        if not self._failed:
            self.loop.call_soon(self._ended)
        super().fail_now(code, reason)

    def _ended(self) -> None:
        """The session is over (failed, or its connection lost); once."""
        if self.core.closed:
            return
        self.core.end()
        if self._auth_timer is not None:
            self._auth_timer.cancel()
            self._auth_timer = None
        self.dropped_out += len(self._out)
        self._out = []
        gate = self.node.gate
        if self._counted:
            self._counted = False
            gate.closed(self.core.address, self.core.authenticated)
        self.node.session_closed(self)

    # -- what the rules need -----------------------------------------------------------

    def is_open(self) -> bool:
        return not self.core.closed and self.state is OPEN

    def close_for_policy(self, reason: str) -> None:
        self.fail_now(CloseCode.POLICY_VIOLATION, reason)

    def later(self, delay: float, callback: Any) -> None:
        self.loop.call_later(delay, callback)

    def check_login(self, params: dict[str, Any], done: Login) -> None:
        """The node's gate checks it (broker/gate.py: threads, off the loop); ``done``
        runs on the loop, unless this connection ended first, with how long the user's
        token stays valid by this host's wall clock (JWT ``exp`` is wall time)."""
        def checked(user: User | None, reason: str) -> None:
            done(user, reason, None if user is None else self.node.gate.seconds_left(user))
        self.node.gate.login(params, checked, self.core.address, self._still_open)

    def _still_open(self) -> bool:
        return not self.core.closed

    def logged_in(self) -> None:
        if self._auth_timer is not None:
            self._auth_timer.cancel()
            self._auth_timer = None

    def _auth_timeout(self) -> None:
        self._auth_timer = None
        if not self.core.authenticated and not self.core.closed:
            log.info("auth_timeout", session=self.core.sid)
            self.fail_now(CloseCode.POLICY_VIOLATION, "no AUTH in time")

    def flush(self) -> None:
        super().flush()
        self._resume_if_room()

    def _resume_if_room(self) -> None:
        core = self.core
        if self._reading_paused and core.inflight <= self._max_inflight // 2 and not core.closed:
            self._reading_paused = False
            self.transport.resume_reading()

    def _pause_if_full(self) -> None:
        """Backpressure: with ``limits.max_inflight_per_connection`` calls pending, stop
        reading until half of them finish (``_resume_if_room``, at a flush)."""
        core = self.core
        if core.inflight >= self._max_inflight and not self._reading_paused and not core.closed:
            self._reading_paused = True
            self.node.stats["reads_paused"] += 1
            self.transport.pause_reading()

    def unencodable(self, msg: list[Any], exc: Exception) -> list[Any] | None:
        """A message msgpack cannot pack (data nested deeper than it packs): whoever
        sent that data hears why, at once, and every call keeps its one outcome."""
        self.dropped_out += 1
        kind = msg[0]
        log.warning("unencodable_message", session=self.core.sid, kind=kind, error=str(exc),
                    call_id=msg[1] if len(msg) > 1 else None)
        if kind == RESPONSE:  # a provider's answer to this client
            return [ERROR, msg[1], errors.PROVIDER_ERROR, "the response could not be encoded"]
        if kind == ERROR and len(msg) > 4:  # an application error's data, nested too deep
            return [ERROR, msg[1], errors.PROVIDER_ERROR,
                    "the application error's data could not be encoded"]
        if kind == PART:  # a part of a stream to this client: the stream ends here, its
            self.node.router.cancel_from(self.core, msg[1])  # provider is cancelled
            return [ERROR, msg[1], errors.PROVIDER_ERROR, "a part could not be encoded"]
        if kind == REQUEST or kind == STREAM:  # for this provider: the caller is told, not run
            self.node.router.refuse_attempt(self.core, msg[1], errors.INVALID_MESSAGE,
                                            "the call's data could not be encoded (nested "
                                            "too deeply)")
        elif kind == PONG:
            return [ERROR, None, errors.INVALID_MESSAGE, "the PING payload is nested too deeply"]
        return None

    def on_slow_consumer(self) -> None:
        self.node.stats["slow_consumers"] += 1
        log.warning("slow_consumer_closed", session=self.core.sid,
                    buffered=self.transport.get_write_buffer_size())
        super().on_slow_consumer()

    # -- input -------------------------------------------------------------------------

    def text_received(self) -> None:
        self.core.invalid(None, "text frames are not supported; send binary msgpack frames",
                          self.loop.time())

    def frame_received(self, data: FrameData) -> None:
        now = self.loop.time()
        self.node.router.read_at = perf_counter()  # its calls' start, for their latency
        try:
            msgs = decode(data, self._max_frame_messages)
        except ProtocolError as exc:
            self.core.invalid(None, str(exc), now)
            return
        self.node.stats["messages_in"] += len(msgs)
        try:
            self.core.handle(msgs, now, len(data))
        except Exception:  # a bug here must cost one frame, never the node
            self.node.stats["internal_errors"] += 1
            log.exception("frame_handling_failed", session=self.core.sid)
        self._pause_if_full()
