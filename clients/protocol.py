"""The client wire protocol: message kinds, frame codec and validation. Pure: no I/O.

A WebSocket binary frame holds msgpack: either one message or an array of
messages (so a busy connection sends many per frame). A message is an array
whose first element is its kind, a small integer. docs/protocol.md is the
public description; this module is the one implementation of it, used by the
SDK and by the broker alike.

Each message's fields are named once, in ``SHAPES`` below (docs/protocol.md's
table is checked against it by a test); the REQUEST a provider gets is read by
the ``REQ_*`` positions.
"""

from __future__ import annotations

import re
from typing import Any, Callable

import msgpack

from rpcbus.errors import APP_ERROR, MAX_APP_CODE

PROTOCOL_VERSION = 1

AUTH = 1
AUTH_OK = 2
AUTH_FAIL = 3
PROVIDE = 4
UNPROVIDE = 5
OK = 6
REQUEST = 16
ACCEPT = 17
RESPONSE = 18
REJECT = 19
ERROR = 20
CANCEL = 21
# provider -> node, [22, id]: every REQUEST (or STREAM) of this connection up to ``id``
# that the provider did not REJECT is accepted (one message for a frame's ACCEPTs)
ACCEPT_UPTO = 22
# A stream: a call answered in parts. STREAM opens it (a REQUEST with a credit window),
# PARTs carry its answer in order, RESPONSE (data nil) ends it cleanly, ERROR with an
# error; CREDIT says how many parts the caller has read in all: the provider may send up
# to the window beyond that (flow control).
STREAM = 23
PART = 24
CREDIT = 25
#: The most parts a caller may let a stream's provider send ahead of its reading.
MAX_WINDOW = 1024
# call_all: ALL asks every provider of a name; a REPLY comes from each (its provider, its
# node, and its answer or error); RESPONSE (the number of replies) ends it
ALL = 26
REPLY = 27
# discovery: DISCOVER asks what the cluster provides (every name, or one name's
# providers), FOUND answers (docs/protocol.md, "Discovery")
DISCOVER = 28
FOUND = 29
PING = 30
PONG = 31
# events (docs/events.md): SUBSCRIBE and UNSUBSCRIBE a connection to topics (answered OK),
# EMIT to a topic (no answer: at most once), EVENT to each subscriber of it, on any node
# (with the process it was emitted on and its number there, to a client whose AUTH said
# event_origins: it drops one it had already, after a move);
# GAP tells a subscriber how many events of a topic it lost (it read too slowly), or with
# topic and count nil that its node lost the cluster bus (events from elsewhere are lost)
SUBSCRIBE = 32
UNSUBSCRIBE = 33
EMIT = 34
EVENT = 35
GAP = 36
# presence (docs/events.md): who is logged in across the cluster. PRESENCE_GET asks (every
# user online, or whether each of some users is; answered FOUND), PRESENCE_SUBSCRIBE and
# PRESENCE_UNSUBSCRIBE start and stop PRESENCE notices (of everyone, or of some users):
# a user came online anywhere, or left everywhere
PRESENCE_GET = 37
PRESENCE_SUBSCRIBE = 38
PRESENCE_UNSUBSCRIBE = 39
PRESENCE = 40
# client -> node, [41, ms]: the frame's first call was made at ``ms`` on the client's own
# clock (its first message, in frames with calls, to a node whose AUTH_OK says ``sent``):
# the node learns the least (read - sent) of the connection and takes a frame read later
# than that as having waited, off its calls' time left
SENT = 41
#: Longest user name presence takes (a token's ``sub`` is at most this long too).
MAX_USER = 128

# Node-internal, never on a wire: the router asks a peer that stands for another node
# whether it started an attempt (rpcbus.cluster.peers turns it into a bus CHECK).
ACK_CHECK = -27

#: Each message's fields after its kind, by kind and direction, as docs/protocol.md's
#: table writes them (``?``: may be left out at the end; ``{...}``: a map; ``[...]``: an
#: array).
SHAPES: dict[tuple[int, str], tuple[str, ...]] = {
    (AUTH, "client → node"): (
        "{user?, password?, token?, name?, protocol: 1, event_origins?}",),
    (AUTH_OK, "node → client"): (
        "{node, session, user, protocol, max_frame, max_frame_messages, max_inflight, "
        "ack_timeout_ms, response_timeout_ms, max_timeout_ms, accept_upto, sent}",),
    (AUTH_FAIL, "node → client"): ("code", "message"),
    (PROVIDE, "client → node"): ("ref", "[name, ...]"),
    (UNPROVIDE, "client → node"): ("ref", "[name, ...]"),
    (OK, "node → client"): ("ref",),
    (REQUEST, "caller → node"): ("cid", "name", "data", "timeout_ms or nil",
                                 "{traceparent}?"),
    (REQUEST, "node → provider"): ("id", "name", "data", "time_left_ms", "caller",
                                   "sent_ms", "traceparent?", "user?", "nil?", "ack_ms?"),
    (STREAM, "caller → node"): ("cid", "name", "data", "timeout_ms or nil",
                                "{window, traceparent?}"),
    (STREAM, "node → provider"): ("id", "name", "data", "time_left_ms", "caller",
                                  "sent_ms", "traceparent", "user", "window", "ack_ms?"),
    (PART, "provider → node"): ("id", "data"),
    (PART, "node → caller"): ("cid", "data"),
    (CREDIT, "caller → node"): ("cid", "read"),
    (CREDIT, "node → provider"): ("id", "read"),
    (ALL, "caller → node"): ("cid", "name", "data", "timeout_ms or nil",
                             "{max_replies?, traceparent?}?"),
    (REPLY, "node → caller"): ("cid", "provider", "node", "data", "[code, message, detail?]?"),
    (DISCOVER, "client → node"): ("ref", "name or nil"),
    (FOUND, "node → client"): ("ref", "what"),
    (ACCEPT, "provider → node"): ("id",),
    (ACCEPT_UPTO, "provider → node"): ("id",),
    (RESPONSE, "provider → node"): ("id", "data"),
    (RESPONSE, "node → caller"): ("cid", "data"),
    (REJECT, "provider → node"): ("id", "reason?"),
    (ERROR, "provider → node"): ("id", "code", "message", "[app_code, data]?"),
    (ERROR, "node → client"): ("ref or nil", "code", "message", "[app_code, data]?"),
    (CANCEL, "node → provider"): ("id",),
    (CANCEL, "caller → node"): ("cid",),
    (SUBSCRIBE, "client → node"): ("ref", "[topic, ...]"),
    (UNSUBSCRIBE, "client → node"): ("ref", "[topic, ...]"),
    (EMIT, "client → node"): ("topic", "data"),
    (EVENT, "node → client"): ("topic", "data", "origin?", "seq?"),
    (GAP, "node → client"): ("topic or nil", "count or nil"),
    (PRESENCE_GET, "client → node"): ("ref", "[user, ...] or nil"),
    (PRESENCE_SUBSCRIBE, "client → node"): ("ref", "[user, ...] or nil"),
    (PRESENCE_UNSUBSCRIBE, "client → node"): ("ref", "[user, ...] or nil"),
    (PRESENCE, "node → client"): ("user", "online"),
    (SENT, "client → node"): ("ms",),
    (PING, "either way"): ("payload?",),
    (PONG, "either way"): ("payload",),
}

# Positions in a REQUEST or STREAM sent to a provider (SHAPES[REQUEST, "node → provider"];
# a STREAM always has every field through its window; ``ack_ms``, last, only when the
# attempt's ack window is over the ``ack_timeout_ms`` AUTH_OK gave)
REQ_ID, REQ_NAME, REQ_DATA, REQ_TIME_LEFT_MS, REQ_CALLER, REQ_SENT_MS, REQ_TRACEPARENT, \
    REQ_USER, REQ_WINDOW, REQ_ACK_MS = range(1, 11)
# REJECT's reasons: full now (the node may send it again later); read after the ack window
REJECT_BUSY, REJECT_LATE = "BUSY", "LATE"

KIND_NAMES = {
    AUTH: "AUTH",
    AUTH_OK: "AUTH_OK",
    AUTH_FAIL: "AUTH_FAIL",
    PROVIDE: "PROVIDE",
    UNPROVIDE: "UNPROVIDE",
    OK: "OK",
    REQUEST: "REQUEST",
    ACCEPT: "ACCEPT",
    RESPONSE: "RESPONSE",
    REJECT: "REJECT",
    ERROR: "ERROR",
    CANCEL: "CANCEL",
    ACCEPT_UPTO: "ACCEPT_UPTO",
    STREAM: "STREAM",
    PART: "PART",
    CREDIT: "CREDIT",
    ALL: "ALL",
    REPLY: "REPLY",
    DISCOVER: "DISCOVER",
    FOUND: "FOUND",
    PING: "PING",
    PONG: "PONG",
    SUBSCRIBE: "SUBSCRIBE",
    UNSUBSCRIBE: "UNSUBSCRIBE",
    EMIT: "EMIT",
    EVENT: "EVENT",
    GAP: "GAP",
    PRESENCE_GET: "PRESENCE_GET",
    PRESENCE_SUBSCRIBE: "PRESENCE_SUBSCRIBE",
    PRESENCE_UNSUBSCRIBE: "PRESENCE_UNSUBSCRIBE",
    PRESENCE: "PRESENCE",
    SENT: "SENT",
}

#: Largest id or call id on the wire (msgpack uint64).
MAX_ID = 2**64 - 1
#: RPC names: a letter, digit or underscore first, then also ``. : / -``; anything else
#: as ``%XX`` (uppercase hex) of its UTF-8 bytes, as deepstream's names with a space come
#: (broker/ds_rules.py: ``user/get profile`` is ``user/get%20profile``).
NAME_PATTERN = re.compile(r"(?:[A-Za-z0-9_]|%[0-9A-F]{2})(?:[A-Za-z0-9_.:/\-]|%[0-9A-F]{2})*")
DEFAULT_MAX_NAME = 128
#: Longest error message a peer may send; longer ones are cut, not refused.
MAX_ERROR_MESSAGE = 4096

#: The payload of the PING a draining node sends after its SHUTTING_DOWN notice: the
#: client's PONG tells it that everything the client sent before is read.
DRAIN_PING = "rpcbus-draining"
#: Most messages in one frame (a node may say fewer in AUTH_OK ``max_frame_messages``).
MAX_FRAME_MESSAGES = 10_000


class ProtocolError(ValueError):
    """A frame or message that does not follow the protocol; the text says why."""


_packb: Callable[[Any], bytes] = msgpack.packb  # (msgpack has no type hints)
_unpackb = msgpack.unpackb


def encode(messages: list[list[Any]]) -> bytes:
    """One frame for a non-empty list of messages.

    Raises TypeError (from msgpack) when a message holds a value msgpack
    cannot encode; the caller decides what to do with the batch.
    """
    if len(messages) == 1:
        return _packb(messages[0])
    return _packb(messages)


def decode(frame: bytes | bytearray | memoryview, max_messages: int = 0) -> list[list[Any]]:
    """The messages of one frame, as lists; raises ProtocolError on anything else.

    Only the outer shape is checked here (a message is a non-empty array
    starting with an integer kind); fields are checked by ``check_from_client``
    or by the SDK where they are used. With ``max_messages``, a frame whose outer
    array is longer is refused from its header, before anything is decoded.
    """
    if max_messages and frame[:1] in (b"\xdc", b"\xdd"):  # array 16 / array 32
        count = int.from_bytes(frame[1:3] if frame[0] == 0xdc else frame[1:5], "big")
        if count > max_messages:
            raise ProtocolError(f"at most {max_messages} messages per frame ({count} sent)")
    try:
        obj = _unpackb(frame, strict_map_key=False)
    except Exception as exc:  # msgpack raises several types; all mean "not msgpack"
        raise ProtocolError(f"frame is not valid msgpack ({type(exc).__name__})") from None
    if type(obj) is not list or not obj:
        raise ProtocolError("frame must be a message or a non-empty array of messages")
    if type(obj[0]) is int:
        return [obj]
    for msg in obj:
        if type(msg) is not list or not msg or type(msg[0]) is not int:
            raise ProtocolError("every message must be an array starting with its kind")
    return obj


def decode_each(frame: bytes | bytearray | memoryview) -> tuple[list[list[Any]], int]:
    """The messages of one frame that decode, and how many did not: one bad message (a map
    key msgpack will not build, bytes that are not msgpack) costs only itself, never the
    others the node batched with it. The whole frame is decoded at once first; only a
    frame that fails is taken apart message by message."""
    try:
        return decode(frame), 0
    except ProtocolError:
        pass
    data = bytes(frame)
    unpacker = msgpack.Unpacker(strict_map_key=False, max_buffer_size=max(len(data), 1))
    unpacker.feed(data)
    try:
        count = unpacker.read_array_header()
        start = unpacker.tell()
        if data[start:start + 1] and not 0x90 <= data[start] <= 0x9F \
                and data[start] not in (0xDC, 0xDD):
            return [], 1  # a frame of one message (its first field is not an array)
    except Exception:  # not even an array: one bad message
        return [], 1
    msgs: list[list[Any]] = []
    for i in range(count):
        try:
            unpacker.skip()
        except Exception:  # no message boundary after this: the rest is lost
            return msgs, count - i
        end = unpacker.tell()
        try:
            msg = _unpackb(data[start:end], strict_map_key=False)
        except Exception:  # msgpack raises several types; this message only is bad
            msg = None
        if type(msg) is list and msg and type(msg[0]) is int:
            msgs.append(msg)
        start = end
    return msgs, count - len(msgs)


def valid_name(name: Any, max_len: int = DEFAULT_MAX_NAME) -> bool:
    """True for a usable RPC name (see NAME_PATTERN), at most ``max_len`` characters."""
    return (
        type(name) is str
        and 0 < len(name) <= max_len
        and NAME_PATTERN.fullmatch(name) is not None
    )


def is_id(value: Any) -> bool:
    """True for a usable id on the wire: an unsigned 64-bit integer."""
    return type(value) is int and 0 <= value <= MAX_ID


def _names_problem(names: Any, max_len: int, max_names: int,
                   what: str = "rpc name") -> str | None:
    if type(names) is not list or not names:
        return "names must be a non-empty array of strings"
    if len(names) > max_names:
        return f"at most {max_names} names per message"
    for name in names:
        if not valid_name(name, max_len):
            return f"invalid {what} {str(name)[:64]!r}: 1-{max_len} of A-Z a-z 0-9 _ . : / -"
    return None


def check_from_client(msg: list[Any], max_name: int = DEFAULT_MAX_NAME,
                      max_names: int = 1000) -> str | None:
    """Why a message a client sent to the node is malformed, or None when it is fine.

    The REQUEST name is only checked for type and length here; the router looks
    names up first and runs the full pattern check only on a miss.
    """
    kind = msg[0]
    n = len(msg)
    if kind == REQUEST or kind == STREAM or kind == ALL:
        what = KIND_NAMES[kind]
        if kind != STREAM and n != 5 and n != 6:
            return f"{what} takes [{kind}, cid, name, data, timeout_ms|nil, {{meta}}?]"
        if kind == STREAM and n != 6:
            return "STREAM takes [23, cid, name, data, timeout_ms|nil, {window, traceparent?}]"
        if not is_id(msg[1]):
            return f"{what} cid must be an unsigned integer"
        name = msg[2]
        if type(name) is not str or not 0 < len(name) <= max_name:
            return f"{what} name must be a string of 1-{max_name} characters"
        timeout = msg[4]
        if timeout is not None and (type(timeout) is not int or timeout <= 0):
            return f"{what} timeout_ms must be a positive integer or nil"
        if n == 6:
            meta = msg[5]
            if type(meta) is not dict:
                return f"{what} meta must be a map"
            trace = meta.get("traceparent")
            if trace is not None and (type(trace) is not str or not 0 < len(trace) <= 256):
                return f"{what} traceparent must be a string of 1-256 characters"
            if kind == STREAM:
                window = meta.get("window")
                if type(window) is not int or not 0 < window <= MAX_WINDOW:
                    return f"STREAM window must be an integer of 1-{MAX_WINDOW}"
            most = meta.get("max_replies") if kind == ALL else None
            if most is not None and (type(most) is not int or most < 1):
                return "ALL max_replies must be a positive integer"
        return None
    if kind == RESPONSE or kind == PART:
        if n != 3 or not is_id(msg[1]):
            return f"{KIND_NAMES[kind]} takes [{kind}, id, data]"
        return None
    if kind == CREDIT:
        if n != 3 or not is_id(msg[1]) or not is_id(msg[2]) or not msg[2]:
            return "CREDIT takes [25, cid, read], read the parts read in all (1 or more)"
        return None
    if kind == REJECT and n == 3:
        if not is_id(msg[1]) or msg[2] not in (REJECT_BUSY, REJECT_LATE):
            return f"REJECT takes [19, id] or [19, id, reason], reason {REJECT_BUSY} or " \
                   f"{REJECT_LATE}"
        return None
    if kind == SENT:
        if n != 2 or not is_id(msg[1]):
            return "SENT takes [41, ms], ms an unsigned integer"
        return None
    if kind == ACCEPT or kind == REJECT or kind == CANCEL or kind == ACCEPT_UPTO:
        if n != 2 or not is_id(msg[1]):
            return f"{KIND_NAMES[kind]} takes [{kind}, id]"
        return None
    if kind == ERROR:
        if not 4 <= n <= 5 or not is_id(msg[1]) or type(msg[2]) is not str \
                or type(msg[3]) is not str:
            return "ERROR takes [20, id, code, message] or [20, id, \"APP_ERROR\", " \
                   "message, [app_code, data]]"
        if n == 5:
            detail = msg[4]
            if msg[2] != APP_ERROR or type(detail) is not list or len(detail) != 2 \
                    or type(detail[0]) is not str or not 0 < len(detail[0]) <= MAX_APP_CODE:
                return "ERROR's fifth field is [app_code, data], only with code APP_ERROR; " \
                       f"app_code a string of 1-{MAX_APP_CODE} characters"
        return None
    if kind == PROVIDE or kind == UNPROVIDE:
        if n != 3 or not is_id(msg[1]):
            return f"{KIND_NAMES[kind]} takes [{kind}, ref, [name, ...]]"
        return _names_problem(msg[2], max_name, max_names)
    if kind == SUBSCRIBE or kind == UNSUBSCRIBE:
        if n != 3 or not is_id(msg[1]):
            return f"{KIND_NAMES[kind]} takes [{kind}, ref, [topic, ...]]"
        return _names_problem(msg[2], max_name, max_names, "topic")
    if kind == EMIT:
        if n != 3 or not valid_name(msg[1], max_name):
            return (f"EMIT takes [34, topic, data], a topic of 1-{max_name} of "
                    "A-Z a-z 0-9 _ . : / -")
        return None
    if kind == PRESENCE_GET or kind == PRESENCE_SUBSCRIBE or kind == PRESENCE_UNSUBSCRIBE:
        users = msg[2] if n == 3 else None
        if n != 3 or not is_id(msg[1]) or (users is not None and (
                type(users) is not list or not users or len(users) > max_names
                or not all(type(u) is str and 0 < len(u) <= MAX_USER for u in users))):
            return (f"{KIND_NAMES[kind]} takes [{kind}, ref, [user, ...] or nil]: at most "
                    f"{max_names} users of 1-{MAX_USER} characters")
        return None
    if kind == DISCOVER:
        if n != 3 or not is_id(msg[1]) or (msg[2] is not None
                                           and not valid_name(msg[2], max_name)):
            return (f"DISCOVER takes [28, ref, name or nil], an rpc name of 1-{max_name} of "
                    "A-Z a-z 0-9 _ . : / -")
        return None
    if kind == PING or kind == PONG:
        if n > 2:
            return f"{KIND_NAMES[kind]} takes [{kind}] or [{kind}, payload]"
        return None
    if kind == AUTH:
        if n != 2 or type(msg[1]) is not dict:
            return "AUTH takes [1, {user, password, token, name, protocol}]"
        return None
    if kind in KIND_NAMES:
        return f"{KIND_NAMES[kind]} is not sent by clients"
    return f"unknown message kind {kind}"
