"""Cluster messages between nodes, and their batch codec. Pure: no I/O.

One PUBLISH carries one batch: ``[sender, incarnation, to, sent_at, [message, ...]]``
in msgpack, where ``sent_at`` is the sender's monotonic clock in seconds (only
ever compared with other stamps of the same sender, so clocks need not agree).

``incarnation`` tells one process of a node name from the next: a positive
int made at start from the wall clock in µs and random low bits
(``new_incarnation``), so a restarted node's is larger than its old one's and
no two processes share one. ``to`` is the incarnation of the node a private
topic's batch is meant for (0 on the control topic): a node acts only on
batches addressed to itself, never on a late answer or a replayed batch meant
for the process that had its name before.

A message is an array whose first element is its kind (docs/cluster.md). The
kinds are numbered from 101, apart from the client protocol's (rpcbus.protocol,
1-31): a message of one protocol can never pass for one of the other. Each
kind's fields are named once, in ``FIELDS`` below; messages are built whole
where they are made, never rewritten in place::

    STATE            [101, state, url, started, info]         control topic
    RPC_QUERY        [110, rpc]                                control topic
    PROVIDER_UPDATE  [111, rpc, count]                         control topic
                     (count: the node's providers of rpc, or the sum of their
                     weights when it loaded a weights file: int or float >= 0)
    INVOKE           [120, id, rpc, data, time_left_ms, ack_left_ms, caller, traceparent?, user?,
                      window?]  (window: a stream's credit window; traceparent and user
                                 are then nil or a string)
    ACK              [121, id, id, ...] these INVOKEs arrived; the node works on them
                                      (one ACK for the INVOKEs of one batch)
    RESPONSE         [123, id, data]
    ERROR            [124, id, code, message, detail?]  detail: [app_code, data] with
                                      code APP_ERROR (an application's error)
    REJECT           [125, id]        none of its providers took it: try another node
    CANCEL           [126, id]        the origin gave this attempt up
    CHECK            [127, id, age_ms?]  did you start it? (no ACK reached the origin,
                                      or its bus reset since: then age_ms, the attempt's
                                      age, -1 if its ACK came) Answered ACK (running),
                                      REJECT (never started, never will) or DONE
    ECHO             [128]            a node to itself: its subscription still delivers
    ANNOUNCE         [129]            to a node that (re)joined: publish your counts
    PART             [130, id, seq, data]  a stream's part seq (0, 1, ...); RESPONSE ends
                                      the stream, its data the number of parts sent
    CREDIT           [131, id, read]  the stream's caller has read this many parts in all
    INVOKE_ALL       [132, id, rpc, data, time_left_ms, ack_left_ms, caller, traceparent?, user?]
                                      a call_all: run it on each of your providers (the
                                      ACK rules of INVOKE); REPLY per provider, then
                                      RESPONSE with their number
    REPLY            [133, id, provider, data, error?]  one provider's answer, or error
                                      [code, message, detail?]
    DONE             [134, id]        to a CHECK: it ran here and its answer was sent
                                      (before this: one that does not come was lost)
    EVENT            [140, topic, data, seq?]                  event channel
                                      an event a client of the sender emitted, for the
                                      subscribers of ``topic`` here (docs/events.md);
                                      ``seq`` numbers the sender's emits (its subscribers
                                      drop one they had already, after a move)
    PRESENCE         [141, user, online]                       control topic
                                      the first connection of ``user`` on the sender came
                                      (true) or its last one left (false)
    PRESENCE_ALL     [142, [user, ...]]                        control topic
                                      every user online on the sender (asked for)
    PRESENCE_QUERY   [143]            publish your PRESENCE_ALL: your heartbeat's digest
                                      of your users disagrees with what this node heard

``id`` is always the origin node's attempt id.
"""

from __future__ import annotations

import secrets
import time
import zlib
from typing import Any, NamedTuple

import msgpack

from rpcbus.protocol import MAX_WINDOW

STATE = 101
RPC_QUERY = 110
PROVIDER_UPDATE = 111
INVOKE = 120
ACK = 121
RESPONSE = 123
ERROR = 124
REJECT = 125
CANCEL = 126
CHECK = 127
ECHO = 128
ANNOUNCE = 129
PART = 130
CREDIT = 131
INVOKE_ALL = 132
REPLY = 133
DONE = 134
EVENT = 140
PRESENCE = 141
PRESENCE_ALL = 142
PRESENCE_QUERY = 143

#: Each kind's name and fields after the kind, in order (``?``: may be left out at the
#: end; ``...``: repeats). docs/cluster.md's table is checked against it by a test.
FIELDS: dict[int, tuple[str, tuple[str, ...]]] = {
    STATE: ("STATE", ("state", "url", "started", "info")),
    RPC_QUERY: ("RPC_QUERY", ("rpc",)),
    PROVIDER_UPDATE: ("PROVIDER_UPDATE", ("rpc", "count")),
    INVOKE: ("INVOKE", ("id", "rpc", "data", "time_left_ms", "ack_left_ms", "caller",
                        "traceparent?", "user?", "window?")),
    ACK: ("ACK", ("id", "id", "...")),
    RESPONSE: ("RESPONSE", ("id", "data")),
    ERROR: ("ERROR", ("id", "code", "message", "detail?")),
    REJECT: ("REJECT", ("id",)),
    CANCEL: ("CANCEL", ("id",)),
    CHECK: ("CHECK", ("id", "age_ms?")),
    ECHO: ("ECHO", ()),
    ANNOUNCE: ("ANNOUNCE", ()),
    PART: ("PART", ("id", "seq", "data")),
    CREDIT: ("CREDIT", ("id", "read")),
    INVOKE_ALL: ("INVOKE_ALL", ("id", "rpc", "data", "time_left_ms", "ack_left_ms", "caller",
                                "traceparent?", "user?")),
    REPLY: ("REPLY", ("id", "provider", "data", "error?")),
    DONE: ("DONE", ("id",)),
    EVENT: ("EVENT", ("topic", "data", "seq?")),
    PRESENCE: ("PRESENCE", ("user", "online")),
    PRESENCE_ALL: ("PRESENCE_ALL", ("users",)),
    PRESENCE_QUERY: ("PRESENCE_QUERY", ()),
}

# Positions in an INVOKE (FIELDS[INVOKE]): where a node reads one
INV_ID, INV_RPC, INV_DATA, INV_TIME_LEFT_MS, INV_ACK_LEFT_MS, INV_CALLER, INV_TRACEPARENT, \
    INV_USER, INV_WINDOW = range(1, 10)
#: kinds that only come on a node's private topic, addressed to one process
CALL_KINDS = frozenset((INVOKE, ACK, RESPONSE, ERROR, REJECT, CANCEL, CHECK, PART, CREDIT,
                        INVOKE_ALL, REPLY, DONE, PRESENCE_QUERY))

STARTING = "starting"
READY = "ready"
TERMINATING = "terminating"

# kind -> number of fields after the kind, for the kinds of one length (_well_formed checks
# the others in branches of their own: RESPONSE, INVOKE and ACK first, as every call
# carries them)
_SHAPES: dict[int, int] = {
    STATE: 4, RPC_QUERY: 1, PROVIDER_UPDATE: 2, INVOKE: 6, ACK: 1,
    RESPONSE: 2, ERROR: 3, REJECT: 1, CANCEL: 1, CHECK: 1, ECHO: 0, ANNOUNCE: 0,
    PART: 3, CREDIT: 2, REPLY: 3, DONE: 1, PRESENCE: 2, PRESENCE_ALL: 1,
    PRESENCE_QUERY: 0,
}

_INCARNATION_BITS = 10


def control_topic(namespace: str) -> str:
    """The topic every node hears (STATE, RPC_QUERY, PROVIDER_UPDATE)."""
    return f"{namespace}:ctrl"


def node_topic(node: str, namespace: str) -> str:
    """A node's private topic (the messages of calls, addressed to one process)."""
    return f"{namespace}:node:{node}"


#: event topics travel on this many channels per namespace, a topic on the one its CRC-32
#: picks: a node subscribes (on Redis) to the channels of its clients' topics only, and
#: holds at most this many subscriptions whatever its clients subscribe to
EVENT_CHANNELS = 256


def event_channel(namespace: str, topic: str) -> str:
    """The channel ``topic``'s events cross the cluster on (EVENT batches)."""
    return f"{namespace}:ev:{zlib.crc32(topic.encode()) % EVENT_CHANNELS}"


def is_event_channel(namespace: str, channel: str) -> bool:
    return channel.startswith(f"{namespace}:ev:")


def new_incarnation() -> int:
    """A fresh incarnation id: µs since the epoch, then random low bits (fits int64)."""
    return (time.time_ns() // 1000) << _INCARNATION_BITS | secrets.randbits(_INCARNATION_BITS)


class BadBatch(ValueError):
    """A PUBLISH payload that is not a well-formed batch; it is dropped and counted."""


class Batch(NamedTuple):
    sender: str
    incarnation: int   # the sender process's
    to: int            # the addressed process's incarnation (0: anyone, the control topic)
    sent_at: float
    messages: list[list[Any]]
    malformed: int     # messages left out (for the receiver to count)


def encode_batch(sender: str, incarnation: int, to: int, sent_at: float,
                 messages: list[list[Any]]) -> bytes:
    """Raises ValueError or TypeError when msgpack cannot carry a message (too deep a
    nesting, an object it does not know): the caller drops what it could not send."""
    packed: bytes = msgpack.packb([sender, incarnation, to, sent_at, messages])
    return packed


def decode_batch(payload: bytes) -> Batch:
    """The well-formed messages of one batch and its envelope.

    Raises BadBatch when the envelope is wrong.
    """
    try:
        obj = msgpack.unpackb(payload, strict_map_key=False)
    except Exception:  # msgpack raises several types; all mean "not a batch"
        raise BadBatch("not msgpack") from None
    if (type(obj) is not list or len(obj) != 5 or type(obj[0]) is not str
            or type(obj[1]) is not int or obj[1] <= 0 or type(obj[2]) is not int
            or type(obj[3]) not in (int, float) or type(obj[4]) is not list):
        raise BadBatch("envelope must be [sender, incarnation, to, sent_at, [messages]]")
    good = [m for m in obj[4] if _well_formed(m)]
    return Batch(obj[0], obj[1], obj[2], float(obj[3]), good, len(obj[4]) - len(good))


def _well_formed(msg: Any) -> bool:
    if type(msg) is not list or not msg or type(msg[0]) is not int:
        return False
    kind = msg[0]
    n = len(msg)
    if kind == RESPONSE:  # the two kinds every call carries, first
        return n == 3 and type(msg[1]) is int and msg[1] >= 0
    if kind == INVOKE:  # [120, id, rpc, data, left_ms, ack_ms, caller, traceparent?, user?,
        # window?]
        return (7 <= n <= 9 and type(msg[1]) is int and msg[1] >= 0 and type(msg[2]) is str
                and type(msg[4]) is int and type(msg[5]) is int and type(msg[6]) is str
                and (n == 7 or type(msg[7]) in (str, type(None)))
                and (n < 9 or type(msg[8]) is str)) or (
            n == 10 and _well_formed([kind, *msg[1:8]])   # a stream's: every field
            and type(msg[8]) in (str, type(None))
            and type(msg[9]) is int and 0 < msg[9] <= MAX_WINDOW)
    if kind == PART:
        return n == 4 and type(msg[1]) is int and msg[1] >= 0 and type(msg[2]) is int \
            and msg[2] >= 0
    if kind == INVOKE_ALL:  # INVOKE's fields, without a window
        return n <= 9 and _well_formed([INVOKE, *msg[1:]])
    if kind == ACK:
        return n > 1 and all(type(i) is int and i >= 0 for i in msg[1:])
    if kind == ERROR:  # [124, id, code, message, detail?]
        return (4 <= n <= 5 and type(msg[1]) is int and msg[1] >= 0 and type(msg[2]) is str
                and type(msg[3]) is str and (n == 4 or type(msg[4]) is list))
    if kind == REPLY:  # [133, id, provider, data, error?]
        return (4 <= n <= 5 and type(msg[1]) is int and msg[1] >= 0 and type(msg[2]) is str
                and (n == 4 or (type(msg[4]) is list and 2 <= len(msg[4]) <= 3
                                and type(msg[4][0]) is str and type(msg[4][1]) is str)))
    if kind == CHECK:  # [127, id, age_ms?]
        return (2 <= n <= 3 and type(msg[1]) is int and msg[1] >= 0
                and (n == 2 or type(msg[2]) is int))
    if kind == EVENT:  # [140, topic, data, seq?]
        return (n == 3 or (n == 4 and type(msg[3]) is int)) and type(msg[1]) is str
    fields = _SHAPES.get(kind)
    if fields is None or n != fields + 1:
        return False
    if kind in CALL_KINDS and kind != PRESENCE_QUERY and (type(msg[1]) is not int
                                                           or msg[1] < 0):
        return False
    if kind == CREDIT:
        return type(msg[2]) is int and msg[2] > 0

    if kind == RPC_QUERY:
        return type(msg[1]) is str
    if kind == PROVIDER_UPDATE:
        count = msg[2]
        return (type(msg[1]) is str and type(count) in (int, float)
                and 0 <= count < float("inf"))
    if kind == STATE:
        return type(msg[1]) is str and type(msg[2]) is str and type(msg[4]) is dict
    if kind == PRESENCE:
        return type(msg[1]) is str and type(msg[2]) is bool
    if kind == PRESENCE_ALL:
        return type(msg[1]) is list and all(type(u) is str for u in msg[1])
    return True
