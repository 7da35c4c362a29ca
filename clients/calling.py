"""The SDK's caller rules: where each call went, which are sent again, when each ends.
Pure: no asyncio, no sockets. The shell (clients/client.py) passes the time in, writes
the messages this hands back on the connection named with them, and keeps one future
per call; a connection ("wire") is any object the shell chooses.

The rules, as docs/protocol.md's table of codes states them:

- A call made while there is no connection waits for one: it was not sent, so it
  cannot have run. When one comes it is sent with the time its caller has left.
- A call sent on a connection that is lost failed ``CONNECTION_LOST`` (it may have
  run) — unless it was made ``idempotent``: then it waits for the next connection.
  Should a node then answer it with a "did not run" code, that is true of the last
  sending only: the call ends ``CONNECTION_LOST`` (it may have run), never with a code
  that says it did not (``error``).
- A call a node refused with ``SHUTTING_DOWN`` never ran: it waits for the next
  connection (or goes on the current one if the client has moved already), idempotent
  or not.
- A call given up by its caller is told to the node it went to (``CANCEL``), if it
  was sent and is unanswered; so is every sent call when the client closes.
- Every call ends by its deadline plus ``grace``: ``expire`` names the ones whose
  time is up, ``CONNECTION_LOST`` for a call never sent (no connection came in time),
  ``RESPONSE_TIMEOUT`` for one sent.

A stream (``kind`` STREAM) is a call whose answer comes in parts: the same rules hold
(it is never made idempotent: a stream lost with its connection fails).

Control messages (PROVIDE, UNPROVIDE, PING) are tracked too (``control``): they end
by their deadline, fail with the connection they went out on, and are never sent
again. One record per call (``Call``); it leaves the table when the call ends
(``forget``, ``give_up``, ``lost``, ``expire``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Generic, Hashable, TypeVar

from rpcbus import errors
from rpcbus.deadlines import Deadlines
from rpcbus.protocol import CANCEL, REQUEST

W = TypeVar("W", bound=Hashable)


@dataclass(frozen=True, slots=True)
class Reply:
    """One provider's answer to ``call_all``: its label (its AUTH name@session) and node,
    and its ``value`` or ``error`` (an ``RpcError``; ``AppError`` for an application's;
    with ``provider`` empty, a node that did not answer for its providers)."""

    provider: str
    node: str
    value: Any = None
    error: errors.RpcError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def reply_of(msg: list[Any]) -> Reply:
    """A REPLY ``[27, cid, provider, node, data, [code, message, detail?]?]`` as a Reply."""
    if len(msg) > 5 and type(msg[5]) is list and len(msg[5]) >= 2:
        code, message = str(msg[5][0]), str(msg[5][1])
        return Reply(str(msg[2]), str(msg[3]), None, errors.error_from_code(
            code, message, msg[5][2] if len(msg[5]) > 2 else None))
    return Reply(str(msg[2]), str(msg[3]), msg[4])


class Call(Generic[W]):
    """One call (or control) under way: what was asked, where it went, and what its
    shell keeps for it. ``msg``: the message as first built (None for a control:
    PROVIDE, PING, ...; ``kind`` is its message's kind); ``wire``: the connection it
    went out on (None: waiting for one); ``maybe_ran``: an idempotent call sent again
    after its connection was lost, where it may have run. ``waiter`` and ``parts`` are
    the shell's and only carried here: what waits for the outcome (the SDK's future)
    and what came so far (a stream's flow, a call_all's replies)."""

    __slots__ = ("cid", "msg", "until", "idempotent", "kind", "wire", "maybe_ran",
                 "waiter", "parts")

    def __init__(self, cid: int, msg: list[Any] | None, until: float, idempotent: bool,
                 kind: int, wire: W | None, waiter: Any, parts: Any) -> None:
        self.cid = cid
        self.msg = msg
        self.until = until
        self.idempotent = idempotent
        self.kind = kind
        self.wire = wire
        self.maybe_ran = False
        self.waiter = waiter
        self.parts = parts


class Calls(Generic[W]):
    """The calls of one client, one record each (``Call``). ``grace``: how long past
    its deadline a call waits for its node's answer before ``expire`` ends it here.
    ``get(ref)``: the record of call (or control) ``ref``, None when it ended (the
    table's own ``dict.get``: it runs for every message that answers a call)."""

    __slots__ = ("grace", "deadlines", "get", "_calls", "_queued")

    def __init__(self, now: float, grace: float, sweep: float = 0.05) -> None:
        self.grace = grace
        self.deadlines = Deadlines[int](sweep, now)
        self._calls: dict[int, Call[W]] = {}  # calls and controls under way
        self._queued: dict[int, Call[W]] = {}  # calls waiting for a connection, in order
        self.get: Callable[[int], Call[W] | None] = self._calls.get

    def __len__(self) -> int:
        """Calls and controls under way."""
        return len(self._calls)

    def make(self, cid: int, name: str, data: Any, timeout_ms: int | None, meta: Any,
             until: float, idempotent: bool, wire: W | None, kind: int = REQUEST,
             waiter: Any = None, parts: Any = None) -> list[Any] | None:
        """A new call, due at ``until`` (``timeout_ms`` is what the caller asked for,
        None for the node's default); ``waiter`` and ``parts`` are kept on its record
        for the shell. Returns the REQUEST (or, ``kind`` STREAM, the STREAM, ``meta``
        holding its window; ``kind`` ALL, a call_all) to write on ``wire`` now, or
        None: there is no connection, it waits for one."""
        assert cid not in self._calls, "a call id in use"
        assert kind == REQUEST or not idempotent, "only a plain call may be sent again"
        msg = [kind, cid, name, data, timeout_ms] if meta is None else \
            [kind, cid, name, data, timeout_ms, meta]
        call = self._calls[cid] = Call(cid, msg, until, idempotent, kind, wire, waiter, parts)
        self.deadlines.add(cid, until + self.grace)
        if wire is None:
            self._queued[cid] = call
            return None
        return msg

    def wire_of(self, cid: int) -> W | None:
        """The connection call ``cid`` went out on (None: not sent, or ended)."""
        call = self._calls.get(cid)
        return None if call is None else call.wire

    def control(self, ref: int, kind: int, wire: W, until: float,
                waiter: Any = None) -> None:
        """A control message ``ref`` of ``kind`` went out on ``wire``; it ends by ``until``."""
        assert ref not in self._calls, "a control id in use"
        self._calls[ref] = Call(ref, None, until, False, kind, wire, waiter, None)
        self.deadlines.add(ref, until)

    def forget(self, ref: int) -> Call[W] | None:
        """The call (or control) ended here: answered, failed or given up. It leaves
        every table at once; returns its record (None: it had ended already)."""
        call = self._calls.pop(ref, None)
        if call is not None and call.wire is None:
            self._queued.pop(ref, None)
        return call

    def give_up(self, cid: int, answered: bool) -> W | None:
        """The caller gave the call up: the connection to send ``[CANCEL, cid]`` on (it
        was sent there and not ``answered``), or None. The call is forgotten."""
        call = self.forget(cid)
        return None if answered or call is None or call.msg is None else call.wire

    def cancels(self) -> list[tuple[W, list[Any]]]:
        """The client closes: a CANCEL for every sent call, with its connection."""
        return [(call.wire, [CANCEL, cid]) for cid, call in self._calls.items()
                if call.wire is not None and call.msg is not None]

    def refused_unrun(self, cid: int, wire: W) -> bool:
        """``wire``'s node refused call ``cid`` with SHUTTING_DOWN: it never ran, so it
        waits for a connection again (``send_queued``), idempotent or not. False: the
        call is not on ``wire`` (or is a control, or ended), nothing changed."""
        call = self._calls.get(cid)
        if call is None or call.wire != wire or call.msg is None:
            return False
        call.wire = None
        self._queued[cid] = call
        return True

    def error(self, cid: int, code: str, message: str,
              detail: Any = None) -> errors.RpcError:
        """The error that ends call ``cid``, answered ERROR ``code`` (``detail``: an
        application error's ``[app_code, data]``): that code's, except for a "did not
        run" code to a call that may have run on a connection lost since
        (``CONNECTION_LOST``)."""
        call = self._calls.get(cid)
        if call is not None and call.maybe_ran and code in errors.DID_NOT_RUN:
            return errors.ConnectionLostError(
                None, f"sent again after its connection was lost, where it may have run, "
                      f"then answered {code}: {message}")
        return errors.error_from_code(code, message, detail)

    def waiting(self, cid: int) -> bool:
        """The call waits for a connection (not sent, or to be sent again)."""
        call = self._calls.get(cid)
        return call is not None and call.wire is None

    def wires(self) -> set[W]:
        """The connections with calls or controls under way."""
        return {call.wire for call in self._calls.values() if call.wire is not None}

    def on(self, wire: W) -> list[Call[W]]:
        """The calls and controls under way on ``wire``."""
        return [call for call in self._calls.values() if call.wire == wire]

    def lost(self, wire: W, resend: bool) -> list[Call[W]]:
        """``wire`` is gone. Returns the calls and controls that failed with it
        (CONNECTION_LOST; forgotten); idempotent calls wait for the next connection if
        ``resend``, marked ``maybe_ran``."""
        failed = []
        for call in self.on(wire):
            call.wire = None
            if resend and call.idempotent:
                call.maybe_ran = True
                self._queued[call.cid] = call
            else:
                failed.append(call)
                del self._calls[call.cid]
        assert not self.on(wire), "a call left on a lost connection"
        return failed

    def send_queued(self, wire: W, now: float) -> list[list[Any]]:
        """The REQUESTs to write on ``wire``, a new connection: the calls that waited,
        in order, each with the time its caller has left. One whose time is up stays for
        ``expire`` to fail; one that ended meanwhile left the queue as it ended
        (``forget``)."""
        queued, self._queued = self._queued, {}
        out = []
        for cid, call in queued.items():
            assert call.wire is None and self._calls.get(cid) is call, "a queued call sent or ended"
            msg = call.msg
            assert msg is not None, "a control queued"
            left = call.until - now
            if left <= 0:
                self._queued[cid] = call
                continue
            call.wire = wire
            out.append([*msg[:4], int(left * 1000) or 1, *msg[5:]])  # the time left
        return out

    def expire(self, now: float) -> list[tuple[Call[W], errors.RpcError]]:
        """The calls and controls whose time is up, each with the error that ends it;
        they are forgotten."""
        out: list[tuple[Call[W], errors.RpcError]] = []
        calls = self._calls
        for ref in self.deadlines.expire(now):
            call = calls.pop(ref, None)
            if call is None:
                continue  # ended already
            if call.wire is None:
                del self._queued[ref]
            out.append((call, errors.ConnectionLostError(
                None, "no connection within the deadline") if call.wire is None else
                errors.ResponseTimeoutError(
                    None, "no answer from the node within the deadline")))
        return out

    def clear(self) -> list[Call[W]]:
        """The client closes for good: every call and control, forgotten."""
        ended = list(self._calls.values())
        self._calls.clear()
        self._queued.clear()
        return ended
