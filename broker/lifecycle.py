"""A node's own rules over time, as cores: the stall hold, the cut-off rule and the
drain's order. Pure: a clock comes in, what to do goes out; no asyncio, no I/O.
broker/node.py feeds them from its one timer and its shutdown, the simulator
(sim/cluster.py) from its sweeps: the rules live here only.

``Watch`` (one per node, fed once per sweep)
  * **stall**: a sweep more than ``STALL`` after the last means the process was
    stopped or starved. For ``STALL_HOLD`` the sweeps only read what arrived meanwhile
    (acknowledgements and answers that would otherwise be taken for timeouts), then
    deadlines apply again. Stalled as long as ``evacuate_after``, the cluster gave the
    node up meanwhile, and a node that does this is no home for providers: its clients
    are sent elsewhere (not while it drains).
  * **cut off**: once the cluster bus has been down for ``evacuate_after`` (and the
    node does not drain), every client is told to move to another node it knows, once,
    and so is every one that logs in while the node stays cut off; the bus back, the
    node is reachable again.

``Drain`` (one per SIGTERM), in this order:
  1. ``ANNOUNCE``: the node says it is terminating (other nodes stop sending it calls);
     it waits until its bus has flushed that, ``FLUSH_WAIT`` at most;
  2. ``TELL``: every client is told, and PINGed (what it sent before it heard is read
     before its PONG: run, or refused SHUTTING_DOWN, never lost unread);
  3. it waits until every client told answered (``notice_wait`` at most, within
     ``drain_timeout``), then until nothing is in flight (``drain_timeout`` from step
     2 at most);
  4. ``HAND_BACK``, only when calls are still pending then: calls no provider took go
     elsewhere;
  5. it waits until the bus has flushed the last answers to other nodes
     (``FLUSH_WAIT`` at most), then ``CLOSE``: the connections close.
"""

from __future__ import annotations

STALL = 0.25       # s without a sweep: the process was stopped or starved
STALL_HOLD = 0.2   # s to read the backlog before deadlines apply again
NOTICE_WAIT = 2.0  # s a draining node waits for its clients' PONG to its notice at most
FLUSH_WAIT = 1.0   # s a draining node waits for its bus to flush, each time

# what a sweep does about the cluster bus (``Watch.bus``)
NOTHING, CUT_OFF, REACHABLE_AGAIN = 0, 1, 2
# what a drain does next (``Drain.next``)
ANNOUNCE, TELL, WAIT, HAND_BACK, CLOSE, DONE = (
    "announce", "tell", "wait", "hand_back", "close", "done")


class Watch:
    """The stall hold and the cut-off rule of one node (module docstring)."""

    __slots__ = ("evacuate_after", "last", "hold_until", "down_since", "cut_off")

    def __init__(self, now: float, evacuate_after: float) -> None:
        self.evacuate_after = evacuate_after
        self.last = now                  # the last sweep
        self.hold_until = -1e18          # deadlines wait until then (after a stall)
        self.down_since: float | None = None  # the bus down since then (None: it is up)
        self.cut_off = False             # clients were told to move on

    def swept(self, now: float, draining: bool) -> tuple[bool, float, bool]:
        """A sweep at ``now``: (sweep deadlines now, seconds the process stalled before
        it or 0, send the clients elsewhere now: stalled for ``evacuate_after``)."""
        gap = now - self.last
        self.last = now
        stalled = gap if gap > STALL else 0.0
        if stalled:
            self.hold_until = now + STALL_HOLD
        evacuate = stalled >= self.evacuate_after and not draining
        return now >= self.hold_until, stalled, evacuate

    def bus(self, now: float, available: bool, draining: bool) -> tuple[int, float]:
        """After a sweep's deadlines, the cluster bus ``available`` or not: (CUT_OFF, for
        how long it has been down) once, when the node is to send its clients elsewhere;
        REACHABLE_AGAIN once it is back; else NOTHING."""
        if available or draining:
            was = self.cut_off
            self.down_since, self.cut_off = None, False
            return (REACHABLE_AGAIN if was else NOTHING), 0.0
        if self.down_since is None:
            self.down_since = now
        elif not self.cut_off and now - self.down_since >= self.evacuate_after:
            self.cut_off = True
            return CUT_OFF, now - self.down_since
        assert not self.cut_off or now - self.down_since >= self.evacuate_after
        return NOTHING, 0.0


class Drain:
    """The drain's order (module docstring), one step at a time: ``next`` says what to do
    now; the shell does it and asks again (after ``WAIT``, at its next sweep)."""

    __slots__ = ("drain_timeout", "notice_wait", "phase", "until", "heard_by", "flush_by",
                 "unheard", "timed_out")

    def __init__(self, drain_timeout: float, notice_wait: float = NOTICE_WAIT) -> None:
        self.drain_timeout = drain_timeout
        self.notice_wait = min(notice_wait, drain_timeout)
        self.phase = "start"
        self.until = self.heard_by = self.flush_by = 0.0
        self.unheard = 0          # clients that had not answered the notice when it ended
        self.timed_out = False    # calls were still in flight at the drain's deadline

    def skip(self) -> None:
        """A second SIGTERM: stop waiting for clients and calls (the rest of the order,
        the hand-back and the last flush, still happens)."""
        self.heard_by = self.until = -1e18

    def next(self, now: float, flushed: bool, unheard: int, in_flight: int,
             pending: int) -> str:
        """What to do at ``now``: ``flushed`` the bus has nothing queued or unanswered
        (or there is none); ``unheard`` clients told that have not answered; ``in_flight``
        calls under way here (routed here or starting from other nodes), ``pending`` of
        them held by the router (what ``HAND_BACK`` can move)."""
        phase = self.phase
        if phase == "start":
            self.phase, self.flush_by = "announced", now + FLUSH_WAIT
            return ANNOUNCE
        if phase == "announced":
            if not flushed and now < self.flush_by:
                return WAIT
            self.phase = "told"
            if self.until != -1e18:  # not skipped already
                self.until = now + self.drain_timeout
                self.heard_by = now + self.notice_wait
            return TELL
        if phase == "told":
            if unheard and now < self.heard_by:
                return WAIT
            if in_flight and now < self.until:
                return WAIT
            self.unheard, self.timed_out = unheard, in_flight > 0
            self.phase, self.flush_by = "finishing", now + FLUSH_WAIT
            if pending:
                return HAND_BACK
            phase = "finishing"
        if phase == "finishing":
            if not flushed and now < self.flush_by:
                return WAIT
            self.phase = "closed"
            return CLOSE
        assert phase == "closed", phase
        return DONE
