"""deepstream's binary protocol, as ``@deepstream/client`` 7 speaks it: frames in and out.
Pure: bytes in, ``DsMessage`` out, and back.

A binary WebSocket frame holds protobuf: a varint length, then the envelope
``Message { TOPIC topic = 2; bytes message = 3; }`` whose ``message`` is the topic's
own message (``RpcMessage``, ``ConnectionMessage``, ...). The client reads only the
first envelope of a frame, so the node sends one message per frame; it reads every
envelope a frame holds (up to a bound). Payloads (``data``) are JSON text.

``@deepstream/protobuf`` ships generated JavaScript, no .proto: the field numbers
and types below are read off its encoders (1.0.9), and only the fields the node
uses are named; others are skipped when read. Every message is one ``DsMessage``,
built with the fields it has, never changed after.
"""

from __future__ import annotations

from typing import Any, NamedTuple

# -- topics and actions (@deepstream/protobuf types/*.ts) --------------------------------

T_PARSER = 1
T_CONNECTION = 2
T_AUTH = 3
T_EVENT = 4
T_RECORD = 5
T_RPC = 6
T_PRESENCE = 7
T_MONITORING = 8
T_LOCK = 10
TOPIC_NAMES = {T_PARSER: "PARSER", T_CONNECTION: "CONNECTION", T_AUTH: "AUTH",
               T_EVENT: "EVENT", T_RECORD: "RECORD", T_RPC: "RPC", T_PRESENCE: "PRESENCE",
               T_MONITORING: "MONITORING", 9: "CLUSTER", T_LOCK: "LOCK",
               11: "STATE_REGISTRY"}

# CONNECTION
C_PING = 2
C_PONG = 3
C_ACCEPT = 4
C_CHALLENGE = 5
C_REJECT = 6
C_REDIRECT = 7
C_CLOSING = 8
C_CLOSED = 9
C_AUTHENTICATION_TIMEOUT = 100
C_INVALID_MESSAGE = 101

# AUTH
A_REQUEST = 2
A_AUTH_SUCCESSFUL = 3
A_AUTH_UNSUCCESSFUL = 4
A_TOO_MANY_AUTH_ATTEMPTS = 100
A_INVALID_MESSAGE = 101
A_INVALID_MESSAGE_DATA = 102

# PARSER
P_UNKNOWN_TOPIC = 1
P_UNKNOWN_ACTION = 2
P_INVALID_MESSAGE = 3
P_MESSAGE_PARSE_ERROR = 4
P_MAXIMUM_MESSAGE_SIZE_EXCEEDED = 5

# RPC
R_REQUEST = 2
R_ACCEPT = 4
R_RESPONSE = 5
R_REJECT = 6
R_REQUEST_ERROR = 7
R_PROVIDE = 8
R_UNPROVIDE = 9
R_NO_RPC_PROVIDER = 100
R_ACCEPT_TIMEOUT = 101
R_INVALID_RPC_CORRELATION_ID = 103
R_RESPONSE_TIMEOUT = 104
R_MESSAGE_PERMISSION_ERROR = 106
R_MESSAGE_DENIED = 107
R_INVALID_MESSAGE_DATA = 108
RPC_ACTION_NAMES = {1: "ERROR", R_REQUEST: "REQUEST", R_ACCEPT: "ACCEPT",
                    R_RESPONSE: "RESPONSE", R_REJECT: "REJECT",
                    R_REQUEST_ERROR: "REQUEST_ERROR", R_PROVIDE: "PROVIDE",
                    R_UNPROVIDE: "UNPROVIDE", R_NO_RPC_PROVIDER: "NO_RPC_PROVIDER",
                    R_ACCEPT_TIMEOUT: "ACCEPT_TIMEOUT", 102: "MULTIPLE_ACCEPT",
                    R_INVALID_RPC_CORRELATION_ID: "INVALID_RPC_CORRELATION_ID",
                    R_RESPONSE_TIMEOUT: "RESPONSE_TIMEOUT", 105: "MULTIPLE_RESPONSE",
                    R_MESSAGE_PERMISSION_ERROR: "MESSAGE_PERMISSION_ERROR",
                    R_MESSAGE_DENIED: "MESSAGE_DENIED",
                    R_INVALID_MESSAGE_DATA: "INVALID_MESSAGE_DATA"}

# EVENT
E_EMIT = 2
E_SUBSCRIBE = 3
E_UNSUBSCRIBE = 4
E_MESSAGE_DENIED = 104

# PRESENCE
PR_QUERY_ALL = 2
PR_QUERY_ALL_RESPONSE = 3
PR_QUERY = 4
PR_QUERY_RESPONSE = 5
PR_JOIN = 6
PR_JOIN_ALL = 7
PR_LEAVE = 8
PR_LEAVE_ALL = 9
PR_SUBSCRIBE = 10
PR_UNSUBSCRIBE = 11
PR_SUBSCRIBE_ALL = 12
PR_UNSUBSCRIBE_ALL = 13
PR_MESSAGE_DENIED = 102

# each topic's MESSAGE_DENIED action: a request refused (the node refuses records whole,
# and events' LISTEN): each client handler fails the request it answers
# at once with it
MESSAGE_DENIED = {T_RECORD: 115, T_EVENT: E_MESSAGE_DENIED, T_PRESENCE: PR_MESSAGE_DENIED,
                  T_RPC: R_MESSAGE_DENIED}


class DsMessage(NamedTuple):
    """One deepstream message; a field the message does not carry is None (or empty)."""

    topic: int
    action: int
    data: str | None = None             # JSON text
    correlation_id: str | None = None
    name: str | None = None
    names: tuple[str, ...] = ()
    is_ack: bool = False
    is_error: bool = False
    original_action: int | None = None
    requestor_name: str | None = None
    url: str | None = None
    protocol_version: str | None = None
    sdk_type: str | None = None
    sdk_version: str | None = None
    is_write_ack: bool = False


class DsProtocolError(ValueError):
    """A frame that is not deepstream's protobuf; the text says where."""


class TooManyMessages(DsProtocolError):
    """A frame with more messages than ``decode`` was allowed to read (the rest unread)."""


_INT, _BOOL, _STR, _STRS = range(4)

# per topic: field number -> (DsMessage field, kind); fields not listed are skipped
_FIELDS: dict[int, dict[int, tuple[str, int]]] = {
    T_CONNECTION: {1: ("action", _INT), 2: ("data", _STR), 3: ("is_error", _BOOL),
                   4: ("is_ack", _BOOL), 5: ("url", _STR), 6: ("protocol_version", _STR),
                   7: ("sdk_version", _STR), 8: ("sdk_type", _STR)},
    T_AUTH: {1: ("action", _INT), 2: ("data", _STR), 3: ("is_error", _BOOL),
             4: ("is_ack", _BOOL)},
    T_PARSER: {1: ("action", _INT), 2: ("data", _STR), 9: ("original_action", _INT)},
    T_RPC: {1: ("action", _INT), 2: ("data", _STR), 3: ("correlation_id", _STR),
            4: ("is_error", _BOOL), 5: ("is_ack", _BOOL), 6: ("names", _STRS),
            7: ("name", _STR), 9: ("original_action", _INT), 10: ("requestor_name", _STR)},
    T_EVENT: {1: ("action", _INT), 2: ("data", _STR), 3: ("correlation_id", _STR),
              4: ("is_error", _BOOL), 5: ("is_ack", _BOOL), 6: ("name", _STR),
              7: ("names", _STRS), 11: ("original_action", _INT)},
    T_RECORD: {1: ("action", _INT), 2: ("data", _STR), 3: ("correlation_id", _STR),
               4: ("is_error", _BOOL), 5: ("is_ack", _BOOL), 6: ("name", _STR),
               7: ("names", _STRS), 10: ("original_action", _INT),
               11: ("is_write_ack", _BOOL)},
    T_PRESENCE: {1: ("action", _INT), 3: ("original_action", _INT), 4: ("data", _STR),
                 5: ("correlation_id", _STR), 6: ("is_error", _BOOL), 7: ("is_ack", _BOOL),
                 8: ("name", _STR), 9: ("names", _STRS)},
    T_MONITORING: {1: ("action", _INT), 2: ("data", _STR), 3: ("correlation_id", _STR),
                   4: ("is_error", _BOOL), 5: ("is_ack", _BOOL)},
    T_LOCK: {1: ("action", _INT)},
}
_DEFAULTS = DsMessage(0, 0)
_BLANK = list(_DEFAULTS)  # a message's fields as ``_envelope`` starts reading them
# per topic, for writing: (a field's place in a DsMessage, its key byte, its kind), in
# the order of the field numbers (as protobufjs writes them)
_WRITE: dict[int, list[tuple[int, bytes, int]]] = {
    topic: [(DsMessage._fields.index(attr), bytes(((num << 3) | (2 if kind >= _STR else 0),)),
             kind) for num, (attr, kind) in sorted(numbered.items())]
    for topic, numbered in _FIELDS.items()}
_NAMES = DsMessage._fields.index("names")
# per topic: a field's key (its number and wire type, as it is read) -> (its place in a
# DsMessage, its kind); a field of the right number but another wire type is skipped
_SLOTS: dict[int, dict[int, tuple[int, int]]] = {
    topic: {(num << 3) | (2 if kind >= _STR else 0): (DsMessage._fields.index(attr), kind)
            for num, (attr, kind) in numbered.items()}
    for topic, numbered in _FIELDS.items()}


_BYTE = [bytes((i,)) for i in range(0x80)]  # a varint under 0x80 is its one byte
# the envelope's start: its topic (field 2) and the key of the topic's message (field 3)
_HEADS = {topic: b"\x10" + _BYTE[topic] + b"\x1a" for topic in _FIELDS}


def _varint(n: int) -> bytes:
    if n < 0:
        n += 1 << 64  # protobuf writes a negative int32 as ten bytes
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _read_varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= end:
            raise DsProtocolError("a varint runs past its message")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise DsProtocolError("a varint over ten bytes")


def encode(msg: DsMessage) -> bytes:
    """One frame's payload: the length-delimited envelope holding ``msg``."""
    topic = msg[0]
    body = _rpc_body(msg) if topic == T_RPC else _body(msg)
    n = len(body)
    envelope = _HEADS[topic] + (_BYTE[n] if n < 0x80 else _varint(n)) + body
    n = len(envelope)
    return (_BYTE[n] if n < 0x80 else _varint(n)) + envelope


def _body(msg: DsMessage) -> bytes:
    """The topic's own message: ``msg``'s fields in the order of their numbers."""
    body = b""
    for slot, tag, kind in _WRITE[msg[0]]:
        value: Any = msg[slot]
        if value is None or value is False:
            continue
        if kind == _STR:
            raw = value.encode()
            n = len(raw)
            body += tag + (_BYTE[n] if n < 0x80 else _varint(n)) + raw
        elif kind == _INT:
            body += tag + (_BYTE[value] if 0 <= value < 0x80 else _varint(value))
        elif kind == _BOOL:
            body += tag + b"\x01"
        else:
            for item in value:
                raw = item.encode()
                body += tag + _varint(len(raw)) + raw
    return body


def _rpc_body(msg: DsMessage) -> bytes:
    """``_body`` of an RpcMessage (every call's REQUEST, ACCEPT and RESPONSE), unrolled:
    the same bytes (tests/unit/test_deepstream_pure.py) in about half the time."""
    action, data, cid, name, names, is_ack, is_error, original, requestor = msg[1:10]
    body = b"\x08" + (_BYTE[action] if 0 <= action < 0x80 else _varint(action))
    if data is not None:
        raw = data.encode()
        n = len(raw)
        body += b"\x12" + (_BYTE[n] if n < 0x80 else _varint(n)) + raw
    if cid is not None:
        raw = cid.encode()
        n = len(raw)
        body += b"\x1a" + (_BYTE[n] if n < 0x80 else _varint(n)) + raw
    if is_error:
        body += b"\x20\x01"
    if is_ack:
        body += b"\x28\x01"
    for item in names:
        raw = item.encode()
        body += b"\x32" + _varint(len(raw)) + raw
    if name is not None:
        raw = name.encode()
        n = len(raw)
        body += b"\x3a" + (_BYTE[n] if n < 0x80 else _varint(n)) + raw
    if original is not None:
        body += b"\x48" + (_BYTE[original] if 0 <= original < 0x80 else _varint(original))
    if requestor is not None:
        raw = requestor.encode()
        n = len(raw)
        body += b"\x52" + (_BYTE[n] if n < 0x80 else _varint(n)) + raw
    return body


def decode(frame: bytes, max_messages: int) -> list[DsMessage]:
    """Every envelope of a frame (at most ``max_messages``); DsProtocolError otherwise.
    A topic the node does not know comes back with action 0 and no fields."""
    out: list[DsMessage] = []
    pos, end = 0, len(frame)
    while pos < end:
        if len(out) >= max_messages:
            raise TooManyMessages(f"over {max_messages} messages in one frame")
        length = frame[pos]
        if length < 0x80:
            pos += 1
        else:
            length, pos = _read_varint(frame, pos, end)
        if pos + length > end:
            raise DsProtocolError("a message runs past its frame")
        out.append(_envelope(frame, pos, pos + length))
        pos += length
    if not out:
        raise DsProtocolError("an empty frame")
    return out


def _envelope(buf: bytes, pos: int, end: int) -> DsMessage:
    topic = 0
    body_at = body_end = 0
    if end - pos > 3 and buf[pos] == 0x10 and buf[pos + 1] < 0x80 and buf[pos + 2] == 0x1A:
        # as the client writes it: its topic (one byte), then the topic's message
        topic, n = buf[pos + 1], buf[pos + 3]
        if n < 0x80:
            body_at = pos + 4
        else:
            n, body_at = _read_varint(buf, pos + 3, end)
        body_end = pos = body_at + n
        if body_end > end:
            raise DsProtocolError("the envelope's message runs past it")
    while pos < end:  # any other order, more fields, or what follows them
        key = buf[pos]
        pos += 1
        if key == 0x10:    # 2: topic, a varint
            topic = buf[pos] if pos < end else 0x80
            if topic < 0x80:
                pos += 1
            else:
                topic, pos = _read_varint(buf, pos, end)
        elif key == 0x1A:  # 3: the topic's message
            n = buf[pos] if pos < end else 0x80
            if n < 0x80:
                pos += 1
            else:
                n, pos = _read_varint(buf, pos, end)
            body_at, body_end = pos, pos + n
            if body_end > end:
                raise DsProtocolError("the envelope's message runs past it")
            pos = body_end
        else:
            if key >= 0x80:
                key, pos = _read_varint(buf, pos - 1, end)
            pos = _skip(buf, pos, end, key & 7)
    fields = _SLOTS.get(topic)
    if fields is None:
        return DsMessage(topic, 0)
    values = _BLANK.copy()
    values[0] = topic
    names: list[str] | None = None
    pos, end = body_at, body_end
    while pos < end:
        key = buf[pos]
        pos += 1
        if key >= 0x80:
            key, pos = _read_varint(buf, pos - 1, end)
        spec = fields.get(key)
        if spec is None:
            pos = _skip(buf, pos, end, key & 7)
            continue
        slot, kind = spec
        n = buf[pos] if pos < end else 0x80
        if n < 0x80:
            pos += 1
        else:
            n, pos = _read_varint(buf, pos, end)
        if kind == _INT:
            values[slot] = n - (1 << 64) if n >= 1 << 63 else n
        elif kind == _BOOL:
            values[slot] = n != 0
        else:
            if pos + n > end:
                raise DsProtocolError(f"field {key >> 3} runs past its message")
            try:
                text = buf[pos:pos + n].decode()
            except UnicodeDecodeError:
                raise DsProtocolError(f"field {key >> 3} is not UTF-8") from None
            pos += n
            if kind == _STR:
                values[slot] = text
            elif names is None:
                names = [text]
            else:
                names.append(text)
    if names is not None:
        values[_NAMES] = tuple(names)
    return tuple.__new__(DsMessage, values)


def _skip(buf: bytes, pos: int, end: int, wire: int) -> int:
    if wire == 0:
        return _read_varint(buf, pos, end)[1]
    if wire == 2:
        n, pos = _read_varint(buf, pos, end)
        pos += n
    elif wire == 1:
        pos += 8
    elif wire == 5:
        pos += 4
    else:
        raise DsProtocolError(f"wire type {wire} is not used by deepstream")
    if pos > end:
        raise DsProtocolError("a field runs past its message")
    return pos
