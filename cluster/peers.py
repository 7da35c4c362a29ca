"""The router's peers that stand for other nodes (see cluster/core.py). Pure.

* ``RemoteNode`` is another node as a provider peer: a REQUEST to it is
  published as INVOKE on that node's private topic, a CANCEL as CANCEL, an
  ack check as CHECK (with an ECHO, so the link can tell whether it hears).
* ``RemoteCaller`` is one INVOKE received from another node, as a caller peer:
  RESPONSE and ERROR go back to the origin (its ACCEPT is not sent: the ACK
  said as much); a NO_PROVIDER outcome
  becomes REJECT, so the origin tries another node.
* ``RecentIds`` remembers attempt keys for a while (acknowledged, refused).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rpcbus import errors
from rpcbus.cluster import messages as m
from rpcbus.cluster.messages import (
    INV_CALLER,
    INV_DATA,
    INV_RPC,
    INV_TRACEPARENT,
    INV_USER,
    INV_WINDOW,
)
from rpcbus.protocol import ACCEPT, ACK_CHECK, ALL, CREDIT, PART, REPLY, REQUEST, STREAM
from rpcbus.protocol import CANCEL as C_CANCEL
from rpcbus.protocol import ERROR as C_ERROR
from rpcbus.protocol import RESPONSE as C_RESPONSE

if TYPE_CHECKING:
    from rpcbus.cluster.core import ClusterCore


class RemoteNode:
    """Another node, as a provider peer of this node's router."""

    is_node = True
    retired = False    # replaced by a newer process under its name (for good)
    user_name = None   # a node is never a caller here (INVOKEs stand for callers)
    origin = ""        # nor the origin of a call
    hrows: dict[Any, Any] = {}  # never added to: the load history is of clients only
    runs_before_accept = False  # it acknowledges an INVOKE before any provider runs it

    def __init__(self, link: "ClusterCore", name: str, incarnation: int) -> None:
        self.link = link
        self.name = self.label = self.provider_name = name
        self.incarnation = incarnation   # the process this object stands for
        self.topic = m.node_topic(name, link.config.namespace)
        self.closed = False              # declared dead, or replaced by a new incarnation
        self.inflight = 0
        self.load = 0                    # attempts this node's router sent there
        self.attempts = 0
        self.rate = 0.0                  # attempts per second this node sends there (local-first)
        # calls per second it said its own providers get, in its last heartbeat, by rpc
        self.reported: dict[str, float] = {}
        # seconds an attempt takes at its fastest provider of the rpc, by rpc (same heartbeat)
        self.latency: dict[str, float] = {}
        # unused: a node reports its own (``latency``)
        self.lat = self.seen = self.steady = 0.0
        self.minutes: Any = None         # a node: never a provider's figures here
        self.calls: dict[int, Any] = {}  # never added to: a provider, never a caller
        self.accepted_upto = 0           # a node acknowledges (ACK), never ACCEPT_UPTO
        self.provides: set[str] = set()
        self.pace: Any = None            # its ack timeout and limit (the router's)

    def publish(self, msg: list[Any], then: Any = None, hold_until: float = 0.0) -> None:
        self.link.outbox.publish(self.topic, msg, then, self.incarnation, hold_until)

    def send(self, msg: list[Any]) -> None:
        # the attempt's ack window: this node's, as the router paces it (its floor before)
        ack_ms = self.link.ack_ms if self.pace is None else self.pace.ack_ms
        if msg[0] == REQUEST:  # [16, id, name, data, left_ms, caller, sent_ms, trace?, user?]
            # becomes [120, id, name, data, left_ms, ack_ms, caller, traceparent | nil, user?]
            if len(msg) == 7:
                invoke = [m.INVOKE, msg[1], msg[2], msg[3], msg[4], ack_ms, msg[5]]
            elif msg[8] is None:
                invoke = [m.INVOKE, msg[1], msg[2], msg[3], msg[4], ack_ms, msg[5], msg[7]]
            else:
                invoke = [m.INVOKE, msg[1], msg[2], msg[3], msg[4], ack_ms, msg[5], msg[7],
                          msg[8]]
            self.link.outbox.publish(self.topic, invoke, None, self.incarnation)  # inlined
        elif msg[0] == CREDIT:
            self.publish([m.CREDIT, msg[1], msg[2]])
        elif msg[0] == ALL:  # [26, id, name, data, left_ms, caller, sent_ms, trace, user]
            invoke = [m.INVOKE_ALL, msg[1], msg[2], msg[3], msg[4], ack_ms, msg[5]]
            if msg[8] is not None:
                invoke += [msg[7], msg[8]]
            elif msg[7] is not None:
                invoke.append(msg[7])
            self.publish(invoke)
        elif msg[0] == STREAM:  # [23, id, name, data, left_ms, caller, sent_ms, trace, user,
            # window] becomes [120, id, name, data, left_ms, ack_ms, caller, trace, user, window]
            self.publish([m.INVOKE, msg[1], msg[2], msg[3], msg[4], ack_ms, msg[5],
                          msg[7], msg[8], msg[9]])
        elif msg[0] == C_CANCEL:
            self.publish([m.CANCEL, msg[1]])
        elif msg[0] == ACK_CHECK:  # [ACK_CHECK, id] or, after a bus reset, [.., age_ms]
            self.publish([m.CHECK, *msg[1:]])
            self.link.probe()


class RemoteCaller:
    """One INVOKE from another node, as a caller of this node's router (its ``Caller``:
    broker/peers.py), never a provider."""

    is_node = True
    closed = False  # publishing to a node that left is harmless

    __slots__ = ("link", "node", "origin", "id", "key", "label", "user_name", "inflight",
                 "calls", "invoke", "late_at", "deadline", "parts")

    def __init__(self, link: "ClusterCore", origin: "RemoteNode", key: tuple[int, int],
                 invoke: list[Any], deadline: float, late_at: float) -> None:
        self.link, self.node, self.origin = link, origin, origin.name
        self.key = key            # (origin's incarnation, attempt): in the link's tables
        self.id, self.label = key[1], invoke[INV_CALLER]
        # checked at the origin
        self.user_name = invoke[INV_USER] if len(invoke) > INV_USER else None
        self.inflight = 0
        self.calls: dict[int, Any] = {}  # its one call (the router's)
        self.invoke: list[Any] | None = invoke  # the INVOKE, until it starts
        self.late_at = late_at    # starting after this, the origin may have moved it on
        self.deadline = deadline  # the call's, on this node's clock
        self.parts = -1           # a stream's parts sent to the origin (numbered); -1: a call

    def start(self) -> None:
        """Redis has taken the ACK (the origin will not move the attempt now): run it."""
        link = self.link
        link.starting -= 1
        key = self.key
        if link.invoked.get(key) is not self:  # cancelled meanwhile
            return
        msg, self.invoke = self.invoke, None
        if msg is None:  # started already
            return
        t = link.clock()
        if t > self.late_at:
            # This process stalled before Redis took the ACK (a SIGSTOP, a starved
            # machine): the origin may have given the attempt up and moved the call on.
            # Refuse it unrun; an origin still waiting moves it now.
            del link.invoked[key]
            link.refused.add(key)  # a CHECK for it is answered REJECT too
            link.stats["stale_invokes"] += 1
            link._warnings.warn("late_ack_invoke_refused", origin=self.origin, rpc=msg[INV_RPC],
                            call_id=self.id)
            self.node.publish([m.REJECT, self.id])
            return
        if msg[0] == m.INVOKE_ALL:  # its providers' REPLYs and its end come in ahead of the
            left = self.deadline - t  # origin's deadline, so each is the caller's in time
            link.router.request_all(self, self.id, msg[INV_RPC], msg[INV_DATA],
                                    int((left - min(0.1, left / 10)) * 1000) or 1, t,
                                    msg[INV_TRACEPARENT] if len(msg) > INV_TRACEPARENT else None)
            return
        if len(msg) <= INV_TRACEPARENT:  # the common INVOKE: no trace, no user, no window
            link.router.request(self, self.id, msg[INV_RPC], msg[INV_DATA],
                                int((self.deadline - t) * 1000), t)
            return
        window = msg[INV_WINDOW] if len(msg) > INV_WINDOW else 0
        if window:
            self.parts = 0
        link.router.request(self, self.id, msg[INV_RPC], msg[INV_DATA],
                            int((self.deadline - t) * 1000), t, msg[INV_TRACEPARENT], window)

    def send(self, msg: list[Any]) -> None:
        """The call's outcome, back to the origin (an ACCEPT stays here: the ACK the origin
        had before the call started says as much), and a stream's parts before it. Kept
        while the bus is down (until the call's deadline) and sent after the reconnect:
        the call ran.

        A RESPONSE ``[18, id, data]`` (``id`` this attempt's) leaves as the bus's
        ``[123, id, data]``; a stream's parts are numbered, and its RESPONSE carries how
        many were sent, so the origin drops a part the bus delivered twice and sees one
        lost."""
        kind = msg[0]
        node = self.node
        if kind == C_RESPONSE:  # node.publish, inlined (one per call); a stream's end
            self.link.outbox.publish(node.topic, [m.RESPONSE, msg[1], msg[2] if self.parts < 0
                                                  else self.parts], None,
                                     node.incarnation, self.deadline)
        elif kind == ACCEPT:  # the origin knows it started: it had the ACK before it ran
            return
        elif kind == PART:  # a stream goes on: its caller stays in the link's tables
            self.link.outbox.publish(node.topic, [m.PART, msg[1], self.parts, msg[2]], None,
                                     node.incarnation, self.deadline)
            self.parts += 1
            return
        elif kind == REPLY:  # [27, cid, provider, node, data, error?]: one of a call_all's
            node.publish([m.REPLY, msg[1], msg[2], msg[4], *msg[5:]], hold_until=self.deadline)
            return
        elif kind == C_ERROR and msg[2] == errors.NO_PROVIDER:
            self.link.refused.add(self.key)  # not run: a CHECK after a lost REJECT says so
            node.publish([m.REJECT, self.id], hold_until=self.deadline)
        elif kind == C_ERROR and msg[2] == errors.OVERLOADED:  # not run: the origin may
            self.link.refused.add(self.key)                      # try another node
            node.publish([m.ERROR, self.id, errors.OVERLOADED, msg[3]],
                         hold_until=self.deadline)
        elif kind == C_ERROR:
            node.publish([m.ERROR, self.id, *msg[2:]], hold_until=self.deadline)
        self.link.invoked.pop(self.key, None)


class RecentIds:
    """Keys remembered for at least ``keep`` seconds (two generations of sets: adding and
    looking up cost a set operation; memory is what arrived in the last 2 x ``keep``).
    A path that runs per INVOKE looks in ``new`` and ``old`` itself: ``key in ids`` costs a
    Python call."""

    def __init__(self, keep: float) -> None:
        self.keep = keep
        self.new: set[Any] = set()
        self.old: set[Any] = set()
        self._rotate_at = 0.0
        # add(key): the newer set's own add, called without a Python frame (every INVOKE
        # adds its key); tick() rebinds it when the sets rotate
        self.add = self.new.add

    def __contains__(self, key: Any) -> bool:
        return key in self.new or key in self.old

    def tick(self, now: float) -> None:
        if now >= self._rotate_at:
            self.old, self.new = self.new, set()
            self.add = self.new.add
            self._rotate_at = now + self.keep
