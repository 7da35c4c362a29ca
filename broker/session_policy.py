"""Who a client is and what it may do: the AUTH of a session, the rights of its user
(permissions, rate limit, names provided, a token's expiry) and its strikes for bad
input. Pure, as broker/session_rules.py (``SessionRules`` is a ``SessionPolicy``):
the shell's timers and sends come in through the hooks its ``Shell`` gives.

Rights change while a session lasts: a reload (``rights_changed``), its JWT's expiry
(``_token_expired``: new requests get NOT_AUTHENTICATED, the names it provides are
withdrawn, its calls in flight finish) or a new JWT for the same user sent as AUTH
(``_reauth``: the new token's rights and expiry from then on).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, cast

import structlog

from rpcbus import errors
from rpcbus.broker.auth import BUSY, Permissions, token_digest
from rpcbus.protocol import AUTH_FAIL, AUTH_OK, ERROR, PROTOCOL_VERSION, valid_name

if TYPE_CHECKING:
    from rpcbus.broker.auth import User
    from rpcbus.broker.events import Subscriber
    from rpcbus.broker.limits import WindowLimiter
    from rpcbus.broker.peers import Provider
    from rpcbus.broker.router import Router
    from rpcbus.broker.session_rules import NodeView

    # an AUTH checked: the user (None: refused), why not, and the seconds its token
    # stays valid from now (None: no token, or one without expiry)
    Login = Callable[[User | None, str, float | None], None]

log = structlog.get_logger(module="rpcbus.session")

BUSY_HOLD = 0.25   # s an AUTH answered BUSY waits for its answer

# to every client of a node cut off from the cluster (broker/lifecycle.py Watch): connect to
# another node you know (the SDKs do, and stay when none answers)
CUT_OFF_NOTICE = [ERROR, None, errors.CLUSTER_UNAVAILABLE,
                  "this node cannot reach the cluster: connect to another node"]


class SessionPolicy:
    """The identity, rights and strikes of one client connection (its state is set up by
    ``SessionRules.__init__``)."""

    node: NodeView
    router: Router
    sid: str
    label: str
    user_name: str | None
    provider_name: str
    closed: bool
    authenticated: bool
    provides: set[str]
    topics: set[str]
    origins: bool
    present_as: str | None
    address: str
    user: User | None
    _max_name: int
    _pings_refused: bool
    _strikes: int
    _strike_window_end: float
    _perms: Permissions | None
    _login_token: str | None
    _rights_ended: str
    _expiry_timer: int
    _limiter: WindowLimiter | None
    _gated: bool
    logging_in: bool
    _auth_failures: int

    # -- what the shell provides (its ``Shell``, bound in ``SessionRules.__init__``) -----

    send: Callable[[list[Any]], None]          # queue a message for the client
    flush: Callable[[], None]                  # write what is queued
    is_open: Callable[[], bool]
    close_for_policy: Callable[[str], None]    # close with 1008
    later: Callable[[float, Callable[[], None]], None]  # a timer
    logged_in: Callable[[], None]              # AUTH completed: the login timer stops
    # check AUTH params where the node checks them (threads, off the loop); the answer
    # comes back as an event, done(user, reason, valid_for: the seconds its token stays
    # valid from now, None without one), unless the connection ended first
    check_login: Callable[[dict[str, Any], Login], None]

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
                self._deny(ref, f"{self._who()} may not call {name!r}")
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
            if user is None or not limit or self.node.gate.provided[user.key] + new <= limit:
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
                self._deny(ref, f"{self._who()} may not provide {', '.join(denied[:5])[:256]}")
                return False
        return True

    def _deny(self, ref: int | None, why: str) -> None:
        """Refuse a request the rights do not allow: NOT_AUTHENTICATED once the session's
        token has expired (it may log in again), else PERMISSION_DENIED."""
        self.node.stats["permission_denied"] += 1
        if self._rights_ended:
            self.send([ERROR, ref, errors.NOT_AUTHENTICATED, self._rights_ended])
        else:
            self.send([ERROR, ref, errors.PERMISSION_DENIED, why])

    def _admit_all(self, ref: int, name: str, now: float) -> bool:
        """A call_all admitted as a REQUEST (``_admit``) is charged one request more per
        provider beyond the first that the node knows of now: its fan-out counts against
        the caller's rate limit (broker/router.py caps it at ``limits.max_fanout``)."""
        if self._limiter is None:
            return True
        more = self.node.router.fanout_of(name, now) - 1
        return more <= 0 or self._take(ref, now, name, count=more)

    def _take(self, ref: int | None, now: float, rpc: str | None = None,
              ping: bool = False, count: int = 1) -> bool:
        """``count`` requests against the rate limit. A refusal costs far less than
        serving: its text is made once per window, and a frame's refused PINGs get one
        ERROR."""
        limiter = self._limiter
        assert limiter is not None
        if limiter.take(now, count):
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
        if params.get("event_origins") is True:
            self.origins = True
        if self.node.gate.mode == "none":  # who it says it is: its presence (docs/events.md)
            claimed = params.get("user")
            self._authenticated(None, name, claimed if type(claimed) is str
                                and 0 < len(claimed) <= 128 else name)
            return
        self.logging_in = True
        token = params.get("token")
        self._login_token = token_digest(token) if isinstance(token, str) else None
        self.check_login(params, lambda user, reason, valid_for:
                         self._checked(user, reason, valid_for, name))

    def _checked(self, user: User | None, reason: str, valid_for: float | None,
                 name: str | None) -> None:
        if self.closed:
            return
        gate = self.node.gate
        if user is None and reason == BUSY:  # not checked: the client may try again, after
            # BUSY_HOLD (another AUTH meanwhile is refused with a strike): a client that
            # retries at once cannot make its refusals a flood
            self.later(BUSY_HOLD, self._busy)
            return
        self.logging_in = False
        if user is None:
            # a token's refusal says why (nothing secret in it); a password's does not
            self._refuse_auth("auth_failed", reason, "authentication failed" + (
                f": {reason}" if self._login_token is not None else ""))
            return
        if user.max_connections and gate.connections[user.key] >= user.max_connections:
            gate.stats["connections_refused"] += 1
            log.warning("too_many_connections", session=self.sid, user=user.name,
                        limit=user.max_connections)
            self.send([AUTH_FAIL, errors.RATE_LIMITED,
                       f"user {user.name!r} has its {user.max_connections} connections"])
            self.flush()
            self.close_for_policy("too many connections for this user")
            return
        gate.connections[user.key] += 1
        self.user = user
        self._perms = user.permissions
        self._authenticated(user, name)
        self._watch_expiry(valid_for)

    def _refuse_auth(self, event: str, reason: str, told: str) -> None:
        """An AUTH refused: counted, logged as ``event``, answered AUTH_FAIL ``told``;
        after ``auth.max_failures`` of them the connection closes."""
        gate = self.node.gate
        self._auth_failures += 1
        gate.stats["auth_failures"] += 1
        log.info(event, session=self.sid, reason=reason, failures=self._auth_failures)
        self.send([AUTH_FAIL, errors.NOT_AUTHENTICATED, told])
        if self._auth_failures >= gate.max_failures:
            gate.stats["closed_after_auth_failures"] += 1
            self.flush()
            self.close_for_policy("too many failed AUTH attempts")

    def _watch_expiry(self, valid_for: float | None) -> None:
        """A token user's rights end when its token expires, ``valid_for`` seconds from
        now (``_token_expired``); None: they do not. A timer set for an earlier token
        of the session (a renewal) is void from now on."""
        self._expiry_timer += 1
        if valid_for is not None:
            timer = self._expiry_timer
            self.later(valid_for if valid_for > 0.0 else 0.0,
                       lambda: self._token_expired(timer))

    def rights_changed(self) -> None:
        """The node reloaded its users: from now on this session has the rights its user
        has now. A user (or the token it logged in with) no longer there keeps none.
        Names it may no longer provide are withdrawn (it is told, once); its calls in
        flight, both ways, finish."""
        old = self.user
        if old is None or not self.authenticated or self._rights_ended:
            return  # auth none, still logging in (that checks the new table), or expired
        self._set_rights(self.node.gate.now_for(old, self._login_token))

    def _token_expired(self, timer: int) -> None:
        """Its token's expiry (timed at login or renewal, as ``timer``): from now on the
        session may do nothing, and says so with NOT_AUTHENTICATED; what it provides is
        withdrawn, its calls in flight finish. The connection stays: the client may
        close it, or be closed by the node's other rules. The timer of a token renewed
        since does nothing."""
        user, gate = self.user, self.node.gate
        if (self.closed or user is None or self._rights_ended
                or timer != self._expiry_timer):
            return
        self._rights_ended = (f"the token of user {user.name!r} has expired: log in "
                              "again with a new token")
        gate.stats["tokens_expired"] += 1
        log.info("session_token_expired", session=self.sid, user=user.name)
        self.send([ERROR, None, errors.NOT_AUTHENTICATED, self._rights_ended])
        self._set_rights(None)

    def _set_rights(self, new: User | None) -> None:
        """Rights as ``new`` has them (None: none at all); names no longer allowed are
        withdrawn from what it provides (it is told, once)."""
        old = self.user
        assert old is not None
        perms = new.permissions if new is not None else Permissions((), ())
        if new is not None:
            self.user = new
        self._perms = perms
        self._limiter = self.node.gate.limiter_for(self.user)
        self._gated = True
        unheard = sorted(t for t in self.topics if not perms.may_subscribe(t))
        if unheard:
            self.node.events.unsubscribe(cast("Subscriber", self), unheard)  # a SessionRules
            self.send([ERROR, None, errors.PERMISSION_DENIED,
                       f"{self._who()} may no longer subscribe to {', '.join(unheard[:20])}"
                       + (f" and {len(unheard) - 20} more" if len(unheard) > 20 else "")])
        denied = sorted(n for n in self.provides if not perms.may_provide(n))
        if denied:
            before = len(self.provides)
            self.router.unprovide(cast("Provider", self), denied)  # a SessionRules
            self.node.gate.provided[old.key] -= before - len(self.provides)
            self.send([ERROR, None, errors.PERMISSION_DENIED,
                       f"{self._who()} may no longer provide {', '.join(denied[:20])}"
                       + (f" and {len(denied) - 20} more" if len(denied) > 20 else "")])
        if new is None or denied:
            log.info("session_rights_changed", session=self.sid, user=old.name,
                     revoked=new is None, withdrawn=len(denied))

    def _busy(self) -> None:
        self.logging_in = False
        if not self.closed:
            self.send([AUTH_FAIL, errors.BUSY, "the node is busy checking logins; retry"])

    def _authenticated(self, user: User | None, name: str | None,
                       claimed: str | None = None) -> None:
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
        # presence: the user (a token's sub), or with auth mode "none" who it says it is
        self.present_as = user.name if user is not None else claimed
        if self.present_as is not None:
            self.node.presence.login(self.present_as)
        self.node.gate.logged_in(self.address)
        self.logged_in()
        self.send([AUTH_OK, self._welcome()])
        if self.node.cut_off:  # the notice its peers had: move on if you know another node
            self.send(CUT_OFF_NOTICE)
            self.node.stats["clients_sent_elsewhere"] += 1

    def _welcome(self) -> dict[str, Any]:
        """AUTH_OK's fields: the session and the limits the client keeps to."""
        limits = self.node.config.limits
        return {
            "node": self.node.name,
            "session": self.sid,
            "user": self.user.name if self.user is not None else None,
            "protocol": PROTOCOL_VERSION,
            "max_frame": limits.max_frame_bytes,
            "max_frame_messages": limits.max_messages_per_frame,
            "max_inflight": limits.max_inflight_per_connection,
            "ack_timeout_ms": int(self.node.config.rpc.ack_timeout * 1000),
            "response_timeout_ms": int(self.node.config.rpc.response_timeout * 1000),
            "max_timeout_ms": int(self.node.config.rpc.max_timeout * 1000),
            "accept_upto": True,   # it takes ACCEPT_UPTO
            "sent": True,          # it takes SENT (frames' send times)
        }

    # -- a new token for the same user ---------------------------------------------------

    def reauth(self, params: dict[str, Any], now: float) -> None:
        """An AUTH on a session that logged in with a JWT: a new JWT for the same user,
        sent before or after the old one expires. Checked as at login; on AUTH_OK its
        rights and expiry are the new token's (names withdrawn at an expiry are not
        provided again: the client sends PROVIDE). A refusal is an AUTH_FAIL that
        changes nothing and counts toward ``auth.max_failures``. Any other AUTH on a
        logged-in session is INVALID_MESSAGE: a session's user never changes."""
        token = params.get("token")
        user = self.user
        if user is None or user.grant is None or not isinstance(token, str):
            self.invalid(None, "already authenticated (a session that logged in with a JWT "
                         "may send AUTH with a new JWT of the same user)", now)
            return
        if self.logging_in:
            self.invalid(None, "an AUTH of this connection is being checked: wait for its "
                         "answer", now)
            return
        self.logging_in = True
        self.check_login({"token": token}, self._renewed)

    def _renewed(self, new: User | None, reason: str, valid_for: float | None) -> None:
        if self.closed:
            return
        self.logging_in = False
        old, gate = self.user, self.node.gate
        assert old is not None
        if new is not None and (new.grant is None or new.name != old.name):
            reason, new = (f"the token is for user {new.name!r}: a session's user never "
                           "changes (connect again)"), None
        if new is None:
            self._refuse_auth("token_renewal_refused", reason, f"token not renewed: {reason}")
            return
        ended, self._rights_ended = self._rights_ended, ""
        self._set_rights(new)
        gate.stats["tokens_renewed"] += 1
        log.info("session_token_renewed", session=self.sid, user=new.name, after_expiry=bool(ended))
        self.send([AUTH_OK, self._welcome()])
        self._watch_expiry(valid_for)  # the new token's expiry, the old one's timer void

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
