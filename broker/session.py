"""One client connection to the node: AUTH, input checks, limits, and the router's peer.

A ``Session`` is the websockets ``ServerConnection`` for that client (the node
passes it as ``create_connection``), with ``FrameIO`` taking data frames as
they arrive. Each frame is decoded once, each message checked
(clients/protocol.py) and handed to the router; nothing here creates a Task.

Bad input never takes the node down: a malformed message gets
``ERROR INVALID_MESSAGE`` naming the problem and a strike; more than
``limits.max_invalid_messages`` strikes within ``limits.invalid_window``
seconds close the connection (code 1008). A session with
``limits.max_inflight_per_connection`` calls pending stops being read until
half of them have finished (backpressure instead of unbounded memory).

Who the client is (broker/gate.py): with auth mode ``users`` the first
message must be an AUTH with a token or a user and password; a failed AUTH is
answered AUTH_FAIL (the client learns no more than that) and after
``auth.max_failures`` of them the connection closes (1008), as it does when no
AUTH completes within ``limits.auth_timeout``. Then every REQUEST is checked
against the user's ``call`` globs (PERMISSION_DENIED) and rate limit
(RATE_LIMITED; the connection stays), every PROVIDE against ``provide``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import structlog
from websockets.asyncio.server import ServerConnection
from websockets.frames import CloseCode
from websockets.protocol import CONNECTING, OPEN

from rpcbus import errors
from rpcbus.broker.gate import BUSY
from rpcbus.protocol import (
    ACCEPT,
    ACCEPT_UPTO,
    AUTH,
    AUTH_FAIL,
    AUTH_OK,
    CANCEL,
    DRAIN_PING,
    ERROR,
    OK,
    PING,
    PONG,
    PROTOCOL_VERSION,
    PROVIDE,
    REJECT,
    REQUEST,
    RESPONSE,
    UNPROVIDE,
    ProtocolError,
    check_from_client,
    decode,
    is_id,
    valid_name,
)
from rpcbus.transport import FrameData, FrameIO

if TYPE_CHECKING:
    from rpcbus.broker.auth import Permissions, User
    from rpcbus.broker.limits import WindowLimiter
    from rpcbus.broker.node import Node

log = structlog.get_logger(module="rpcbus.session")


BUSY_HOLD = 0.25   # s an AUTH answered BUSY waits for its answer

_REASONS = {429: b"Too Many Requests", 431: b"Request Header Fields Too Large",
            503: b"Service Unavailable"}

# to every client of a node cut off from the cluster (Node._check_cut_off): connect to
# another node you know (the SDKs do, and stay when none answers)
CUT_OFF_NOTICE = [ERROR, None, errors.CLUSTER_UNAVAILABLE,
                  "this node cannot reach the cluster: connect to another node"]


class Session(FrameIO, ServerConnection):
    """A client of this node, as caller and provider (the router's ``Peer``)."""

    def __init__(self, protocol: Any, server: Any, *, node: "Node", **kwargs: Any) -> None:
        super().__init__(protocol, server, **kwargs)
        limits = node.config.limits
        self.node = node
        self.router = node.router
        self.sid = node.new_session_id()
        self.label = self.sid            # how providers see this client as a caller
        self.user_name: str | None = None  # the authenticated user (auth mode users)
        self.provider_name = self.sid    # how load history names it as a provider
        self.hrows: dict[Any, Any] = {}  # its load-history rows (history.py)
        self.origin = ""                 # its calls start on this node
        self.closed = False
        self.authenticated = False
        self.inflight = 0
        self.calls: dict[int, Any] = {}    # its calls in flight by its ids (the router's)
        self.accepted_upto = 0           # ACCEPT_UPTO: attempts up to this one it took
        self.provides: set[str] = set()
        self.is_node = False             # a client, not another node of the cluster
        self.max_out_frame = limits.max_frame_bytes
        self.max_write_buffer = limits.max_write_buffer_bytes
        self._max_inflight = limits.max_inflight_per_connection
        self._max_frame_messages = limits.max_messages_per_frame
        self._max_name = limits.max_name_length
        self._pings_refused = False      # this frame's refused PINGs were answered once
        self._reading_paused = False
        self._strikes = 0
        self._strike_window_end = 0.0
        self._auth_timer: Any = None
        self.user: User | None = None
        self._perms: Permissions | None = None      # None: everything allowed
        self._limiter: WindowLimiter | None = None  # None: no rate limit
        self._gated = False                         # either of the two is set
        self._logging_in = False
        self._auth_failures = 0
        self.address = ""                # the client's IP address
        self._counted = False            # in the gate's connection counts
        self._handshake_bytes = 0        # received while the handshake is in progress
        self._bytes_before_auth = 0      # received after it, before AUTH_OK
        self._control_frames = 0         # pings and pongs in this window
        self._control_window_end = 0.0

    # -- websockets hooks --------------------------------------------------------------

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        peer = transport.get_extra_info("peername")
        self.address = peer[0] if peer else ""
        self._counted = True
        refusal = self.node.gate.opened(self.address)
        if refusal is not None:
            status, text = refusal
            self._refuse_handshake(status, text)
            return
        self._auth_timer = self.loop.call_later(self.node.config.limits.auth_timeout,
                                                self._auth_timeout)

    def _refuse_handshake(self, status: int, text: str) -> None:
        """Answer the HTTP upgrade request with ``status`` and close, before websockets has
        read it."""
        self.node.warnings.warn("connection_refused", address=self.address, status=status,
                                 reason=text)
        body = text.encode() + b"\n"
        self.transport.write(b"HTTP/1.1 %d %s\r\nContent-Type: text/plain\r\n"
                             b"Content-Length: %d\r\nConnection: close\r\n\r\n%s"
                             % (status, _REASONS[status], len(body), body))
        self.transport.close()
        self.loop.call_later(1.0, self.transport.abort)

    def data_received(self, data: bytes) -> None:
        if not self.authenticated and not self._within_budget(len(data)):
            return
        super().data_received(data)

    def _within_budget(self, n: int) -> bool:
        """Bytes from a connection not logged in: the handshake within
        ``limits.max_handshake_bytes``, then within ``limits.max_bytes_before_auth``."""
        if self.transport.is_closing():
            return False
        limits = self.node.config.limits
        if self.protocol.state is CONNECTING:
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
            self.node.warnings.warn("closing_before_auth", session=self.sid,
                                     address=self.address, received=self._bytes_before_auth)
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
        if not self.transport.is_closing():
            self.node.stats["closed_for_control_frames"] += 1
            self.node.warnings.warn("closing_control_flood", session=self.sid,
                                     address=self.address, frames=self._control_frames)
            self.fail_now(CloseCode.POLICY_VIOLATION, "too many ping or pong frames")
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self.closed = True
        if self._auth_timer is not None:
            self._auth_timer.cancel()
            self._auth_timer = None
        self.dropped_out += len(self._out)
        self._out = []
        gate = self.node.gate
        if self._counted:
            self._counted = False
            gate.closed(self.address, self.authenticated)
        if self.user is not None:
            gate.connections[self.user.name] -= 1
            gate.provided[self.user.name] -= len(self.provides)
        self.node.session_closed(self)

    def _auth_timeout(self) -> None:
        self._auth_timer = None
        if not self.authenticated and not self.closed:
            log.info("auth_timeout", session=self.sid)
            self.fail_now(CloseCode.POLICY_VIOLATION, "no AUTH in time")

    def flush(self) -> None:
        super().flush()
        if self._reading_paused and self.inflight <= self._max_inflight // 2 and not self.closed:
            self._reading_paused = False
            self.transport.resume_reading()

    def unencodable(self, msg: list[Any], exc: Exception) -> list[Any] | None:
        """A message msgpack cannot pack (data nested deeper than it packs): whoever
        sent that data hears why, at once, and every call keeps its one outcome."""
        self.dropped_out += 1
        kind = msg[0]
        log.warning("unencodable_message", session=self.sid, kind=kind, error=str(exc),
                    call_id=msg[1] if len(msg) > 1 else None)
        if kind == RESPONSE:  # a provider's answer to this client
            return [ERROR, msg[1], errors.PROVIDER_ERROR, "the response could not be encoded"]
        if kind == REQUEST:  # a call for this provider: the caller is told, nothing ran
            self.router.refuse_attempt(self, msg[1], errors.INVALID_MESSAGE,
                                       "the call's data could not be encoded (nested too "
                                       "deeply)")
        elif kind == PONG:
            return [ERROR, None, errors.INVALID_MESSAGE, "the PING payload is nested too deeply"]
        return None

    def on_slow_consumer(self) -> None:
        self.node.stats["slow_consumers"] += 1
        log.warning("slow_consumer_closed", session=self.sid,
                    buffered=self.transport.get_write_buffer_size())
        super().on_slow_consumer()

    # -- input -------------------------------------------------------------------------

    def text_received(self) -> None:
        self.invalid(None, "text frames are not supported; send binary msgpack frames")

    def frame_received(self, data: FrameData) -> None:
        try:
            msgs = decode(data, self._max_frame_messages)
        except ProtocolError as exc:
            self.invalid(None, str(exc))
            return
        self.node.stats["messages_in"] += len(msgs)
        self._pings_refused = False
        if self._limiter is not None:
            self._limiter.received(self.loop.time(), len(data))
        try:
            self._handle(msgs)
        except Exception:  # a bug here must cost one frame, never the node
            self.node.stats["internal_errors"] += 1
            log.exception("frame_handling_failed", session=self.sid)
        if self.inflight >= self._max_inflight and not self._reading_paused and not self.closed:
            self._reading_paused = True
            self.node.stats["reads_paused"] += 1
            self.transport.pause_reading()

    def _handle(self, msgs: list[list[Any]]) -> None:
        router = self.router
        router.new_batch()  # a draw of a target holds within one frame's calls at most
        now = self.loop.time()
        serving = self.authenticated and not self.node.draining
        for msg in msgs:
            # Fast paths for the messages every call carries: the checks are the
            # ones check_from_client makes (names are checked by the router on a miss).
            kind = msg[0]
            if kind == RESPONSE:
                if len(msg) == 3 and type(msg[1]) is int and serving:
                    router.respond(self, msg[1], msg[2])
                    continue
            elif kind == ACCEPT_UPTO:  # once per frame of REQUESTs a provider takes (a
                # well-formed one is always taken here, draining or not: calls still finish)
                if len(msg) == 2 and type(msg[1]) is int and self.authenticated:
                    if msg[1] > self.accepted_upto:
                        self.accepted_upto = msg[1]
                    continue
            elif kind == REQUEST:
                if (serving and len(msg) == 5 and type(msg[1]) is int and msg[1] >= 0
                        and type(msg[2]) is str
                        and (msg[4] is None or (type(msg[4]) is int and msg[4] > 0))):
                    if not self._gated or self._admit(msg[1], msg[2], now):
                        router.request(self, msg[1], msg[2], msg[3], msg[4], now)
                    continue
            self._handle_other(msg, now)
            if self.closed or self.protocol.state is not OPEN:
                return

    def _handle_other(self, msg: list[Any], now: float) -> None:
        """Every message the fast paths did not take, with the full checks."""
        limits = self.node.config.limits
        problem = check_from_client(msg, limits.max_name_length, limits.max_names_per_message)
        if problem is not None:
            self.invalid(_ref_of(msg), problem)
            return
        kind = msg[0]
        router = self.router
        if not self.authenticated:
            if kind == AUTH and not self._logging_in:
                self._auth(msg[1])
            elif kind == AUTH:  # one at a time: its answer (or BUSY, after BUSY_HOLD) comes
                self.invalid(None, "an AUTH of this connection is being checked: wait for "
                             "its answer")
            else:
                self.send([ERROR, _ref_of(msg), errors.NOT_AUTHENTICATED,
                           "the first message must be AUTH"])
                self._strike()
        elif kind == REQUEST:  # draining, or with meta (the fast path takes plain ones)
            if self.node.draining:
                self.send([ERROR, msg[1], errors.SHUTTING_DOWN, "the node is shutting down"])
            elif not self._gated or self._admit(msg[1], msg[2], now):
                trace = msg[5].get("traceparent") if len(msg) == 6 else None
                router.request(self, msg[1], msg[2], msg[3], msg[4], now, trace)
        elif kind == RESPONSE:
            router.respond(self, msg[1], msg[2])
        elif kind == ACCEPT:
            router.accept(self, msg[1], now)
        elif kind == REJECT:
            router.reject(self, msg[1], now)
        elif kind == ERROR:  # a provider's failure: PROVIDER_ERROR, or its answer too large
            router.provider_error(self, msg[1], msg[3],
                                  msg[2] if msg[2] == errors.PAYLOAD_TOO_LARGE
                                  else errors.PROVIDER_ERROR)
        elif kind == PROVIDE:
            if self._gated and not self._admit_provide(msg[1], msg[2], now):
                return
            new = set(msg[2]) - self.provides
            if new and not self._room_for(msg[1], len(new)):
                return
            router.provide(self, msg[2])
            if self.user is not None:
                self.node.gate.provided[self.user.name] += len(new)
            self.send([OK, msg[1]])
        elif kind == UNPROVIDE:
            if self._limiter is None or self._take(_ref_of(msg), now):
                gone = len(self.provides)
                router.unprovide(self, msg[2])
                if self.user is not None:
                    self.node.gate.provided[self.user.name] -= gone - len(self.provides)
                self.send([OK, msg[1]])
        elif kind == CANCEL:  # the caller gave a call up (counted as a request: it costs)
            if self.inflight and (self._limiter is None or self._take(msg[1], now)):
                router.cancel_from(self, msg[1])
        elif kind == PING:
            if self._limiter is None or self._take(None, now, ping=True):
                self.send([PONG, msg[1] if len(msg) > 1 else None])
        elif kind == AUTH:
            self.invalid(None, "already authenticated")
        elif kind == PONG and len(msg) > 1 and msg[1] == DRAIN_PING:
            self.node.notice_heard(self)  # what it sent before it heard the notice is read

    # -- who may do what --------------------------------------------------------------

    def _admit(self, ref: int, name: str, now: float) -> bool:
        """A REQUEST within the user's rate limit and permissions; else answered here.
        A name the user's permissions have not allowed before is checked for shape and
        length first: junk never reaches the globs, the caches or the metrics."""
        if self._limiter is not None and not self._take(ref, now, name):
            return False
        perms = self._perms
        if perms is not None and not perms.allowed_call(name):
            if not valid_name(name, self._max_name):
                self.node.stats["invalid_names"] += 1
                self.send([ERROR, ref, errors.INVALID_MESSAGE,
                           f"invalid rpc name {name[:64]!r}: 1-{self._max_name} of "
                           "A-Z a-z 0-9 _ . : / -"])
                return False
            if not perms.may_call(name):
                self.node.stats["permission_denied"] += 1
                self.send([ERROR, ref, errors.PERMISSION_DENIED,
                           f"{self._who()} may not call {name!r}"])
                return False
        return True

    def _room_for(self, ref: int, new: int) -> bool:
        """Room for ``new`` more provided names on this connection and for its user;
        else the PROVIDE is refused whole (LIMIT_EXCEEDED)."""
        limit = self.node.config.limits.max_provided_per_connection
        if limit and len(self.provides) + new > limit:
            why = f"this connection may provide at most {limit} names"
        else:
            user = self.user
            limit = self.node.gate.max_provided(user) if user is not None else 0
            if user is None or not limit or self.node.gate.provided[user.name] + new <= limit:
                return True
            why = f"{self._who()} may provide at most {limit} names on this node"
        self.node.stats["provide_limited"] += 1
        self.send([ERROR, ref, errors.LIMIT_EXCEEDED, why])
        return False

    def _admit_provide(self, ref: int, names: list[str], now: float) -> bool:
        if self._limiter is not None and not self._take(ref, now):
            return False
        if self._perms is not None:
            denied = [n for n in names if not self._perms.may_provide(n)]
            if denied:
                self.node.stats["permission_denied"] += 1
                self.send([ERROR, ref, errors.PERMISSION_DENIED,
                           f"{self._who()} may not provide {', '.join(denied[:5])[:256]}"])
                return False
        return True

    def _take(self, ref: int | None, now: float, rpc: str | None = None,
              ping: bool = False) -> bool:
        """One request against the rate limit. A refusal costs far less than serving:
        its text is made once per window, and a frame's refused PINGs get one ERROR."""
        limiter = self._limiter
        assert limiter is not None
        if limiter.take(now):
            return True
        self.node.stats["rate_limited"] += 1
        if limiter.first_refusal_in_window():
            log.warning("rate_limited", session=self.sid, user=self._who(), call_id=ref,
                        rpc=rpc[:128] if rpc else None, refused_total=limiter.refused)
            limiter.refusal = (f"over the rate limit of {self._who()}; this window ends in "
                               f"{max(limiter.end - now, 0):.2f} s")
        if ping:
            if self._pings_refused:
                return False
            self._pings_refused = True
        self.send([ERROR, ref, errors.RATE_LIMITED, limiter.refusal])
        return False

    def _who(self) -> str:
        return f"user {self.user.name!r}" if self.user is not None else "this connection"

    def _auth(self, params: dict[str, Any]) -> None:
        name = params.get("name")
        if name is not None and (type(name) is not str or not 0 < len(name) <= 128):
            self.invalid(None, "AUTH name must be a string of 1-128 characters")
            return
        gate = self.node.gate
        if gate.mode == "none":
            self._authenticated(None, name)
            return
        self._logging_in = True
        address = self.remote_address[0] if self.remote_address else ""
        gate.login(params, lambda user, reason: self._checked(user, reason, name),
                   address, lambda: not self.closed)

    def _checked(self, user: User | None, reason: str, name: str | None) -> None:
        if self.closed:
            return
        gate = self.node.gate
        if user is None and reason == BUSY:  # not checked: the client may try again, after
            # BUSY_HOLD (another AUTH meanwhile is refused with a strike): a client that
            # retries at once cannot make its refusals a flood
            self.loop.call_later(BUSY_HOLD, self._busy)
            return
        self._logging_in = False
        if user is None:
            self._auth_failures += 1
            gate.stats["auth_failures"] += 1
            log.info("auth_failed", session=self.sid, reason=reason,
                     failures=self._auth_failures)
            self.send([AUTH_FAIL, errors.NOT_AUTHENTICATED, "authentication failed"])
            if self._auth_failures >= gate.max_failures:
                gate.stats["closed_after_auth_failures"] += 1
                self.flush()
                self.fail_now(CloseCode.POLICY_VIOLATION, "too many failed AUTH attempts")
            return
        if user.max_connections and gate.connections[user.name] >= user.max_connections:
            gate.stats["connections_refused"] += 1
            log.warning("too_many_connections", session=self.sid, user=user.name,
                        limit=user.max_connections)
            self.send([AUTH_FAIL, errors.RATE_LIMITED,
                       f"user {user.name!r} has its {user.max_connections} connections"])
            self.flush()
            self.fail_now(CloseCode.POLICY_VIOLATION, "too many connections for this user")
            return
        gate.connections[user.name] += 1
        self.user = user
        self._perms = user.permissions
        self._authenticated(user, name)

    def _busy(self) -> None:
        self._logging_in = False
        if not self.closed:
            self.send([AUTH_FAIL, errors.BUSY, "the node is busy checking logins; retry"])

    def _authenticated(self, user: User | None, name: str | None) -> None:
        """``name`` is a display label only: with users, who the client is reaches
        providers as ``user`` (CallContext.user), and as the start of the caller label
        and of the load history's provider name, ``user/name`` where the name differs,
        so a client cannot pass for another user (AUTH name "admin" of user "mallory"
        is ``mallory/admin@s18``)."""
        if name is not None:
            self.provider_name = name
        if user is not None:
            self.user_name = user.name
            self.provider_name = (user.name if name is None or name == user.name
                                  else f"{user.name}/{name}")
            self.label = f"{self.provider_name}@{self.sid}"
        elif name is not None:
            self.label = f"{name}@{self.sid}"
        self._limiter = self.node.gate.limiter_for(user)
        self._gated = self._perms is not None or self._limiter is not None
        self.authenticated = True
        self.node.gate.logged_in(self.address)
        if self._auth_timer is not None:
            self._auth_timer.cancel()
            self._auth_timer = None
        limits = self.node.config.limits
        self.send([AUTH_OK, {
            "node": self.node.name,
            "session": self.sid,
            "user": user.name if user is not None else None,
            "protocol": PROTOCOL_VERSION,
            "max_frame": limits.max_frame_bytes,
            "max_frame_messages": limits.max_messages_per_frame,
            "max_inflight": limits.max_inflight_per_connection,
            "ack_timeout_ms": int(self.node.config.rpc.ack_timeout * 1000),
            "response_timeout_ms": int(self.node.config.rpc.response_timeout * 1000),
            "accept_upto": True,   # it takes ACCEPT_UPTO
        }])
        if self.node.cut_off:  # the notice its peers had: move on if you know another node
            self.send(CUT_OFF_NOTICE)
            self.node.stats["clients_sent_elsewhere"] += 1

    def invalid(self, ref: int | None, reason: str) -> None:
        """Answer a malformed message with INVALID_MESSAGE and count a strike."""
        self.node.stats["invalid_messages"] += 1
        self.send([ERROR, ref, errors.INVALID_MESSAGE, reason])
        self._strike()

    def _strike(self) -> None:
        now = self.loop.time()
        if now >= self._strike_window_end:
            self._strikes = 0
            self._strike_window_end = now + self.node.config.limits.invalid_window
        self._strikes += 1
        if self._strikes > self.node.config.limits.max_invalid_messages:
            self.node.stats["closed_for_garbage"] += 1
            log.warning("closing_garbage_sender", session=self.sid, strikes=self._strikes)
            self.flush()
            self.fail_now(CloseCode.POLICY_VIOLATION, "too many invalid messages")


def _ref_of(msg: list[Any]) -> int | None:
    """The id a reply to ``msg`` should carry, when it has a usable one."""
    if len(msg) > 1 and is_id(msg[1]):
        return msg[1]
    return None
