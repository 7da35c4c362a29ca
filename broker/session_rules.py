"""One client's conversation with the node: AUTH, input checks, limits, and what goes to
the router. Pure: no asyncio, no sockets; ``now`` comes in with each frame.

``SessionRules`` is the router's peer for one client connection (``send``,
``label``, ``calls``, ``inflight``, ``provides``, ...). Its shell holds it, as
websockets' ``Connection`` holds its protocol: broker/session.py ``Session`` (a
WebSocket connection) decodes frames and hands their messages to ``handle``; the
simulator (rpcbus.sim) and the unit tests hand it messages the same way. What it
needs of its shell (``Shell``, given to the constructor, its hooks bound there so
the router's ``peer.send`` costs no frame more): ``send`` and ``flush`` (queue a
message, write what is queued), ``is_open()``, ``close_for_policy(reason)`` (close
with 1008), ``later(delay, fn)`` (a timer), ``logged_in()`` (the login timer
stops) and ``check_login(params, done)`` (a password or token checked where the node
checks them, in threads; its answer comes back as the event ``done(user, reason)``).

Bad input never takes the node down: a malformed message gets
``ERROR INVALID_MESSAGE`` naming the problem and a strike; more than
``limits.max_invalid_messages`` strikes within ``limits.invalid_window``
seconds close the connection (code 1008).

Who the client is (broker/gate.py, broker/session_policy.py, which this class
extends): with auth mode ``users`` the first message must be an AUTH with a token
or a user and password; a failed AUTH is answered AUTH_FAIL (a password's says no
more than that, a token's says why) and after ``auth.max_failures`` of them the
connection closes (1008). Then every REQUEST is checked against the user's
``call`` globs (PERMISSION_DENIED) and rate limit (RATE_LIMITED; the connection
stays), every PROVIDE against ``provide``.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any, Callable, Protocol

from rpcbus import errors
from rpcbus.broker.session_policy import SessionPolicy
from rpcbus.protocol import (
    ACCEPT,
    ACCEPT_UPTO,
    ALL,
    AUTH,
    CANCEL,
    CREDIT,
    DISCOVER,
    DRAIN_PING,
    EMIT,
    ERROR,
    FOUND,
    GAP,
    OK,
    PART,
    PING,
    PONG,
    PRESENCE,
    PRESENCE_GET,
    PRESENCE_SUBSCRIBE,
    PRESENCE_UNSUBSCRIBE,
    PROVIDE,
    REJECT,
    REQUEST,
    RESPONSE,
    SENT,
    STREAM,
    SUBSCRIBE,
    UNPROVIDE,
    UNSUBSCRIBE,
    check_from_client,
    is_id,
)
from rpcbus.provider import Freshness

if TYPE_CHECKING:
    from rpcbus.broker.auth import Permissions, User
    from rpcbus.broker.config import Config
    from rpcbus.broker.events import Events
    from rpcbus.broker.gate import Gate
    from rpcbus.broker.limits import WindowLimiter
    from rpcbus.broker.presence import Presence
    from rpcbus.broker.router import Router
    from rpcbus.broker.session_policy import Login

class NodeView(Protocol):
    """What the rules read of their node (broker/node.py ``Node``, or the simulator's)."""

    config: Config
    router: Router
    gate: Gate
    events: Events
    presence: Presence
    stats: Counter[str]
    draining: bool   # stopping: no new calls
    name: str

    @property
    def cut_off(self) -> bool:
        """Its bus has been down past cluster.evacuate_after."""

    def notice_heard(self, session: Any) -> None:
        """The client answered the drain notice's PING: what it sent before is read."""

    def discover(self, name: str | None, may_call: Callable[[str], bool]) -> Any:
        """What the cluster provides (DISCOVER): names, or ``name``'s providers."""

    def subscribed(self, session: Any, ref: int, topics: list[str]) -> None:
        """Answer the SUBSCRIBE ``ref`` with OK once the cluster hears ``topics`` for this
        node (at once when it does already, or cannot: no cluster, or its bus is down)."""


class Shell(Protocol):
    """What the rules need of the connection that holds them (see the module docstring)."""

    def send(self, msg: list[Any]) -> None: ...
    def flush(self) -> None: ...
    def is_open(self) -> bool: ...
    def close_for_policy(self, reason: str) -> None: ...
    def later(self, delay: float, callback: Callable[[], None]) -> None: ...
    def logged_in(self) -> None: ...
    def check_login(self, params: dict[str, Any], done: Login) -> None: ...


class SessionRules(SessionPolicy):
    """A client of this node, as caller and provider (the router's ``Peer``). ``node`` is
    what the rules read of the node: its config, router, gate, stats and state;
    ``shell`` the connection that holds them."""

    # An rpcbus SDK accepts a call before it runs it, and sends a call refused
    # SHUTTING_DOWN to another node (broker/ds_session.py's deepstream clients do neither)
    runs_before_accept = False
    moves_on_drain = True
    echoes = True  # hears its own events (deepstream's clients hand them on themselves)
    origins = False  # takes EVENTs with origin and number (its AUTH said event_origins)

    def __init__(self, node: NodeView, sid: str, shell: Shell) -> None:
        limits = node.config.limits
        self.send = shell.send
        self.flush = shell.flush
        self.is_open = shell.is_open
        self.close_for_policy = shell.close_for_policy
        self.later = shell.later
        self.logged_in = shell.logged_in
        self.check_login = shell.check_login
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
        self.pace: Any = None            # its ack timeout and limit (the router's)
        self.steady = 0.0                # ``lat`` smoothed over time (router.tick)
        self.minutes: Any = None         # its figures per rpc as a provider (router.provide)
        self.seen = 0.0                  # ``lat`` when an attempt here last ended
        self.calls: dict[int, Any] = {}    # its calls in flight by its ids (the router's)
        self.accepted_upto = 0           # ACCEPT_UPTO: attempts up to this one it took
        self.provides: set[str] = set()
        self.topics: set[str] = set()    # what it subscribes to (broker/events.py's)
        self.events_held = False         # its client reads too slowly: events are lost
        self.events_lost: dict[str, int] = {}  # since it was held, by topic (told in GAPs)
        self.present_as: str | None = None  # the user presence counts it as (logged in)
        self.is_node = False             # a client, not another node of the cluster
        self.address = ""                # the client's IP address (the shell's to set)
        self._max_name = limits.max_name_length
        self._pings_refused = False      # this frame's refused PINGs were answered once
        self._strikes = 0
        self._strike_window_end = 0.0
        self.user: User | None = None
        self._perms: Permissions | None = None      # None: everything allowed
        self._login_token: str | None = None        # the digest of the token it logged in with
        self._rights_ended = ""                     # why, once its token expired
        self._expiry_timer = 0  # the live expiry timer's number (``_watch_expiry``)
        self._limiter: WindowLimiter | None = None  # None: no rate limit
        self._gated = False                         # either of the two is set
        self.logging_in = False
        self._auth_failures = 0
        self._sent = Freshness()         # how late its frames are read (their SENT)
        self._frame_age = 0.0            # s: how long this frame waited beyond the least

    # -- input -------------------------------------------------------------------------

    def handle(self, msgs: list[list[Any]], now: float, size: int = 0) -> None:
        """The messages of one frame of ``size`` bytes, read at ``now``: the frame
        charged to its user's byte budget (``bytes_in``), then each message checked and
        handed to the router, or answered here (an error, OK, PONG, AUTH_OK)."""
        if size and self._limiter is not None:
            self._limiter.received(now, size)
        router = self.router
        router.new_batch()  # a draw of a target holds within one frame's calls at most
        serving = self.authenticated and not (self.node.draining and self.moves_on_drain)
        self._pings_refused = False      # this frame's refused PINGs get one answer
        age = self._frame_age = 0.0
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
                        router.request(self, msg[1], msg[2], msg[3], msg[4], now, None, 0,
                                       age)
                    continue
            elif kind == SENT:  # when the frame's first call was made: what its calls
                if len(msg) == 2 and type(msg[1]) is int and msg[1] >= 0:  # have left
                    age = self._frame_age = self._sent.learn(msg[1], now) / 1000
                    continue
            elif kind == PART:  # a stream's parts: up to a window per CREDIT
                if len(msg) == 3 and type(msg[1]) is int and serving:
                    router.part(self, msg[1], msg[2])
                    continue
            elif kind == ACCEPT:  # one call's (deepstream's clients send one per call);
                # taken while draining too: calls under way finish
                if len(msg) == 2 and type(msg[1]) is int and self.authenticated:
                    router.accept(self, msg[1], now)
                    continue
            elif kind == EMIT:  # an event: the names check is the SUBSCRIBE's (a topic
                # nobody could subscribe to reaches nobody), the length is checked here
                if (len(msg) == 3 and self.authenticated and type(msg[1]) is str
                        and 0 < len(msg[1]) <= self._max_name):
                    if not self._gated or self._admit_emit(msg[1], now):
                        self.node.events.emit(self, msg[1], msg[2])
                    continue
            self._handle_other(msg, now)
            if not self.is_open():
                return

    def bytes_in(self, size: int, now: float) -> None:
        """A frame of ``size`` bytes came at ``now`` whose messages are handed in apart
        (a deepstream client's): its user's byte budget, if any, is charged
        (broker/limits.py ``WindowLimiter.received``)."""
        if self._limiter is not None:
            self._limiter.received(now, size)

    def end(self) -> None:
        """Its connection is over (its shell tells it once, before the node drops it as a
        peer): its user's connection and the names it provided stop counting toward the
        user's limits (broker/gate.py)."""
        assert not self.closed, f"{self.sid} ended twice"
        self.closed = True
        if self.user is not None:
            gate = self.node.gate
            gate.connections[self.user.key] -= 1
            gate.provided[self.user.key] -= len(self.provides)
            assert gate.connections[self.user.key] >= 0, "connections below 0"

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
            if kind == AUTH and not self.logging_in:
                self._auth(msg[1], now)
            elif kind == AUTH:  # one at a time: its answer (or BUSY, after BUSY_HOLD) comes
                self.invalid(None, "an AUTH of this connection is being checked: wait for "
                             "its answer", now)
            else:
                self.send([ERROR, _ref_of(msg), errors.NOT_AUTHENTICATED,
                           "the first message must be AUTH"])
                self._strike(now)
        elif kind == REQUEST or kind == STREAM:  # draining, or with meta (the fast path
            if self.node.draining and self.moves_on_drain:  # takes plain REQUESTs)
                self.send([ERROR, msg[1], errors.SHUTTING_DOWN, "the node is shutting down"])
            elif not self._gated or self._admit(msg[1], msg[2], now):
                meta = msg[5] if len(msg) == 6 else None
                router.request(self, msg[1], msg[2], msg[3], msg[4], now,
                               None if meta is None else meta.get("traceparent"),
                               0 if meta is None or kind == REQUEST else meta["window"],
                               self._frame_age)
        elif kind == ALL:
            if self.node.draining and self.moves_on_drain:
                self.send([ERROR, msg[1], errors.SHUTTING_DOWN, "the node is shutting down"])
            elif not self._gated or (self._admit(msg[1], msg[2], now)
                                     and self._admit_all(msg[1], msg[2], now)):
                meta = msg[5] if len(msg) == 6 else {}
                router.request_all(self, msg[1], msg[2], msg[3], msg[4], now,
                                   meta.get("traceparent"), meta.get("max_replies") or 0,
                                   self._frame_age)
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
            router.reject(self, msg[1], now, msg[2] if len(msg) == 3 else "")
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
            assert self.provides.issuperset(msg[2]), "a name provided is not counted"
            if self.user is not None:
                self.node.gate.provided[self.user.key] += len(new)
            self.send([OK, msg[1]])
        elif kind == UNPROVIDE:
            if self._limiter is None or self._take(_ref_of(msg), now):
                gone = len(self.provides)
                router.unprovide(self, msg[2])
                assert self.provides.isdisjoint(msg[2]), "a name unprovided is still provided"
                if self.user is not None:
                    self.node.gate.provided[self.user.key] -= gone - len(self.provides)
                    assert self.node.gate.provided[self.user.key] >= 0, "provided below 0"
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
        elif kind == EMIT:  # an event for every subscriber of its topic, on any node
            if self._admit_emit(msg[1], now):
                self.node.events.emit(self, msg[1], msg[2])
        elif kind == SUBSCRIBE:
            if self._limiter is None or self._take(msg[1], now):
                self._subscribe(msg[1], msg[2])
        elif kind == UNSUBSCRIBE:
            if self._limiter is None or self._take(msg[1], now):
                self.node.events.unsubscribe(self, msg[2])
                self.send([OK, msg[1]])
        elif kind == PRESENCE_GET or kind == PRESENCE_SUBSCRIBE \
                or kind == PRESENCE_UNSUBSCRIBE:
            if self._limiter is None or self._take(msg[1], now):
                self._presence(kind, msg[1], msg[2])
        elif kind == PING:
            if self._limiter is None or self._take(None, now, ping=True):
                self.send([PONG, msg[1] if len(msg) > 1 else None])
        elif kind == AUTH:
            self.reauth(msg[1], now)
        elif kind == PONG and len(msg) > 1 and msg[1] == DRAIN_PING:
            self.node.notice_heard(self)  # what it sent before it heard the notice is read

    # -- events (broker/events.py) -----------------------------------------------------

    def _subscribe(self, ref: int, topics: list[str]) -> None:
        """Subscribe to every topic of a SUBSCRIBE or to none: each must be allowed, and
        the connection's topics stay within ``limits.max_subscriptions_per_connection``."""
        if self._perms is not None:
            denied = [t for t in topics if not self._perms.may_subscribe(t)]
            if denied:
                self._deny(ref, f"{self._who()} may not subscribe to "
                                f"{', '.join(denied[:5])[:256]}")
                return
        limit = self.node.config.limits.max_subscriptions_per_connection
        if limit and len(self.topics | set(topics)) > limit:
            self.node.stats["subscribe_limited"] += 1
            self.send([ERROR, ref, errors.LIMIT_EXCEEDED,
                       f"this connection may subscribe to at most {limit} topics"])
            return
        self.node.events.subscribe(self, topics)
        self.node.subscribed(self, ref, topics)

    def _admit_emit(self, topic: str, now: float) -> bool:
        """Within the rate limit, and a topic its user may publish to (else told why)."""
        if self._limiter is not None and not self._take(None, now):
            return False
        if self._perms is not None and not self._perms.may_publish(topic):
            self._deny(None, f"{self._who()} may not publish to {topic!r}")
            return False
        return True

    def event(self, msg: list[Any]) -> None:
        """An EVENT of a topic it subscribes to (one message, shared by every subscriber):
        queued, or counted lost while the client reads too slowly (``events_held``: its
        write buffer is over ``limits.max_event_buffer_bytes``); it hears how many in a
        GAP once it caught up."""
        if self.events_held:
            lost = self.events_lost
            lost[msg[1]] = lost.get(msg[1], 0) + 1
            return
        self.send(msg)

    def events_caught_up(self) -> int:
        """Its client read what was held up: a GAP for each topic it lost events of, and
        events flow again. Returns how many it lost."""
        self.events_held = False
        lost, self.events_lost = self.events_lost, {}
        for topic, count in lost.items():
            self.send([GAP, topic, count])
        return sum(lost.values())

    # -- presence (broker/presence.py) -------------------------------------------------

    def _presence(self, kind: int, ref: int, users: list[str] | None) -> None:
        presence = self.node.presence
        if kind == PRESENCE_UNSUBSCRIBE:
            presence.unwatch(self, users)
            self.send([OK, ref])
            return
        if users is not None:
            denied = [u for u in users if not self.may_see(u)]
            if denied:
                self._deny(ref, f"{self._who()} may not see the presence of "
                                f"{', '.join(denied[:5])[:256]}")
                return
        if kind == PRESENCE_GET:
            self.send([FOUND, ref, [u for u in presence.everyone() if self.may_see(u)]
                       if users is None else {u: presence.online(u) for u in users}])
            return
        limit = self.node.config.limits.max_subscriptions_per_connection
        if users is not None and limit and len(
                presence.watching.get(self, set()) | set(users)) > limit:
            self.node.stats["subscribe_limited"] += 1
            self.send([ERROR, ref, errors.LIMIT_EXCEEDED,
                       f"this connection may watch at most {limit} users"])
            return
        presence.watch(self, users)
        self.send([OK, ref])

    def may_see(self, user: str) -> bool:
        """Whether this client's user may see ``user``'s presence (``presence`` globs)."""
        return self._perms is None or self._perms.may_see(user)

    def presence_changed(self, user: str, online: bool) -> None:
        self.send([PRESENCE, user, online])



def _anything(name: str) -> bool:
    return True


def _ref_of(msg: list[Any]) -> int | None:
    """The id a reply to ``msg`` should carry, when it has a usable one."""
    ref = msg[1] if len(msg) > 1 else None
    return ref if type(ref) is int and is_id(ref) else None
