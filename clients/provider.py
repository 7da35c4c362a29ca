"""A provider's rules on one connection: which REQUESTs it takes, and in which order its
ACCEPTs and handlers go. Pure: no asyncio, no sockets; ``now`` comes in, messages go
out through ``send``.

The rule that keeps a call from running twice: the node moves an attempt on after
its ack timeout, so a provider

1. judges each REQUEST fresh when it takes it (``Freshness``, by half the attempt's
   ack window: the one AUTH_OK gave, or the REQUEST's own ``ack_ms``; a stale one is
   refused unrun, REJECT LATE, as is one for a name it no longer provides, or one
   read on a connection that is closing; one its handler's worker threads cannot
   take soon is refused REJECT BUSY, and the node holds it);
2. accepts it: at the end of the frame, one ``ACCEPT_UPTO`` for every REQUEST of
   the frame it took (one ``ACCEPT`` per call for a node that does not take
   ACCEPT_UPTO), which the shell writes to the socket;
3. only then starts the handlers (``take_starting`` hands them over once the
   ACCEPTs are queued).

However long a handler then holds the process, the node knows the call started
here. A CANCEL from the node ends the handler's run (``cancel`` gives the shell's
handle back to cancel); an answer after that is dropped (``finished`` says
whether to send it). A STREAM is taken by the same rules; its flow control
(clients/streaming.py ``Outflow``) lives here while it runs (``credit``).
"""

from __future__ import annotations

from typing import Any, Callable

from rpcbus.protocol import (
    ACCEPT,
    ACCEPT_UPTO,
    REJECT,
    REJECT_BUSY,
    REJECT_LATE,
    REQ_ACK_MS,
    REQ_ID,
    REQ_NAME,
    REQ_SENT_MS,
    REQ_TIME_LEFT_MS,
)
from rpcbus.streaming import Outflow


class Freshness:
    """Staleness of REQUESTs on one connection.

    The least (taken - sent) seen in the last ``WINDOW`` seconds stands for the clocks'
    offset plus the least delay; a REQUEST taken more than ``stale_after_ms`` after that
    is stale. This underestimates an age, never overestimates it, so a fresh REQUEST is
    never refused, and it follows clock drift window by window.

    A REQUEST read late because its process was held (``late_by``: how long the frame
    may have waited after it arrived) says nothing of the clocks: it is judged, but
    never taken as the offset. With no offset known yet (the connection's first
    REQUESTs), one that may have waited over ``stale_after_ms`` is stale: the node may
    have moved it on."""

    WINDOW = 30.0
    HELD_MS = 20.0  # a frame that may have waited longer than this was read late

    __slots__ = ("stale_after_ms", "_skew", "_skew_next", "_skew_until")

    def __init__(self, stale_after_ms: float = 500.0) -> None:
        self.stale_after_ms = stale_after_ms
        self._skew: float | None = None
        self._skew_next: float | None = None
        self._skew_until = 0.0

    def stale(self, sent_ms: Any, now: float, late_by: float = 0.0,
              after_ms: float = 0.0, left_ms: Any = 0) -> bool:
        """True for a REQUEST stamped ``sent_ms`` by the node, taken at ``now`` (s), in a
        frame that may have waited ``late_by`` s in this process before it was read;
        ``after_ms``, when given, is this REQUEST's own bound (half its ack window), and
        one older than its time left (``left_ms``) is stale too: its caller has stopped
        waiting, so no handler starts for it."""
        if type(sent_ms) is not int:
            return False
        bound = after_ms or self.stale_after_ms
        if type(left_ms) is int and 0 < left_ms < bound:
            bound = left_ms
        now_ms = now * 1000
        seen = now_ms - sent_ms
        if late_by * 1000 > self.HELD_MS:
            if self._skew is None:
                return late_by * 1000 > bound
            return seen - self._skew > bound
        if now_ms >= self._skew_until:  # a new window: keep the last one's minimum
            if self._skew_next is not None:
                self._skew = self._skew_next
            self._skew_next = None
            self._skew_until = now_ms + self.WINDOW * 1000
        if self._skew_next is None or seen < self._skew_next:
            self._skew_next = seen
        skew = self._skew
        if skew is None or seen < skew:
            self._skew = skew = seen
        return seen - skew > bound

    def learn(self, sent_ms: int, now: float) -> float:
        """A frame stamped ``sent_ms`` by its sender was read at ``now`` (s): how long
        (ms, at least) it waited beyond the least delay seen, which it also teaches (the
        node's reading of a client's SENT)."""
        self.stale(sent_ms, now)
        skew = self._skew
        assert skew is not None, "stale learns the least delay of the first stamp it sees"
        return now * 1000 - sent_ms - skew

    def age_ms(self, sent_ms: Any, now: float) -> float:
        """How long ago (ms, at least) the node sent a REQUEST stamped ``sent_ms``, by the
        offset learnt so far (0 when none is)."""
        if type(sent_ms) is not int or self._skew is None:
            return 0.0
        return max(0.0, now * 1000 - sent_ms - self._skew)


class Held:
    """When the client's loop was held, from a tick the shell runs every ``interval``
    seconds: how long a frame read now may have waited after it arrived. A frame is
    read before the late tick on some loops (asyncio) and after it on others (uvloop):
    both are seen."""

    __slots__ = ("interval", "ticked", "_stall_at", "_stall")

    def __init__(self, interval: float, now: float) -> None:
        self.interval = interval
        self.ticked = now  # the last tick
        self._stall_at = float("-inf")
        self._stall = 0.0

    def tick(self, now: float) -> None:
        gap = now - self.ticked - self.interval
        if gap > 0:
            self._stall_at, self._stall = now, gap
        self.ticked = now

    def late_by(self, now: float) -> float:
        """Seconds a frame read at ``now`` may have waited (0: the loop ran freely)."""
        late = now - self.ticked - self.interval
        if now - self._stall_at < self.interval and self._stall > late:
            late = self._stall  # the late tick ran first: this frame waited through it
        return max(late, 0.0)


class Serving:
    """The provider side of one connection. ``send`` queues a message on it;
    ``provided(name)`` is the client's handler entry for ``name`` (None: not provided);
    ``accept_upto``: the node takes ACCEPT_UPTO (its AUTH_OK says)."""

    def __init__(self, send: Callable[[list[Any]], None],
                 provided: Callable[[str], Any], accept_upto: bool = False,
                 stale_after_ms: float = 500.0) -> None:
        self.send = send
        self.provided = provided
        self.accept_upto = accept_upto
        self.freshness = Freshness(stale_after_ms)
        # REQUESTs taken in the frame being read: (attempt, name, entry, request), whose
        # handlers start once their ACCEPTs are queued
        self.starting: list[tuple[int, str, Any, list[Any]]] = []
        self.running: dict[int, Any] = {}  # attempt -> the shell's handle of its handler
        self.flows: dict[int, Outflow] = {}  # attempt -> a running stream's credit
        self.stale_requests = 0             # REQUESTs refused unrun: taken too late
        self.busy_requests = 0              # REQUESTs refused unrun: no worker free soon

    def request(self, msg: list[Any], now: float, open: bool, late_by: float = 0.0,
                full: Callable[[Any, Any], bool] | None = None) -> bool:
        """Take a REQUEST ``[16, id, name, data, time_left_ms, caller, sent_ms, trace?,
        user?, nil?, ack_ms?]`` (or a STREAM, its window at 9) read at ``now``, on a
        connection ``open`` or not, in a frame that may have waited ``late_by`` s in this
        process (its loop was held); False when it was refused because it is stale (the
        shell may log it). ``full(entry, time_left_ms)`` True: the handler's workers
        cannot take it soon enough, so it is refused BUSY, unrun (the node holds it and
        sends it again)."""
        attempt = msg[REQ_ID]
        n = len(msg)
        if n > REQ_SENT_MS and self.freshness.stale(
                msg[REQ_SENT_MS], now, late_by,
                msg[REQ_ACK_MS] / 2 if n > REQ_ACK_MS and type(msg[REQ_ACK_MS]) is int else 0.0,
                msg[REQ_TIME_LEFT_MS]):
            self.send([REJECT, attempt, REJECT_LATE])  # the node has moved it on (or will)
            self.stale_requests += 1
            return False
        entry = self.provided(msg[REQ_NAME])
        if entry is None or not open:
            # unprovided a moment ago, or closing; or this connection closes (one the client
            # moved off): no ACCEPT could reach the node, which moves the call on: not run
            self.send([REJECT, attempt])
            return True
        if full is not None and full(entry, msg[REQ_TIME_LEFT_MS]):
            self.send([REJECT, attempt, REJECT_BUSY])
            self.busy_requests += 1
            return True
        if not self.accept_upto:  # a node that takes only one ACCEPT per call
            self.send([ACCEPT, attempt])
        self.starting.append((attempt, msg[REQ_NAME], entry, msg))
        return True

    def take_starting(self) -> list[tuple[int, str, Any, list[Any]]]:
        """The end of a frame: queue the ACCEPT_UPTO for the REQUESTs taken in it (after
        any REJECT) and hand them over to be started. The shell writes what is queued to
        the socket before it starts a handler."""
        starting, self.starting = self.starting, []
        if starting and self.accept_upto:
            self.send([ACCEPT_UPTO, max(start[0] for start in starting)])
        return starting

    def started(self, attempt: int, handle: Any) -> None:
        assert attempt not in self.running, "a second handler for one attempt"
        self.running[attempt] = handle

    def stream(self, attempt: int, window: int) -> Outflow:
        """A STREAM's handler starts: its credit, until it ends."""
        flow = self.flows[attempt] = Outflow(window)
        return flow

    def credit(self, attempt: int, n: int) -> Any:
        """CREDIT for a running stream: the shell's waiter to wake, or None."""
        flow = self.flows.get(attempt)
        return None if flow is None else flow.granted(n)

    def cancel(self, attempt: int) -> Any:
        """The node gave the attempt up: the handle of its handler (to cancel), or None.
        One taken in the frame being read (its REQUEST and the CANCEL came in one frame)
        never starts."""
        self.flows.pop(attempt, None)
        handle = self.running.pop(attempt, None)
        if handle is None and self.starting:
            self.starting = [start for start in self.starting if start[0] != attempt]
        return handle

    def finished(self, attempt: int) -> bool:
        """A handler ended: True when its outcome is to be sent (not cancelled meanwhile)."""
        self.flows.pop(attempt, None)
        return self.running.pop(attempt, None) is not None

    def lost(self) -> list[Any]:
        """The connection is gone: every handler's handle (their answers have nowhere to
        go)."""
        running, self.running = self.running, {}
        self.starting = []
        self.flows = {}
        return list(running.values())
