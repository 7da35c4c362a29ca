"""One client's conversation with the node: AUTH, input checks, limits, and what goes to
the router. Pure: no asyncio, no sockets; ``now`` comes in with each frame.

``SessionRules`` is the router's peer for one client connection (``send``,
``label``, ``calls``, ``inflight``, ``provides``, ...). The shell (broker/session.py
``Session``, a websockets connection) decodes frames and hands their messages to
``handle``; the simulator (rpcbus.sim) hands it messages the same way. What it
needs of its shell: ``send`` and ``flush`` (queue a message, write what is queued),
``is_open()``, ``close_for_policy(reason)`` (close with 1008), ``later(delay, fn)``
(a timer) and ``logged_in()`` (the login timer stops).

Bad input never takes the node down: a malformed message gets
``ERROR INVALID_MESSAGE`` naming the problem and a strike; more than
``limits.max_invalid_messages`` strikes within ``limits.invalid_window``
seconds close the connection (code 1008).

Who the client is (broker/gate.py): with auth mode ``users`` the first
message must be an AUTH with a token or a user and password; a failed AUTH is
answered AUTH_FAIL (the client learns no more than that) and after
``auth.max_failures`` of them the connection closes (1008). Then every REQUEST
is checked against the user's ``call`` globs (PERMISSION_DENIED) and rate limit
(RATE_LIMITED; the connection stays), every PROVIDE against ``provide``.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any, Callable, Protocol

import structlog

from rpcbus import errors
from rpcbus.broker.auth import BUSY, Permissions, token_digest
from rpcbus.protocol import (
    ACCEPT,
    ACCEPT_UPTO,
    ALL,
    AUTH,
    AUTH_FAIL,
    AUTH_OK,
    CANCEL,
    CREDIT,
    DISCOVER,
    DRAIN_PING,
    ERROR,
    FOUND,
    OK,
    PART,
    PING,
    PONG,
    PROTOCOL_VERSION,
    PROVIDE,
    REJECT,
    REQUEST,
    RESPONSE,
    STREAM,
    UNPROVIDE,
    check_from_client,
    is_id,
    valid_name,
)

if TYPE_CHECKING:
    from rpcbus.broker.auth import User
    from rpcbus.broker.config import Config
    from rpcbus.broker.gate import Gate
    from rpcbus.broker.limits import WindowLimiter
    from rpcbus.broker.router import Router

log = structlog.get_logger(module="rpcbus.session")

BUSY_HOLD = 0.25   # s an AUTH answered BUSY waits for its answer

# to every client of a node cut off from the cluster (Node._check_cut_off): connect to
# another node you know (the SDKs do, and stay when none answers)
CUT_OFF_NOTICE = [ERROR, None, errors.CLUSTER_UNAVAILABLE,
                  "this node cannot reach the cluster: connect to another node"]


class NodeView(Protocol):
    """What the rules read of their node (broker/node.py ``Node``, or the simulator's)."""

    config: Config
    router: Router
    gate: Gate
    stats: Counter[str]
    draining: bool   # stopping: no new calls
    cut_off: bool    # its bus has been down past cluster.evacuate_after
    name: str

    def notice_heard(self, session: Any) -> None:
        """The client answered the drain notice's PING: what it sent before is read."""

    def discover(self, name: str | None, may_call: Callable[[str], bool]) -> Any:
        """What the cluster provides (DISCOVER): names, or ``name``'s providers."""


class SessionRules:
    """A client of this node, as caller and provider (the router's ``Peer``). ``node`` is
    what the rules read of the node: its config, router, gate, stats and state."""

    def __init__(self, node: NodeView, sid: str) -> None:
        limits = node.config.limits
        self.node = node
        self.router = node.router
        self.sid = sid
        self.label = sid                 # how providers see this client as a caller
        self.user_name: str | None = None  # the authenticated user (auth mode users)
        self.provider_name = sid         # how load history names it as a provider
        self.hrows: dict[Any, Any] = {}  # its load-history rows (history.py)
        self.origin = ""                 # its calls start on this node
        self.closed = False
        self.authenticated = False
        self.inflight = 0
        self.load = 0                    # attempts the router sent here (a provider)
        self.attempts = 0                # attempts ever sent here
        self.rate = 0.0                  # attempts sent per second, smoothed
        self.lat = 0.0                   # seconds an attempt takes here, smoothed
        self.steady = 0.0                # ``lat`` smoothed over time (router.tick)
        self.minute: Any = None          # its last minute as a provider (router.provide)
        self.seen = 0.0                  # ``lat`` when an attempt here last ended
        self.calls: dict[int, Any] = {}    # its calls in flight by its ids (the router's)
        self.accepted_upto = 0           # ACCEPT_UPTO: attempts up to this one it took
        self.provides: set[str] = set()
        self.is_node = False             # a client, not another node of the cluster
        self.address = ""                # the client's IP address (the shell's to set)
        self._max_name = limits.max_name_length
        self._pings_refused = False      # this frame's refused PINGs were answered once
        self._strikes = 0
        self._strike_window_end = 0.0
        self.user: User | None = None
        self._perms: Permissions | None = None      # None: everything allowed
        self._login_token: str | None = None        # the digest of the token it logged in with
        self._limiter: WindowLimiter | None = None  # None: no rate limit
        self._gated = False                         # either of the two is set
        self._logging_in = False
        self._auth_failures = 0

    # -- what the shell provides ---------------------------------------------------------

    def send(self, msg: list[Any]) -> None:
        raise NotImplementedError

    def flush(self) -> None:
        raise NotImplementedError

    def is_open(self) -> bool:
        raise NotImplementedError

    def close_for_policy(self, reason: str) -> None:
        raise NotImplementedError

    def later(self, delay: float, callback: Callable[[], None]) -> None:
        raise NotImplementedError

    def logged_in(self) -> None:
        """AUTH completed: the shell stops its login timer."""

    # -- input -------------------------------------------------------------------------

    def handle(self, msgs: list[list[Any]], now: float) -> None:
        """The messages of one frame, read at ``now``: each checked and handed to the
        router, or answered here (an error, OK, PONG, AUTH_OK)."""
        router = self.router
        router.new_batch()  # a draw of a target holds within one frame's calls at most
        serving = self.authenticated and not self.node.draining
        self._pings_refused = False      # this frame's refused PINGs get one answer
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
            elif kind == PART:  # a stream's parts: up to a window per CREDIT
                if len(msg) == 3 and type(msg[1]) is int and serving:
                    router.part(self, msg[1], msg[2])
                    continue
            self._handle_other(msg, now)
            if not self.is_open():
                return

    def _handle_other(self, msg: list[Any], now: float) -> None:
        """Every message the fast paths did not take, with the full checks."""
        limits = self.node.config.limits
        problem = check_from_client(msg, limits.max_name_length, limits.max_names_per_message)
        if problem is not None:
            self.invalid(_ref_of(msg), problem, now)
            return
        kind = msg[0]
        router = self.router
        if not self.authenticated:
            if kind == AUTH and not self._logging_in:
                self._auth(msg[1], now)
            elif kind == AUTH:  # one at a time: its answer (or BUSY, after BUSY_HOLD) comes
                self.invalid(None, "an AUTH of this connection is being checked: wait for "
                             "its answer", now)
            else:
                self.send([ERROR, _ref_of(msg), errors.NOT_AUTHENTICATED,
                           "the first message must be AUTH"])
                self._strike(now)
        elif kind == REQUEST or kind == STREAM:  # draining, or with meta (the fast path
            if self.node.draining:                 # takes plain REQUESTs)
                self.send([ERROR, msg[1], errors.SHUTTING_DOWN, "the node is shutting down"])
            elif not self._gated or self._admit(msg[1], msg[2], now):
                meta = msg[5] if len(msg) == 6 else None
                router.request(self, msg[1], msg[2], msg[3], msg[4], now,
                               None if meta is None else meta.get("traceparent"),
                               0 if meta is None or kind == REQUEST else meta["window"])
        elif kind == ALL:
            if self.node.draining:
                self.send([ERROR, msg[1], errors.SHUTTING_DOWN, "the node is shutting down"])
            elif not self._gated or self._admit(msg[1], msg[2], now):
                meta = msg[5] if len(msg) == 6 else {}
                router.request_all(self, msg[1], msg[2], msg[3], msg[4], now,
                                   meta.get("traceparent"), meta.get("max_replies") or 0)
        elif kind == RESPONSE:
            router.respond(self, msg[1], msg[2])
        elif kind == PART:
            router.part(self, msg[1], msg[2])
        elif kind == CREDIT:  # flow control of its own streams: not a request
            if self.inflight:
                router.credit(self, msg[1], msg[2])
        elif kind == ACCEPT:
            router.accept(self, msg[1], now)
        elif kind == REJECT:
            router.reject(self, msg[1], now)
        elif kind == ERROR:  # a provider's failure: PROVIDER_ERROR, its answer too large,
            code = msg[2]    # or the application's own error (code and data beside)
            if code == errors.APP_ERROR and len(msg) == 5:
                router.provider_error(self, msg[1], msg[3], code, msg[4])
            else:
                router.provider_error(self, msg[1], msg[3],
                                      code if code == errors.PAYLOAD_TOO_LARGE
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
        elif kind == DISCOVER:  # what the cluster provides that this user may call
            if self._limiter is None or self._take(msg[1], now):
                perms = self._perms
                may_call = perms.may_call if perms is not None else _anything
                name = msg[2]
                if name is not None and not may_call(name):
                    self.node.stats["permission_denied"] += 1
                    self.send([ERROR, msg[1], errors.PERMISSION_DENIED,
                               f"{self._who()} may not call {name!r}"])
                else:
                    self.send([FOUND, msg[1], self.node.discover(name, may_call)])
        elif kind == PING:
            if self._limiter is None or self._take(None, now, ping=True):
                self.send([PONG, msg[1] if len(msg) > 1 else None])
        elif kind == AUTH:
            self.invalid(None, "already authenticated", now)
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

    def _auth(self, params: dict[str, Any], now: float) -> None:
        name = params.get("name")
        if name is not None and (type(name) is not str or not 0 < len(name) <= 128):
            self.invalid(None, "AUTH name must be a string of 1-128 characters", now)
            return
        gate = self.node.gate
        if gate.mode == "none":
            self._authenticated(None, name)
            return
        self._logging_in = True
        token = params.get("token")
        self._login_token = token_digest(token) if isinstance(token, str) else None
        gate.login(params, lambda user, reason: self._checked(user, reason, name),
                   self.address, lambda: not self.closed)

    def _checked(self, user: User | None, reason: str, name: str | None) -> None:
        if self.closed:
            return
        gate = self.node.gate
        if user is None and reason == BUSY:  # not checked: the client may try again, after
            # BUSY_HOLD (another AUTH meanwhile is refused with a strike): a client that
            # retries at once cannot make its refusals a flood
            self.later(BUSY_HOLD, self._busy)
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
                self.close_for_policy("too many failed AUTH attempts")
            return
        if user.max_connections and gate.connections[user.name] >= user.max_connections:
            gate.stats["connections_refused"] += 1
            log.warning("too_many_connections", session=self.sid, user=user.name,
                        limit=user.max_connections)
            self.send([AUTH_FAIL, errors.RATE_LIMITED,
                       f"user {user.name!r} has its {user.max_connections} connections"])
            self.flush()
            self.close_for_policy("too many connections for this user")
            return
        gate.connections[user.name] += 1
        self.user = user
        self._perms = user.permissions
        self._authenticated(user, name)

    def rights_changed(self) -> None:
        """The node reloaded its users: from now on this session has the rights its user
        has now. A user (or the token it logged in with) no longer there keeps none.
        Names it may no longer provide are withdrawn (it is told, once); its calls in
        flight, both ways, finish."""
        old = self.user
        if old is None or not self.authenticated:
            return  # auth none, or still logging in (that checks the new table)
        users = self.node.gate.users
        new = (users.by_token.get(self._login_token) if self._login_token is not None
               else users.by_name.get(old.name))
        if new is not None and new.name != old.name:
            new = None
        perms = new.permissions if new is not None else Permissions((), ())
        if new is not None:
            self.user = new
        self._perms = perms
        self._limiter = self.node.gate.limiter_for(self.user)
        self._gated = True
        denied = sorted(n for n in self.provides if not perms.may_provide(n))
        if denied:
            before = len(self.provides)
            self.router.unprovide(self, denied)
            self.node.gate.provided[old.name] -= before - len(self.provides)
            self.send([ERROR, None, errors.PERMISSION_DENIED,
                       f"{self._who()} may no longer provide {', '.join(denied[:20])}"
                       + (f" and {len(denied) - 20} more" if len(denied) > 20 else "")])
        if new is None or denied:
            log.info("session_rights_changed", session=self.sid, user=old.name,
                     revoked=new is None, withdrawn=len(denied))

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
        self.logged_in()
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
            "max_timeout_ms": int(self.node.config.rpc.max_timeout * 1000),
            "accept_upto": True,   # it takes ACCEPT_UPTO
        }])
        if self.node.cut_off:  # the notice its peers had: move on if you know another node
            self.send(CUT_OFF_NOTICE)
            self.node.stats["clients_sent_elsewhere"] += 1

    def invalid(self, ref: int | None, reason: str, now: float) -> None:
        """Answer a malformed message with INVALID_MESSAGE and count a strike."""
        self.node.stats["invalid_messages"] += 1
        self.send([ERROR, ref, errors.INVALID_MESSAGE, reason])
        self._strike(now)

    def _strike(self, now: float) -> None:
        if now >= self._strike_window_end:
            self._strikes = 0
            self._strike_window_end = now + self.node.config.limits.invalid_window
        self._strikes += 1
        if self._strikes > self.node.config.limits.max_invalid_messages:
            self.node.stats["closed_for_garbage"] += 1
            log.warning("closing_garbage_sender", session=self.sid, strikes=self._strikes)
            self.flush()
            self.close_for_policy("too many invalid messages")


def _anything(name: str) -> bool:
    return True


def _ref_of(msg: list[Any]) -> int | None:
    """The id a reply to ``msg`` should carry, when it has a usable one."""
    ref = msg[1] if len(msg) > 1 else None
    return ref if type(ref) is int and is_id(ref) else None
