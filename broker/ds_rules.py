"""A deepstream client's conversation, as rpcbus's (pure): its messages become the
rpcbus messages a session's rules take (broker/session_rules.py), and what those rules
and the router send it become deepstream's. No asyncio, no sockets; the shell is
broker/ds_session.py.

The exchange (docs/deepstream.md): CONNECTION CHALLENGE is answered ACCEPT; AUTH
REQUEST (its JSON: ``username``/``user`` and ``password``, or ``token``) becomes
rpcbus's AUTH, so users, tokens, permissions and rate limits are rpcbus's. Then:

- as a caller, RPC REQUEST {name, correlationId, data} becomes a REQUEST with an id of
  the node's (``calls`` maps it back) and the ``[deepstream] response_timeout``
  deadline (the client sends none, and waits until the node answers: every REQUEST
  gets exactly one answer, ``outcome``);
- as a provider, PROVIDE {names} becomes one PROVIDE per name (acknowledged once all
  are answered; a refused name gets MESSAGE_DENIED); a call for it arrives as RPC
  REQUEST whose correlationId is the attempt's id, and its ACCEPT, RESPONSE,
  REQUEST_ERROR or REJECT go back by that id. An answer for an attempt it no longer
  holds (cancelled, timed out) is refused INVALID_RPC_CORRELATION_ID, as deepstream
  does;
- events: EVENT SUBSCRIBE and UNSUBSCRIBE {names} become one SUBSCRIBE or
  UNSUBSCRIBE per name (acknowledged once all are answered; a refused name gets
  MESSAGE_DENIED), EMIT {name, data} an EMIT; an event for it (EVENT) is written as
  EVENT EMIT. Its own events are not sent back to it (the client hands them to its
  own subscribers itself); a GAP has no word in deepstream's protocol and is counted
  (``deepstream_gaps``). A refused EMIT is not told to it (deepstream's clients send
  no id to tell it by); it is counted with the node's refusals.
- presence: QUERY_ALL and QUERY {names} become a PRESENCE_GET (answered
  QUERY_ALL_RESPONSE without the client's own user, as deepstream does, or
  QUERY_RESPONSE); SUBSCRIBE_ALL, UNSUBSCRIBE_ALL, SUBSCRIBE and UNSUBSCRIBE {names}
  a PRESENCE_SUBSCRIBE or PRESENCE_UNSUBSCRIBE (of everyone, or of the names), each
  acknowledged; a PRESENCE notice becomes JOIN_ALL / LEAVE_ALL for a client watching
  everyone and JOIN / LEAVE for one watching that user (never of its own user). A
  refusal is the topic's MESSAGE_DENIED.
- records and events' LISTEN are not served: each such message is answered with its
  topic's MESSAGE_DENIED, so the client's promise for it fails at once.

Data is JSON text on this side and MessagePack values on the other: JSON in is
parsed once (a value JSON cannot write — bytes, NaN, a map with keys that are not
strings or numbers — fails that answer with a REQUEST_ERROR saying so).
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any
from urllib.parse import unquote

from rpcbus import errors
from rpcbus.broker import ds_wire as w
from rpcbus.broker.ds_wire import DsMessage
from rpcbus.protocol import (
    ACCEPT,
    AUTH,
    AUTH_FAIL,
    AUTH_OK,
    CANCEL,
    DEFAULT_MAX_NAME,
    DRAIN_PING,
    EMIT,
    ERROR,
    EVENT,
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
    STREAM,
    SUBSCRIBE,
    UNPROVIDE,
    UNSUBSCRIBE,
    valid_name,
)

# where the conversation is
CHALLENGE = "challenge"    # its first message must be CONNECTION CHALLENGE
LOGIN = "login"            # an AUTH REQUEST next (again after a refusal)
CHECKING = "checking"      # its AUTH is being checked
OPEN = "open"              # logged in

#: The app code a deepstream provider's ``response.error(value)`` travels under as an
#: rpcbus application error (its value is the error's data).
REQUEST_ERROR = "REQUEST_ERROR"

# rpcbus outcomes a deepstream caller has a word of its own for; the rest arrive as
# REQUEST_ERROR with {code, message} (and an application error's data)
_DS_ERRORS = {
    errors.NO_PROVIDER: w.R_NO_RPC_PROVIDER,
    errors.RESPONSE_TIMEOUT: w.R_RESPONSE_TIMEOUT,
    errors.ACCEPT_TIMEOUT: w.R_ACCEPT_TIMEOUT,
    # it may have run, and deepstream's caller would have waited for its timeout: it gets
    # what it would have got, at once
    errors.PROVIDER_GONE: w.R_RESPONSE_TIMEOUT,
    errors.PERMISSION_DENIED: w.R_MESSAGE_DENIED,
    errors.NOT_AUTHENTICATED: w.R_MESSAGE_DENIED,
}

_to_json = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode
_from_json = json.loads


_PLAIN = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")
_PLAIN_AFTER = _PLAIN | frozenset(".:/-")


def rpc_name(name: str) -> str:
    """A deepstream RPC name as rpcbus's: each character rpcbus's names do not take there
    (a space, ``%``, a leading ``/``) as ``%XX`` of its UTF-8 bytes, so every name
    deepstream accepts is served and comes back as it was (``ds_name``)."""
    if name and name[0] in _PLAIN and _PLAIN_AFTER.issuperset(name):  # (a loop in C)
        return name
    return "".join(c if c in (_PLAIN_AFTER if i else _PLAIN) else
                   "".join(f"%{b:02X}" for b in c.encode("utf-8", "surrogatepass"))
                   for i, c in enumerate(name))


def ds_name(name: str) -> str:
    """An rpcbus name as a deepstream client sees it (``rpc_name`` undone)."""
    return unquote(name, errors="replace") if "%" in name else name


class _Bulk:
    """One PROVIDE or UNPROVIDE (RPC), SUBSCRIBE or UNSUBSCRIBE (EVENT) of several names:
    answered when each name's is."""

    __slots__ = ("topic", "action", "correlation_id", "waiting")

    def __init__(self, topic: int, action: int, correlation_id: str | None,
                 waiting: int) -> None:
        self.topic = topic
        self.action = action
        self.correlation_id = correlation_id
        self.waiting = waiting


class DeepstreamRules:
    """One deepstream client: ``inbound`` reads its messages, ``outbound`` writes rpcbus's
    to it. ``timeout_ms`` is the deadline its calls get, ``max_failures``
    ``auth.max_failures``, ``stats`` the node's counters (late answers, refused topics),
    ``max_name`` ``limits.max_name_length``.
    What ``outbound`` asks of the shell it leaves in ``refused`` (attempts whose data
    JSON cannot carry: the router ends them, not run), ``relogin`` (an AUTH answered
    BUSY: send ``login`` again), ``heard_drain`` and ``close_reason``."""

    def __init__(self, timeout_ms: int, max_failures: int, stats: Counter[str],
                 max_name: int = DEFAULT_MAX_NAME) -> None:
        self.stats = stats
        self.max_name = max_name
        self.phase = CHALLENGE
        self.timeout_ms = timeout_ms
        self.max_failures = max_failures
        self.calls: dict[int, tuple[str, str]] = {}   # our id -> (its correlationId, name)
        self._open: set[str] = set()                  # its correlationIds in flight
        self.attempts: dict[int, tuple[str, bool]] = {}  # at it: id -> (name, a stream)
        self._bulks: dict[int, tuple[_Bulk, str]] = {}   # PROVIDE ref -> (bulk, name)
        # presence: our ref -> (its action, its correlationId); what it watches
        self._presence: dict[int, tuple[int, str | None]] = {}
        self.presence_all = False
        self.presence_of: set[str] = set()
        self.user: str | None = None   # its user, as the node counts it (AUTH_OK, or login)
        self._seq = 0
        self.failures = 0
        self.login: dict[str, Any] = {}
        self.draining = False       # its node is stopping: close once it holds nothing
        self.refused: list[tuple[int, str]] = []
        self.relogin = False
        self.heard_drain = False
        self.close_reason = ""

    def idle(self) -> bool:
        """Nothing of its under way here: no call of its, no attempt at it."""
        return not self.calls and not self.attempts

    # -- its messages ---------------------------------------------------------------

    def inbound(self, m: DsMessage) -> tuple[list[list[Any]], list[DsMessage], str]:
        """Its message ``m``: (rpcbus messages for the session's rules, deepstream
        messages to send it, a problem to strike it for, or "")."""
        topic, action = m.topic, m.action
        if topic == w.T_RPC and self.phase == OPEN:
            return self._rpc(m)
        if topic == w.T_CONNECTION:
            if action == w.C_PING:
                if self.phase == OPEN:  # priced like rpcbus's PING (the rate limit)
                    return [[PING]], [], ""
                return [], [DsMessage(w.T_CONNECTION, w.C_PONG)], ""
            if action == w.C_PONG or action == w.C_CLOSING:
                return [], [], ""
            if action == w.C_CHALLENGE and self.phase == CHALLENGE:
                self.phase = LOGIN
                return [], [DsMessage(w.T_CONNECTION, w.C_ACCEPT)], ""
            return [], [], f"unexpected CONNECTION action {action}"
        if topic == w.T_AUTH:
            if action != w.A_REQUEST or self.phase != LOGIN:
                return [], [], ("CONNECTION CHALLENGE first" if self.phase == CHALLENGE
                                else f"AUTH action {action} while {self.phase}")
            login = _login(m.data)
            if login is None:
                return [], [DsMessage(w.T_AUTH, w.A_INVALID_MESSAGE_DATA,
                                      original_action=action)], \
                    "AUTH data must be a JSON object"
            self.phase = CHECKING
            self.login = login
            return [[AUTH, login]], [], ""
        if self.phase != OPEN:
            return [], [], f"{w.TOPIC_NAMES.get(topic, topic)} before login"
        if topic == w.T_EVENT and action in (w.E_EMIT, w.E_SUBSCRIBE, w.E_UNSUBSCRIBE):
            return self._event(m)
        if topic == w.T_PRESENCE and w.PR_QUERY_ALL <= action <= w.PR_UNSUBSCRIBE_ALL \
                and action not in _PRESENCE_NOTICES:
            return self._presence_asked(m)
        denied = w.MESSAGE_DENIED.get(topic)
        if denied is not None:  # records, events' LISTEN, ...: not served
            self.stats["deepstream_refused_topics"] += 1
            return [], [DsMessage(topic, denied, original_action=action, name=m.name,
                                  correlation_id=m.correlation_id,
                                  is_write_ack=m.is_write_ack, is_error=True)], ""
        return [], [], f"topic {w.TOPIC_NAMES.get(topic, topic)} is not served"

    def _rpc(self, m: DsMessage) -> tuple[list[list[Any]], list[DsMessage], str]:
        action, cid = m.action, m.correlation_id
        if action == w.R_REQUEST:
            name = m.name
            if not cid or len(cid) > 128 or not name:
                return [], [], "a REQUEST needs a name and a correlationId of 1-128 characters"
            if cid in self._open:
                return [], [], f"correlationId {cid[:64]!r} belongs to a call still in flight"
            try:
                data = None if m.data is None else _from_json(m.data)
            except (ValueError, RecursionError):
                return [], [self._answer_error(cid, name, errors.INVALID_MESSAGE,
                                               "the call's data is not JSON")], \
                    "a REQUEST's data is not JSON"
            self._seq += 1
            self.calls[self._seq] = (cid, name)
            self._open.add(cid)
            return [[REQUEST, self._seq, rpc_name(name), data, self.timeout_ms]], [], ""
        if action == w.R_ACCEPT or action == w.R_RESPONSE or action == w.R_REJECT \
                or action == w.R_REQUEST_ERROR:
            return self._answer(m)
        if action == w.R_PROVIDE or action == w.R_UNPROVIDE:
            names = m.names
            if not names:
                return [], [], "PROVIDE and UNPROVIDE need names"
            # a name deepstream takes travels as rpcbus's (``rpc_name``); one still not
            # valid (too long so) is refused here, like one the user may not provide: no
            # strike for what deepstream allows
            return self._bulk(m, PROVIDE if action == w.R_PROVIDE else UNPROVIDE)
        return [], [], f"unexpected RPC action {action}"

    def _bulk(self, m: DsMessage, kind: int) -> tuple[list[list[Any]], list[DsMessage], str]:
        """A PROVIDE, UNPROVIDE, SUBSCRIBE or UNSUBSCRIBE of ``m.names``: one rpcbus
        message (``kind``) per name, each answered on its own (``_bulk_answered``)."""
        topic, action, cid = m.topic, m.action, m.correlation_id
        good: list[str] = []
        replies = []
        for name in m.names:
            if type(name) is str and valid_name(rpc_name(name), self.max_name):
                good.append(name)
            else:
                replies.append(DsMessage(topic, w.MESSAGE_DENIED[topic],
                                         original_action=action, name=name,
                                         correlation_id=cid, is_error=True))
        bulk = _Bulk(topic, action, cid, len(good))
        if not good:
            return [], [*replies, DsMessage(topic, action, correlation_id=cid,
                                            is_ack=True)], ""
        msgs = []
        for name in good:
            self._seq += 1
            self._bulks[self._seq] = (bulk, name)
            msgs.append([kind, self._seq, [rpc_name(name)]])
        return msgs, replies, ""

    def _event(self, m: DsMessage) -> tuple[list[list[Any]], list[DsMessage], str]:
        """EVENT EMIT, SUBSCRIBE or UNSUBSCRIBE."""
        action = m.action
        if action != w.E_EMIT:
            if not m.names:
                return [], [], "SUBSCRIBE and UNSUBSCRIBE need names"
            return self._bulk(m, SUBSCRIBE if action == w.E_SUBSCRIBE else UNSUBSCRIBE)
        name = m.name
        if not name:
            return [], [], "an EMIT needs a name"
        topic = rpc_name(name)
        if not valid_name(topic, self.max_name):  # too long: nobody can subscribe to it
            return [], [DsMessage(w.T_EVENT, w.E_MESSAGE_DENIED, original_action=action,
                                  name=name, is_error=True)], ""
        try:
            data = None if m.data is None else _from_json(m.data)
        except (ValueError, RecursionError):
            return [], [], "an EMIT's data is not JSON"
        return [[EMIT, topic, data]], [], ""

    def _answer(self, m: DsMessage) -> tuple[list[list[Any]], list[DsMessage], str]:
        """A provider's ACCEPT, RESPONSE, REJECT or REQUEST_ERROR, by the attempt's id."""
        action, cid = m.action, m.correlation_id
        attempt = (int(cid) if cid is not None and cid.isascii() and cid.isdigit()
                   and len(cid) < 20 else -1)
        held = self.attempts.get(attempt)
        if held is None:
            self.stats["deepstream_late_answers"] += 1
            return [], [DsMessage(w.T_RPC, w.R_INVALID_RPC_CORRELATION_ID,
                                  original_action=action, name=m.name, correlation_id=cid,
                                  is_error=True)], ""
        if action == w.R_ACCEPT:
            return [[ACCEPT, attempt]], [], ""
        del self.attempts[attempt]
        if action == w.R_REJECT:
            return [[REJECT, attempt]], [], ""
        try:
            value = None if m.data is None else _from_json(m.data)
        except (ValueError, RecursionError):
            return [[ERROR, attempt, errors.PROVIDER_ERROR,
                     "the provider's answer is not JSON"]], [], ""
        if action == w.R_REQUEST_ERROR:
            text = value if type(value) is str else (m.data or "null")
            return [[ERROR, attempt, errors.APP_ERROR, text[:1024],
                     [REQUEST_ERROR, value]]], [], ""
        if held[1]:  # called as a stream: its one answer is the stream's one part
            return [[PART, attempt, value], [RESPONSE, attempt, None]], [], ""
        return [[RESPONSE, attempt, value]], [], ""

    def _presence_asked(self, m: DsMessage) -> tuple[list[list[Any]], list[DsMessage], str]:
        """PRESENCE QUERY_ALL, QUERY, (UN)SUBSCRIBE_ALL, (UN)SUBSCRIBE."""
        action, names = m.action, list(m.names)
        if action in (w.PR_QUERY, w.PR_SUBSCRIBE, w.PR_UNSUBSCRIBE) and not names:
            return [], [], f"PRESENCE action {action} needs names"
        users = None if action in (w.PR_QUERY_ALL, w.PR_SUBSCRIBE_ALL,
                                   w.PR_UNSUBSCRIBE_ALL) else names
        kind = (PRESENCE_GET if action in (w.PR_QUERY_ALL, w.PR_QUERY) else
                PRESENCE_SUBSCRIBE if action in (w.PR_SUBSCRIBE, w.PR_SUBSCRIBE_ALL)
                else PRESENCE_UNSUBSCRIBE)
        if action == w.PR_SUBSCRIBE_ALL:
            self.presence_all = True
        elif action == w.PR_UNSUBSCRIBE_ALL:
            self.presence_all = False
        elif action == w.PR_SUBSCRIBE:
            self.presence_of.update(names)
        elif action == w.PR_UNSUBSCRIBE:
            self.presence_of.difference_update(names)
        self._seq += 1
        self._presence[self._seq] = (action, m.correlation_id)
        return [[kind, self._seq, users]], [], ""

    def _presence_answered(self, ref: int, what: Any, code: str | None) -> list[DsMessage]:
        action, cid = self._presence.pop(ref)
        if code is not None:
            if action == w.PR_SUBSCRIBE:  # it watches none of them
                self.presence_of.clear()
            elif action == w.PR_SUBSCRIBE_ALL:
                self.presence_all = False
            return [DsMessage(w.T_PRESENCE, w.PR_MESSAGE_DENIED, original_action=action,
                              correlation_id=cid, is_error=True)]
        if action == w.PR_QUERY_ALL:
            return [DsMessage(w.T_PRESENCE, w.PR_QUERY_ALL_RESPONSE,
                              names=tuple(u for u in what if u != self.user))]
        if action == w.PR_QUERY:
            return [DsMessage(w.T_PRESENCE, w.PR_QUERY_RESPONSE, data=_to_json(what),
                              correlation_id=cid)]
        return [DsMessage(w.T_PRESENCE, action, correlation_id=cid, is_ack=True)]

    def _presence_notice(self, user: str, online: bool) -> list[DsMessage]:
        if user == self.user:  # deepstream tells a client nothing of its own user
            return []
        out = []
        if self.presence_all:
            out.append(DsMessage(w.T_PRESENCE, w.PR_JOIN_ALL if online else w.PR_LEAVE_ALL,
                                 name=user))
        if user in self.presence_of:
            out.append(DsMessage(w.T_PRESENCE, w.PR_JOIN if online else w.PR_LEAVE,
                                 name=user))
        return out

    # -- what it is sent -----------------------------------------------------------

    def outbound(self, msg: list[Any]) -> list[DsMessage]:
        """An rpcbus message for this client, as deepstream's (none, one or more)."""
        kind = msg[0]
        if kind == RESPONSE:
            held = self.calls.pop(msg[1], None)
            if held is None:
                return []
            self._open.discard(held[0])
            try:
                text = _to_json(msg[2])
            except (TypeError, ValueError, RecursionError) as exc:
                return [self._answer_error(held[0], held[1], errors.PROVIDER_ERROR,
                                           f"the answer cannot be written as JSON: {exc}")]
            return [DsMessage(w.T_RPC, w.R_RESPONSE, data=text, correlation_id=held[0],
                              name=held[1])]
        if kind == REQUEST or kind == STREAM:  # a call for it, as a provider
            return self._request(msg, kind == STREAM)
        if kind == ERROR:
            return self._error(msg)
        if kind == CANCEL:  # deepstream has no word for it: its later answer is refused
            self.attempts.pop(msg[1], None)
            return []
        if kind == EVENT:
            try:
                text = _to_json(msg[2])
            except (TypeError, ValueError, RecursionError):
                self.stats["deepstream_unwritable_events"] += 1  # JSON cannot carry it
                return []
            return [DsMessage(w.T_EVENT, w.E_EMIT, name=ds_name(msg[1]), data=text)]
        if kind == GAP:  # deepstream has no word for it
            self.stats["deepstream_gaps"] += 1
            return []
        if kind == PRESENCE:
            return self._presence_notice(msg[1], msg[2])
        if kind == FOUND or kind == OK:
            if msg[1] in self._presence:
                return self._presence_answered(msg[1], msg[2] if kind == FOUND else None, None)
            return self._bulk_answered(msg[1], None) if kind == OK else []
        if kind == PONG:
            return [DsMessage(w.T_CONNECTION, w.C_PONG)]
        if kind == AUTH_OK:
            self.phase = OPEN
            user = msg[1].get("user") if type(msg[1]) is dict else None
            self.user = user if user is not None else self.login.get("user")
            return [DsMessage(w.T_AUTH, w.A_AUTH_SUCCESSFUL)]
        if kind == AUTH_FAIL:
            return self._refused(msg[1], msg[2])
        if kind == PING and len(msg) > 1 and msg[1] == DRAIN_PING:
            self.heard_drain = True  # it cannot answer; what it sent before was read
        return []  # ACCEPT_UPTO, CREDIT, ...: nothing a deepstream client takes

    def _request(self, msg: list[Any], stream: bool) -> list[DsMessage]:
        attempt, name = msg[1], msg[2]
        try:
            text = _to_json(msg[3])
        except (TypeError, ValueError, RecursionError) as exc:
            self.refused.append((attempt, f"the call's data cannot be written as JSON for "
                                          f"a deepstream provider: {exc}"))
            return []
        name = ds_name(name)
        self.attempts[attempt] = (name, stream)
        user = msg[8] if len(msg) > 8 else None
        return [DsMessage(w.T_RPC, w.R_REQUEST, data=text, correlation_id=str(attempt),
                          name=name, requestor_name=user or msg[5])]

    def _error(self, msg: list[Any]) -> list[DsMessage]:
        ref, code, text = msg[1], msg[2], msg[3]
        if ref is None:  # a notice
            if code == errors.SHUTTING_DOWN:
                self.draining = True
            elif code == errors.NOT_AUTHENTICATED:  # its token expired: it cannot renew
                self.close_reason = "token expired"  # it; it logs in again to go on
            elif code == errors.INVALID_MESSAGE:
                return [DsMessage(w.T_PARSER, w.P_INVALID_MESSAGE, data=_to_json(text))]
            return []
        held = self.calls.pop(ref, None)
        if held is not None:
            self._open.discard(held[0])
            return [self._outcome(held[0], held[1], code, text,
                                  msg[4] if len(msg) > 4 else None)]
        if ref in self._bulks:
            return self._bulk_answered(ref, code)
        if ref in self._presence:
            return self._presence_answered(ref, None, code)
        return []

    def _outcome(self, cid: str, name: str, code: str, text: str,
                 detail: Any) -> DsMessage:
        """A failed call's one answer to its deepstream caller."""
        action = _DS_ERRORS.get(code)
        if action == w.R_MESSAGE_DENIED:
            return DsMessage(w.T_RPC, action, correlation_id=cid, name=name,
                             original_action=w.R_REQUEST, is_error=True)
        if action is not None:
            return DsMessage(w.T_RPC, action, correlation_id=cid, name=name)
        if code == errors.APP_ERROR and type(detail) is list and len(detail) == 2:
            app_code, data = detail
            value = (data if app_code == REQUEST_ERROR  # a deepstream provider's, as it was
                     else {"code": app_code, "message": text, "data": data})
            try:
                return DsMessage(w.T_RPC, w.R_REQUEST_ERROR, data=_to_json(value),
                                 correlation_id=cid, name=name)
            except (TypeError, ValueError, RecursionError):
                code = app_code  # its data cannot be JSON: its code and text only
        return self._answer_error(cid, name, code, text)

    @staticmethod
    def _answer_error(cid: str, name: str, code: str, text: str) -> DsMessage:
        return DsMessage(w.T_RPC, w.R_REQUEST_ERROR, correlation_id=cid, name=name,
                         data=_to_json({"code": code, "message": text}))

    def _bulk_answered(self, ref: int, code: str | None) -> list[DsMessage]:
        entry = self._bulks.pop(ref, None)
        if entry is None:
            return []
        bulk, name = entry
        bulk.waiting -= 1
        out = []
        if code is not None:
            out.append(DsMessage(bulk.topic, w.MESSAGE_DENIED[bulk.topic],
                                 original_action=bulk.action, name=name,
                                 correlation_id=bulk.correlation_id, is_error=True))
        if not bulk.waiting:
            out.append(DsMessage(bulk.topic, bulk.action, correlation_id=bulk.correlation_id,
                                 is_ack=True))
        return out

    def _refused(self, code: str, text: str) -> list[DsMessage]:
        """AUTH_FAIL: BUSY is sent again (``relogin``); a refusal is AUTH_UNSUCCESSFUL
        with the node's reason, and TOO_MANY_AUTH_ATTEMPTS with the last one allowed
        (the session's rules then close the connection)."""
        if code == errors.BUSY:
            self.relogin = True
            return []
        self.phase = LOGIN
        out = [DsMessage(w.T_AUTH, w.A_AUTH_UNSUCCESSFUL, data=_to_json(text))]
        if code == errors.NOT_AUTHENTICATED:
            self.failures += 1
            if self.failures >= self.max_failures:
                out.append(DsMessage(w.T_AUTH, w.A_TOO_MANY_AUTH_ATTEMPTS))
        return out


# what the node sends, never the client
_PRESENCE_NOTICES = frozenset((w.PR_QUERY_ALL_RESPONSE, w.PR_QUERY_RESPONSE, w.PR_JOIN,
                               w.PR_JOIN_ALL, w.PR_LEAVE, w.PR_LEAVE_ALL))


def _login(data: str | None) -> dict[str, Any] | None:
    """rpcbus's AUTH fields from deepstream's login data, or None when it is no object."""
    try:
        given = _from_json(data) if data is not None else {}
    except (ValueError, RecursionError):
        return None
    if type(given) is not dict:
        return None
    login: dict[str, Any] = {}
    user = given.get("username", given.get("user"))
    if user is not None:
        login["user"] = user
    for key in ("password", "token"):
        if key in given:
            login[key] = given[key]
    return login
