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
again. Each call leaves every table in ``forget``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, Hashable, TypeVar

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


class Calls(Generic[W]):
    """The calls of one client. ``grace``: how long past its deadline a call waits for
    its node's answer before ``expire`` ends it here."""

    __slots__ = ("grace", "deadlines", "_requests", "_where", "_queued", "_resend",
                 "_maybe_ran")

    def __init__(self, now: float, grace: float, sweep: float = 0.05) -> None:
        self.grace = grace
        self.deadlines = Deadlines[int](sweep, now)
        # every call: (name, data, timeout_ms, meta, until, idempotent, kind); not controls
        self._requests: dict[int, tuple[str, Any, int | None, Any, float, bool, int]] = {}
        self._where: dict[int, W] = {}   # sent calls and controls: their connection
        self._queued: list[int] = []     # waiting for a connection, in order
        self._resend: set[int] = set()   # idempotent: sent again when their connection is lost
        self._maybe_ran: set[int] = set()  # sent on a connection lost since: may have run

    def __len__(self) -> int:
        """Calls and controls under way."""
        return len(self._requests) + sum(1 for ref in self._where if ref not in self._requests)

    def make(self, cid: int, name: str, data: Any, timeout_ms: int | None, meta: Any,
             until: float, idempotent: bool, wire: W | None,
             kind: int = REQUEST) -> list[Any] | None:
        """A new call, due at ``until`` (``timeout_ms`` is what the caller asked for,
        None for the node's default). Returns the REQUEST (or, ``kind`` STREAM, the
        STREAM, ``meta`` holding its window) to write on ``wire`` now, or None: there is
        no connection, it waits for one."""
        assert cid not in self._requests and cid not in self._where, "a call id in use"
        self._requests[cid] = (name, data, timeout_ms, meta, until, idempotent, kind)
        self.deadlines.add(cid, until + self.grace)
        if idempotent:
            self._resend.add(cid)
        if wire is None:
            self._queued.append(cid)
            return None
        self._where[cid] = wire
        return _request(cid, name, data, timeout_ms, meta, kind)

    def wire_of(self, cid: int) -> W | None:
        """The connection call ``cid`` went out on (None: not sent, or ended)."""
        return self._where.get(cid)

    def control(self, ref: int, wire: W, until: float) -> None:
        """A control message ``ref`` went out on ``wire``; it ends by ``until``."""
        self._where[ref] = wire
        self.deadlines.add(ref, until)

    def forget(self, ref: int) -> None:
        """The call (or control) ended here: answered, failed or given up."""
        self._requests.pop(ref, None)
        self._where.pop(ref, None)
        if ref in self._resend:
            self._resend.discard(ref)
            self._maybe_ran.discard(ref)

    def give_up(self, cid: int, answered: bool) -> W | None:
        """The caller gave the call up: the connection to send ``[CANCEL, cid]`` on (it
        was sent there and not ``answered``), or None. The call is forgotten."""
        wire = self._where.get(cid) if cid in self._requests else None
        self.forget(cid)
        return None if answered else wire

    def cancels(self) -> list[tuple[W, list[Any]]]:
        """The client closes: a CANCEL for every sent call, with its connection."""
        return [(wire, [CANCEL, cid]) for cid, wire in self._where.items()
                if cid in self._requests]

    def refused_unrun(self, cid: int, wire: W) -> bool:
        """``wire``'s node refused call ``cid`` with SHUTTING_DOWN: it never ran, so it
        waits for a connection again (``send_queued``), idempotent or not. False: the
        call is not on ``wire`` (or is a control), nothing changed."""
        if self._where.get(cid) != wire or cid not in self._requests:
            return False
        del self._where[cid]
        self._queued.append(cid)
        return True

    def error(self, cid: int, code: str, message: str,
              detail: Any = None) -> errors.RpcError:
        """The error that ends call ``cid``, answered ERROR ``code`` (``detail``: an
        application error's ``[app_code, data]``): that code's, except for a "did not
        run" code to a call that may have run on a connection lost since
        (``CONNECTION_LOST``)."""
        if cid in self._maybe_ran and code in errors.DID_NOT_RUN:
            return errors.ConnectionLostError(
                None, f"sent again after its connection was lost, where it may have run, "
                      f"then answered {code}: {message}")
        return errors.error_from_code(code, message, detail)

    def waiting(self, cid: int) -> bool:
        """The call waits for a connection (not sent, or to be sent again)."""
        return cid in self._requests and cid not in self._where

    def wires(self) -> set[W]:
        """The connections with calls or controls under way."""
        return set(self._where.values())

    def on(self, wire: W) -> list[int]:
        """The calls and controls under way on ``wire``."""
        return [ref for ref, w in self._where.items() if w == wire]

    def lost(self, wire: W, resend: bool) -> list[int]:
        """``wire`` is gone. Returns the calls and controls that failed with it
        (CONNECTION_LOST); idempotent calls wait for the next connection if ``resend``."""
        failed = []
        for ref in self.on(wire):
            del self._where[ref]
            if resend and ref in self._resend:
                self._queued.append(ref)
                self._maybe_ran.add(ref)
            else:
                failed.append(ref)
                self.forget(ref)
        assert wire not in self._where.values(), "a call left on a lost connection"
        return failed

    def send_queued(self, wire: W, now: float) -> list[list[Any]]:
        """The REQUESTs to write on ``wire``, a new connection: the calls that waited,
        in order, each with the time its caller has left. One whose time is up stays for
        ``expire`` to fail."""
        queued, self._queued = self._queued, []
        out = []
        for cid in dict.fromkeys(queued):  # each once, in order
            request = self._requests.get(cid)
            if request is None or cid in self._where:
                continue
            name, data, _, meta, until, _, kind = request
            left = until - now
            if left <= 0:
                self._queued.append(cid)
                continue
            self._where[cid] = wire
            out.append(_request(cid, name, data, int(left * 1000) or 1, meta, kind))
        return out

    def expire(self, now: float) -> list[tuple[int, errors.RpcError]]:
        """The calls and controls whose time is up, each with the error that ends it;
        they are forgotten."""
        out: list[tuple[int, errors.RpcError]] = []
        for ref in self.deadlines.expire(now):
            if ref in self._requests and ref not in self._where:
                out.append((ref, errors.ConnectionLostError(
                    None, "no connection within the deadline")))
            elif ref in self._where:
                out.append((ref, errors.ResponseTimeoutError(
                    None, "no answer from the node within the deadline")))
            else:
                continue  # ended already
            self.forget(ref)
        return out

    def clear(self) -> list[int]:
        """The client closes for good: every call and control, forgotten."""
        refs = list(self._requests.keys() | self._where.keys())
        self._requests.clear()
        self._where.clear()
        self._queued.clear()
        self._resend.clear()
        self._maybe_ran.clear()
        return refs


def _request(cid: int, name: str, data: Any, timeout_ms: int | None,
             meta: Any, kind: int) -> list[Any]:
    return [kind, cid, name, data, timeout_ms] if meta is None else \
        [kind, cid, name, data, timeout_ms, meta]
