"""The session rules (broker/session_rules.py ``SessionRules``) driven with examples: a
client's frames in, what it is answered out, with a real router and gate (auth mode
``none``: who the client says it is; with users, the test answers the logins) and no
socket."""

from collections import Counter

from rpcbus import errors
from rpcbus.broker.auth import Permissions, User
from rpcbus.broker.config import Config
from rpcbus.broker.events import Events
from rpcbus.broker.gate import Gate
from rpcbus.broker.presence import Presence
from rpcbus.broker.router import Router
from rpcbus.broker.session_rules import SessionRules
from rpcbus.broker.tokens import Grant
from rpcbus.protocol import (
    ACCEPT_UPTO,
    AUTH,
    AUTH_OK,
    ERROR,
    OK,
    PING,
    PONG,
    PROVIDE,
    REQUEST,
    RESPONSE,
    STREAM,
)


class Node:
    """What the rules read of their node (``NodeView``)."""

    def __init__(self) -> None:
        self.config = Config()
        self.config.auth.mode = "none"
        self.name = "n1"
        self.router = Router(ack_timeout=1.0, response_timeout=10.0, max_timeout=60.0,
                             now=0.0, initial_concurrency=1e9)
        self.gate = Gate(self.config)
        self.events = Events(1)
        self.presence = Presence()
        self.stats: Counter[str] = Counter()
        self.draining = False
        self.cut_off = False

    def notice_heard(self, session) -> None:
        pass

    def discover(self, name, may_call):
        return []

    def subscribed(self, session, ref, topics) -> None:
        session.send([OK, ref])


class Conn:
    """The shell's part, holding the rules (``core``): what goes out, and whether it was
    closed (1008) and why."""

    def __init__(self, node: Node, sid: str) -> None:
        self.out: list[list] = []
        self.closed_for: str | None = None
        self.core = SessionRules(node, sid, self)

    def send(self, msg) -> None:
        self.out.append(msg)

    def flush(self) -> None:
        pass

    def is_open(self) -> bool:
        return self.closed_for is None

    def close_for_policy(self, reason: str) -> None:
        self.closed_for = reason

    def later(self, delay, callback) -> None:
        raise AssertionError("auth mode none sets no timer")

    def logged_in(self) -> None:
        pass

    def check_login(self, params, done) -> None:
        raise AssertionError("auth mode none checks no login")

    def take(self) -> list[list]:
        out, self.out = self.out, []
        return out


def logged_in(node: Node, sid: str, name: str) -> Conn:
    conn = Conn(node, sid)
    conn.core.handle([[AUTH, {"name": name}]], 0.0)
    [[kind, welcome]] = conn.take()
    assert kind == AUTH_OK and welcome["session"] == sid and welcome["accept_upto"]
    return conn


def test_nothing_but_auth_is_taken_before_login_and_the_label_is_name_at_session():
    node = Node()
    conn = Conn(node, "s1")
    conn.core.handle([[REQUEST, 1, "f", None, None], [PING, 5]], 0.0)
    assert [msg[:3] for msg in conn.take()] == [[ERROR, 1, errors.NOT_AUTHENTICATED],
                                                [ERROR, 5, errors.NOT_AUTHENTICATED]]
    assert node.router.pending == 0
    conn.core.handle([[AUTH, {"name": "worker"}], [PING, 6]], 0.1)
    out = conn.take()
    assert out[0][0] == AUTH_OK and out[1:] == [[PONG, 6]]
    assert conn.core.label == "worker@s1" and conn.core.authenticated


def test_a_call_goes_from_one_session_through_the_router_to_another_and_back():
    node = Node()
    provider, caller = logged_in(node, "s1", "worker"), logged_in(node, "s2", "app")
    provider.core.handle([[PROVIDE, 1, ["f"]]], 0.1)
    assert provider.take() == [[OK, 1]]
    caller.core.handle([[REQUEST, 9, "f", "data", 500]], 0.2)
    [request] = provider.take()
    assert request[:6] == [REQUEST, request[1], "f", "data", request[4], "app@s2"]
    assert 0 < request[4] <= 500                       # the time its caller has left
    provider.core.handle([[ACCEPT_UPTO, request[1]], [RESPONSE, request[1], "answer"]], 0.3)
    assert caller.take() == [[RESPONSE, 9, "answer"]]
    assert node.router.pending == 0 and caller.core.inflight == 0


def test_bad_messages_get_an_error_each_and_too_many_close_the_connection():
    node = Node()
    conn = logged_in(node, "s1", "app")
    most = node.config.limits.max_invalid_messages
    conn.core.handle([[REQUEST, 1, "f", None, -5]], 1.0)  # a negative time left
    [error] = conn.take()
    assert error[:3] == [ERROR, 1, errors.INVALID_MESSAGE] and conn.is_open()
    conn.core.handle([["junk"]] * most, 1.1)               # within the window: one too many
    assert conn.closed_for is not None
    assert node.stats["invalid_messages"] == most + 1 and node.stats["closed_for_garbage"] == 1


def test_a_draining_node_refuses_new_calls_unrun_but_lets_answers_in():
    node = Node()
    provider, caller = logged_in(node, "s1", "worker"), logged_in(node, "s2", "app")
    provider.core.handle([[PROVIDE, 1, ["f"]]], 0.1)
    caller.core.handle([[REQUEST, 1, "f", "before", None]], 0.2)
    [request] = [msg for msg in provider.take() if msg[0] == REQUEST]
    node.draining = True
    caller.core.handle([[REQUEST, 2, "f", "after", None],
                   [STREAM, 3, "f", None, None, {"window": 4}]], 0.3)
    assert [msg[:3] for msg in caller.take()] == [[ERROR, 2, errors.SHUTTING_DOWN],
                                                  [ERROR, 3, errors.SHUTTING_DOWN]]
    provider.core.handle([[RESPONSE, request[1], "finished"]], 0.4)
    assert caller.take() == [[RESPONSE, 1, "finished"]]
    assert provider.take() == [] and node.router.pending == 0


class TokenConn(Conn):
    """A shell of a node with users: the test answers its logins and fires its timers."""

    def __init__(self, node: Node, sid: str) -> None:
        super().__init__(node, sid)
        self.logins: list = []   # each AUTH's ``done``, as the gate would call it
        self.timers: list = []   # (delay, callback)

    def later(self, delay, callback) -> None:
        self.timers.append((delay, callback))

    def check_login(self, params, done) -> None:
        self.logins.append(done)


def token_user(name: str) -> User:
    grant = Grant(user=name, expires=0.0, kid="k", issuer=None, audience=None, claims={})
    return User(name=name, password_hash=None, token_sha256=None,
                permissions=Permissions(("*",), ("*",)), max_connections=0,
                rate_messages=None, rate_bytes=None, grant=grant)


def test_a_token_s_rights_end_when_the_login_said_unless_a_renewal_moved_that():
    """How long a token stays valid comes with its login's answer (the rules read no
    clock): the timer set then ends the session's rights; a renewal's answer sets the
    new token's timer, sooner or later than the old one, and the old one does nothing."""
    node = Node()
    node.gate.mode = "users"
    conn = TokenConn(node, "s1")
    conn.core.handle([[AUTH, {"token": "first"}]], 0.0)
    conn.logins[0](token_user("relay"), "", 30.0)
    assert [msg[0] for msg in conn.take()] == [AUTH_OK]
    [(valid_for, first_expiry)] = conn.timers
    assert valid_for == 30.0
    conn.core.handle([[AUTH, {"token": "second"}]], 0.1)   # renewed: valid 10 s only
    conn.logins[1](token_user("relay"), "", 10.0)
    assert [msg[0] for msg in conn.take()] == [AUTH_OK]
    assert conn.timers[1][0] == 10.0
    first_expiry()                                          # the old token's: void
    conn.core.handle([[REQUEST, 1, "f", None, None]], 0.2)
    assert [msg[:3] for msg in conn.take()] == [[ERROR, 1, errors.NO_PROVIDER]]
    conn.timers[1][1]()                                     # the renewed token's
    [[kind, ref, code, reason]] = conn.take()
    assert (kind, ref, code) == (ERROR, None, errors.NOT_AUTHENTICATED), reason
    conn.core.handle([[REQUEST, 2, "f", None, None]], 0.3)
    assert [msg[:3] for msg in conn.take()] == [[ERROR, 2, errors.NOT_AUTHENTICATED]]
    conn.core.handle([[AUTH, {"token": "third"}]], 0.4)    # renewed after its expiry
    conn.logins[2](token_user("relay"), "", 5.0)
    assert [msg[0] for msg in conn.take()] == [AUTH_OK]
    conn.core.handle([[REQUEST, 3, "f", None, None]], 0.5)
    assert [msg[:3] for msg in conn.take()] == [[ERROR, 3, errors.NO_PROVIDER]]
    assert [delay for delay, _ in conn.timers] == [30.0, 10.0, 5.0]
