"""Cluster messages between nodes, and their batch codec. Pure: no I/O.

One PUBLISH carries one batch: ``[sender, sent_at, [message, ...]]`` in
msgpack, where ``sent_at`` is the sender's monotonic clock in seconds (only
ever compared with other stamps of the same sender, so clocks need not agree).
A message is an array whose first element is its kind (docs/cluster.md)::

    STATE            [1, state, url, started_unix, info]     control topic
    RPC_QUERY        [10, rpc]                                control topic
    PROVIDER_UPDATE  [11, rpc, count]                         control topic
                     (count: the node's providers of rpc, or the sum of their
                     weights when it loaded a weights file: int or float >= 0)
    INVOKE           [20, id, rpc, data, time_left_ms, ack_left_ms, caller, traceparent?]
    ACK              [21, id]        the INVOKE arrived; the node works on it
    ACCEPTED         [22, id]        one of its providers accepted
    RESPONSE         [23, id, data]
    ERROR            [24, id, code, message]
    REJECT           [25, id]        none of its providers took it: try another node
    CANCEL           [26, id]        the origin gave this attempt up
    CHECK            [27, id]        no ACK reached the origin: did you start it?
                                     (answered ACK if so, else REJECT: never started)

``id`` is always the origin node's attempt id.
"""

from __future__ import annotations

from typing import Any

import msgpack

STATE = 1
RPC_QUERY = 10
PROVIDER_UPDATE = 11
INVOKE = 20
ACK = 21
ACCEPTED = 22
RESPONSE = 23
ERROR = 24
REJECT = 25
CANCEL = 26
CHECK = 27

STARTING = "starting"
READY = "ready"
TERMINATING = "terminating"

# kind -> (number of fields after the kind, checks on them)
_SHAPES: dict[int, int] = {
    STATE: 4, RPC_QUERY: 1, PROVIDER_UPDATE: 2, INVOKE: 6, ACK: 1, ACCEPTED: 1,
    RESPONSE: 2, ERROR: 3, REJECT: 1, CANCEL: 1, CHECK: 1,
}


class BadBatch(ValueError):
    """A PUBLISH payload that is not a well-formed batch; it is dropped and counted."""


def encode_batch(sender: str, sent_at: float, messages: list[list[Any]]) -> bytes:
    return msgpack.packb([sender, sent_at, messages])


def decode_batch(payload: bytes) -> tuple[str, float, list[list[Any]], int]:
    """The sender, its send stamp, the well-formed messages of one batch, and how many
    malformed ones were left out (for the caller to count).

    Raises BadBatch when the envelope is wrong.
    """
    try:
        obj = msgpack.unpackb(payload, strict_map_key=False)
    except Exception:  # msgpack raises several types; all mean "not a batch"
        raise BadBatch("not msgpack") from None
    if (type(obj) is not list or len(obj) != 3 or type(obj[0]) is not str
            or type(obj[1]) not in (int, float) or type(obj[2]) is not list):
        raise BadBatch("envelope must be [sender, sent_at, [messages]]")
    good = [m for m in obj[2] if _well_formed(m)]
    return obj[0], float(obj[1]), good, len(obj[2]) - len(good)


def _well_formed(msg: Any) -> bool:
    if type(msg) is not list or not msg or type(msg[0]) is not int:
        return False
    fields = _SHAPES.get(msg[0])
    if fields is None or (len(msg) != fields + 1
                          and not (msg[0] == INVOKE and len(msg) == fields + 2)):
        return False
    kind = msg[0]
    if kind >= INVOKE and (type(msg[1]) is not int or msg[1] < 0):
        return False
    if kind == INVOKE:
        return (type(msg[2]) is str and type(msg[4]) is int and type(msg[5]) is int
                and type(msg[6]) is str and (len(msg) == 7 or type(msg[7]) is str))
    if kind == ERROR:
        return type(msg[2]) is str and type(msg[3]) is str
    if kind == RPC_QUERY:
        return type(msg[1]) is str
    if kind == PROVIDER_UPDATE:
        count = msg[2]
        return (type(msg[1]) is str and type(count) in (int, float)
                and 0 <= count < float("inf"))
    if kind == STATE:
        return type(msg[1]) is str and type(msg[2]) is str and type(msg[4]) is dict
    return True
