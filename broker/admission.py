"""Admission: how long the node waits for a target to accept, how many attempts it lets
a target hold, and the calls that wait for a free slot. Pure: no clock, no asyncio.

A busy provider is not a missing one. Three rules keep "slow" from reading as "gone":

``Pace`` (one per provider or node the router sends attempts to)
  * its **ack timeout** follows the target, as TCP's retransmission timer does
    (RFC 6298): a smoothed accept time ``srtt`` and its deviation ``rttvar`` from
    accept-time samples, ``rto = srtt + 4 * rttvar`` between the node's
    ``rpc.ack_timeout`` (the floor: what a quiet target gets) and
    ``rpc.ack_timeout_max`` (the ceiling). An attempt that times out doubles it (to
    the ceiling) until the next sample (RFC 6298 5.5). One attempt at a time is timed
    (``probe``), so measuring costs nothing per call.
  * its **concurrency limit** is found from its own latency, in the shape of Netflix's
    Gradient2 limiter: a no-load latency and each sample's; while the target holds
    at least half its limit, ``limit * clamp(TOLERANCE * max(long, QUEUE_FLOOR) /
    sample, 0.5, 1) + sqrt(limit)``, smoothed. A target that refuses an attempt because
    it is full or read it too late (``refused``), or times out (``timed_out``), has its
    limit halved, once per ``rto`` (one congestion event).
    While the target holds under half its limit the limit is not what holds calls back,
    and nothing is learnt of it; it then decays, as TCP's window does while its sender
    has less to send (RFC 7661): its part above twice the most attempts held lately
    halves every ``IDLE_DECAY`` s. Kept whole, the limit of a quiet spell (256 at
    first) met the next jump in calls: at three times capacity a provider of 8 threads
    was handed 256 calls at once, and its queue, not the node's, made them wait 190 ms.
    As TCP keeps three quarters of its window as ``ssthresh`` then, a decayed limit
    remembers three quarters of what it was (``regrow``) and grows back ``REGROW``
    times a sample while latency stays flat (a provider of async handlers that takes a
    thousand calls at once after a quiet spell is not held to the slow climb of
    ``sqrt(limit)`` a sample); the first sample that shows a queue ends that.
    The long-term latency is the quickest answer seen (a refusal's quick time is
    none), drifting up slowly (as Vegas's no-load latency is): a mean would count the
    queue a busy target already has as its own.
    It drifts by time (``LONG_TIME``), not by sample: drifting a fixed share per sample,
    a busy target's long-term latency followed its own queue within a second (samples
    come hundreds a second), the limit grew with it, and so did every call's latency
    for as long as the overload lasted.
    It counts as at least ``QUEUE_FLOOR``: an attempt that takes a few ms at a quick
    target spends them in the node's and the client's own loop turns, which grow with
    the calls under way as each turn carries more of them (and costs less per call),
    not in a queue at the target; read as one, they held a local call's throughput
    to two thirds.

``Waiting`` (one per rpc name with calls waiting)
  calls beyond every target's limit wait here, earliest deadline first, and go out
  as slots free (the router's ``_release``). Its delay is judged as CoDel judges a
  queue: each call's wait is measured when it leaves; once waits have stayed above
  ``target`` for ``interval`` while calls kept coming and the queue got no shorter,
  it is *standing*: a call that has waited, or would wait, longer than its patience
  is shed (``OVERLOADED``: not run, safe to retry, with the current wait as a hint),
  until a wait falls under ``target`` or an interval passes with no call coming.
  The patience tells sustained overload from a burst being worked off:
  * *outpaced*: over the last interval this node's callers made ``OUTPACE`` times
    more calls of the name than left for a target (each counted from when its caller
    made it, its frame's SENT: ``fresh``). More is asked than can be served, and a
    longer wait only makes every answer later: the patience is ``target`` less what
    the target's own queue adds to an answer (``slower``: its latency lately, the
    router's ``lat``, over its no-load one, ``Pace.long``; half the target at least),
    so an overload makes an answered call later by about ``target`` in all; it stays
    so while calls keep coming that fast (waits then stay under it: the longer ones
    are shed). With the whole target as patience, answers at three times capacity came
    the target plus the provider's queue later than at 0.8 times. A call that came
    while outpaced keeps that patience when the calls slow down (``outpaced_until``):
    the last calls of an overload are not a burst (served as one, they were answered
    up to 140 ms after they came);
  * otherwise the calls were made before the queue stood (a client's 10,000 calls
    at once, read over seconds on a busy machine, or sent again as slots free) or
    come from other nodes (their origin judges them): the patience is half the time
    a call had left when it came, or ``target`` if longer. A caller that gives a call
    30 s means it may wait; 10,000 such calls at once on a machine at load 40 waited
    up to 13 s and were all served. A burst that drains is served, not shed.

  Waiting an interval before judging keeps a burst from being shed, but the calls that
  come meanwhile wait up to ``target`` plus ``interval``: at three times capacity they
  were the slowest 5 % of the calls answered. So when the first wait passes ``target``
  the queue is judged at once, outpaced, if its callers made calls in the last half
  ``target`` ``EARLY_OUTPACE`` times faster than the queue served them since it began
  (when the calls were made, from their SENT: a burst made at once, however slowly
  read, counts at its one moment), and enough were served to tell (``EARLY_COUNT`` per
  half target; a slower name, or one whose provider is moving, waits the interval).

  Counts cannot tell callers that make more calls than are served (an open loop: the
  shed ones do not come back) from a few callers that call again at once whenever a
  call is shed (a closed loop: each shed call comes back within a round trip, so the
  sheds themselves look like calls outpacing the providers, and shedding goes on after
  what began it has passed). So an outpaced queue is *probed* every ``PROBE_EVERY``
  intervals (``probe``): for two intervals its sheds' replies are held back (each
  goes out two intervals late, so none during the probe; calls are shed as before,
  and answered calls wait no longer), and the second interval's count decides. An
  open loop's calls keep coming; a closed loop's come only as calls are answered: it
  is no longer outpaced, and the calls that come back as the held replies go out are
  not counted as new (``owed``).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from typing import Any

MIN_LIMIT = 2.0          # attempts a target may always hold
INITIAL_LIMIT = 256.0    # a new target's limit (a node: NODE_LIMIT)
NODE_LIMIT = 256.0       # a node's, at least: what is beyond it waits here, not at that node
PATIENCE = 0.5           # of a call's time left when it came: how long it may wait
OUTPACE = 1.25           # calls coming this many times faster than served: overloaded
PROBE_EVERY = 4          # intervals an outpaced queue sheds between probes (docstring)
EARLY_OUTPACE = 2.0      # calls made this many times faster than served: outpaced at once
EARLY_COUNT = 16         # ... when at least this many were served per half target (docstring)
RECENT = 4096            # made times kept for that judgement (more: it counts fewer)
TOLERANCE = 1.5          # latency up to this times the long-term one is not queueing
QUEUE_FLOOR = 0.005      # s: the long-term latency counts as at least this (docstring)
SMOOTHING = 0.2          # of the way to each new limit
LONG_TIME = 30.0         # s: the long-term latency drifts up to a slower target's in about this
LONG_SHARE = 0.05        # of the way one sample moves it at most (it may have met a burst's queue)
IDLE_DECAY = 1.0         # s: an unused limit's excess over twice the load halves in this
REGROW = 1.5             # times a decayed limit grows per sample while latency stays flat
ALPHA, BETA, K = 0.125, 0.25, 4.0  # RFC 6298's gains and deviation factor


class Pace:
    """One target's ack timeout and concurrency limit (module docstring)."""

    __slots__ = ("floor", "ceiling", "srtt", "rttvar", "rto", "ack_ms", "limit", "max_limit",
                 "long", "drifted", "probe", "probe_at", "cut_until", "peak", "decayed",
                 "regrow")

    def __init__(self, floor: float, ceiling: float, limit: float = INITIAL_LIMIT,
                 max_limit: float = 10_000.0) -> None:
        assert 0 < floor <= ceiling, (floor, ceiling)
        self.floor = floor
        self.ceiling = ceiling
        self.srtt = 0.0          # 0: no accept time measured yet
        self.rttvar = 0.0
        self.rto = floor         # seconds an attempt may wait for its accept
        self.ack_ms = int(floor * 1000)  # the same in ms, as messages carry it
        self.limit = min(limit, max_limit)
        self.max_limit = max_limit
        self.long = 0.0          # long-term latency of an attempt (0: none yet)
        self.drifted = 0.0       # when it last moved (``sample``)
        self.probe = 0           # the attempt being timed to its accept (0: none)
        self.probe_at = 0.0      # when it was sent (the router's fine clock)
        self.cut_until = -1e18   # until when refusals belong to the last cut's event
        self.peak = 0            # the most attempts held since ``decayed`` (limit unused)
        self.decayed = 0.0       # when the limit last decayed, or was last in use
        self.regrow = 0.0        # what a decayed limit may grow back to while latency is flat

    def accepted(self, took: float) -> None:
        """The timed attempt was accepted ``took`` s after it was sent (RFC 6298 2.2-2.3)."""
        self.probe = 0
        if took < 0:
            return
        if self.srtt == 0.0:
            self.srtt, self.rttvar = took, took / 2
        else:
            self.rttvar += BETA * (abs(self.srtt - took) - self.rttvar)
            self.srtt += ALPHA * (took - self.srtt)
        rto = self.srtt + K * self.rttvar
        self.rto = self.floor if rto < self.floor else self.ceiling if rto > self.ceiling else rto
        self.ack_ms = int(self.rto * 1000)
        assert self.floor <= self.rto <= self.ceiling

    def timed_out(self, now: float) -> None:
        """An attempt was not accepted within ``rto`` (at ``now``): back off (RFC 6298
        5.5), and hold fewer attempts there; once per congestion event (``refused``)."""
        self.probe = 0
        if now < self.cut_until:
            return
        self.rto = min(self.rto * 2, self.ceiling)
        self.ack_ms = int(self.rto * 1000)
        self.refused(now)

    def refused(self, now: float) -> None:
        """The target turned an attempt away unrun (at ``now``), being full or late:
        halve its limit. What was sent before a cut is refused or times out within an
        ``rto`` of it: those are the same congestion event, cut once (as TCP halves its
        window once per window of losses), or a burst of a hundred would leave the
        target the minimum for a long climb back."""
        if now < self.cut_until:
            return
        self.limit = max(MIN_LIMIT, self.limit / 2)
        self.cut_until = now + self.rto

    def sample(self, took: float, load: int, now: float) -> None:
        """An attempt ended ``took`` s after it was sent, with ``load`` attempts held there,
        at ``now``: the limit moves toward what that latency says (module docstring)."""
        if took <= 0:
            return
        long = self.long
        if long == 0.0 or took < long:  # the quickest seen: the target without a queue
            self.long = long = took
        else:  # drifting up slowly, so a target that got slower for good is re-learnt
            share = (now - self.drifted) / LONG_TIME
            share = share if share < LONG_SHARE else LONG_SHARE
            self.long = long = long + (took - long) * share
        self.drifted = now
        limit = self.limit
        if load < limit / 2:  # it is not what holds the calls back: nothing learnt of it
            self._unused(load, now)
            return
        self.peak, self.decayed = 0, now
        gradient = TOLERANCE * (long if long > QUEUE_FLOOR else QUEUE_FLOOR) / took
        if gradient >= 1.0 and limit < self.regrow:  # flat latency: back up at once
            self.limit = limit * REGROW if limit * REGROW < self.regrow else self.regrow
            return
        self.regrow = 0.0  # it queues (or got there): its own latency leads from here
        gradient = 0.5 if gradient < 0.5 else 1.0 if gradient > 1.0 else gradient
        new = limit * gradient + math.sqrt(limit)
        limit += SMOOTHING * (new - limit)
        self.limit = MIN_LIMIT if limit < MIN_LIMIT else min(limit, self.max_limit)

    def _unused(self, load: int, now: float) -> None:
        """A sample with ``load`` held, under half the limit: once per ``IDLE_DECAY``, the
        limit's part above twice the most held since then halves (per ``IDLE_DECAY``
        elapsed; module docstring)."""
        peak = self.peak if self.peak > load else load
        if self.decayed == 0.0:  # its first sample: the time is counted from now
            self.decayed = now
        elapsed = now - self.decayed
        if elapsed >= IDLE_DECAY:
            keep = 2.0 * peak if peak > MIN_LIMIT else MIN_LIMIT
            if self.limit > keep:
                if 0.75 * self.limit > self.regrow:  # RFC 7661's ssthresh
                    self.regrow = 0.75 * self.limit
                self.limit = keep + (self.limit - keep) * 0.5 ** (elapsed / IDLE_DECAY)
            peak, self.decayed = load, now
        self.peak = peak
        assert self.limit >= MIN_LIMIT


class Waiting:
    """The calls of one rpc name waiting for a free slot: earliest deadline first, with
    CoDel's judgement of a standing queue (module docstring). Entries of calls that
    ended meanwhile stay until they reach the head (``head`` skips them)."""

    __slots__ = ("heap", "above_since", "length_then", "arrived", "arrived_then", "fresh",
                 "fresh_then", "served", "served_then", "standing", "outpaced",
                 "stood_until", "stood_outpaced", "waited", "_seq", "probing", "probe_at",
                 "probe_start", "probe_fresh", "probe_served", "held", "owed", "began",
                 "served_began", "recent", "slower", "outpaced_until")

    def __init__(self) -> None:
        self.heap: list[tuple[float, int, Any]] = []  # (deadline, seq, call)
        self.above_since = 0.0  # when waits went over target and stayed (0: they are not)
        self.length_then = 0    # the queue's length then
        self.arrived = 0        # calls that came to wait (or were shed coming), ever
        self.arrived_then = 0   # ... by ``above_since``
        self.fresh = 0          # of those, this node's callers' made since ``above_since``
        self.fresh_then = 0     # ... by ``above_since``
        self.served = 0         # calls that left it for a target, ever
        self.served_then = 0    # ... by ``above_since``
        self.standing = False   # it stands: long waits and new calls are shed
        self.outpaced = False   # ... and calls come faster than they are served
        self.stood_until = -1e18  # when it last stopped standing
        self.stood_outpaced = False  # ... outpaced then
        self.waited = 0.0       # the last wait measured (s): the hint shed calls get
        self._seq = 0
        self.probing = False    # a probe holds the sheds' replies back (``probe``)
        self.probe_at = 0.0     # when the next probe begins (0: none due)
        self.probe_start = 0.0  # when this one began
        self.probe_fresh = -1   # ``fresh`` as its second interval began (-1: not yet)
        self.probe_served = 0   # ``served`` then
        # (when due, caller, reply) of calls shed in it, in the order they were shed
        self.held: deque[tuple[float, Any, Any]] = deque()
        self.owed = 0           # fresh calls not counted: callers calling again (``probe``)
        self.began = 0.0        # when calls last began to wait in it (it was empty)
        self.served_began = 0   # ``served`` then
        self.recent: deque[float] = deque(maxlen=RECENT)  # when this node's calls were made
        self.slower = 0.0       # s later than at no load the last call's target answers now
        self.outpaced_until = -1e18  # when calls last stopped outpacing: those that came
        # before came in that overload, and keep its patience (broker/queueing.py ``patience``)

    def __len__(self) -> int:
        return len(self.heap)

    def push(self, call: Any, now: float = 0.0, made: float | None = None) -> None:
        """``call`` waits from ``now``; ``made``: when one of this node's callers made it
        (None: another node's call, which its origin judges)."""
        if not self.heap:
            self.began, self.served_began = now, self.served
        self._seq += 1
        self.came(made)
        if made is not None:
            self.recent.append(made)
        heapq.heappush(self.heap, (call.deadline, self._seq, call))

    def came(self, made: float | None) -> None:
        """A call came, to wait (``push``) or shed at once: counted for ``judge``; fresh
        when one of this node's callers made it (``made``) since waits went over target."""
        self.arrived += 1
        if made is not None and made >= self.above_since:
            if self.owed:  # a caller whose held shed just went out, calling again
                self.owed -= 1
            else:
                self.fresh += 1

    def head(self, live: Any) -> Any:
        """The waiting call with the earliest deadline that ``live(call)`` still says
        waits, or None; ended ones before it are dropped."""
        heap = self.heap
        while heap:
            call = heap[0][2]
            if live(call):
                return call
            heapq.heappop(heap)
        return None

    def pop(self) -> Any:
        """Take the head (``head`` found it live)."""
        return heapq.heappop(self.heap)[2]

    def first(self, live: Any, fits: Any) -> Any:
        """The live waiting call with the earliest deadline that ``fits(call)``, or None
        (the head did not fit: a call that tried a target does not hold back those
        behind it from that target's slots). The calls passed over keep their places."""
        heap, passed, found = self.heap, [], None
        while heap:
            call = heap[0][2]
            if not live(call):
                heapq.heappop(heap)
            elif fits(call):
                found = call
                break
            else:
                passed.append(heapq.heappop(heap))
        for entry in passed:
            heapq.heappush(heap, entry)
        return found

    def take(self, call: Any) -> None:
        """Take ``call`` (``head`` or ``first`` found it); the calls before it keep
        their places."""
        heap = self.heap
        if heap[0][2] is call:  # the head: as nearly always
            heapq.heappop(heap)
            return
        passed = []
        while heap[0][2] is not call:
            passed.append(heapq.heappop(heap))
        heapq.heappop(heap)
        for entry in passed:
            heapq.heappush(heap, entry)

    def judge(self, waited: float, now: float, target: float, interval: float) -> bool:
        """The head leaves after waiting ``waited`` s: is the queue standing? It starts
        to when waits stayed over ``target`` for ``interval`` while calls kept coming and
        the queue got no shorter, or at once (outpaced as it was) when it stood within
        the last few intervals; it stops when a wait falls under target (outpaced: when
        the queue empties, or an interval's calls no longer come faster than served),
        or an interval passes with no call coming (a burst that drains is served, not
        shed). ``outpaced`` is judged each interval while it stands (module docstring).
        """
        self.waited = waited
        length = len(self.heap)
        if length == 0 or (waited < target and not self.outpaced):
            # (outpaced, waits stay under target as the longer ones are shed: it stands
            # until the queue empties or calls no longer come faster than served)
            self._stop(now)
            self.above_since = 0.0
        elif self.above_since == 0.0:
            self.above_since, self.length_then = now, length
            self.arrived_then, self.served_then = self.arrived, self.served
            self.fresh_then = self.fresh
            if now - self.stood_until < 4 * interval:
                # it stood a moment ago (its calls all shed, or served): the overload
                # goes on, as it was
                self.standing, self.outpaced = True, self.stood_outpaced
            elif self._outpacing(now, target):
                self.standing = self.outpaced = True
        elif now - self.above_since >= interval:
            coming = self.arrived - self.arrived_then
            if not coming:
                self._stop(now)
            else:
                if not self.standing and length >= self.length_then:
                    self.standing = True
                # calls come faster than they leave for a target: more callers than
                # capacity, not one burst being worked off (its calls come as others end)
                if self.standing and self.fresh - self.fresh_then > OUTPACE * (
                        self.served - self.served_then):
                    self.outpaced = True
                else:
                    self._calm(now)
                if waited < target and not self.outpaced:
                    self._stop(now)  # calls come no faster than served now
            self.above_since, self.length_then = now, length  # judged again next interval
            self.arrived_then, self.served_then = self.arrived, self.served
            self.fresh_then = self.fresh
        assert not self.standing or waited >= target or self.outpaced
        assert self.standing or not self.outpaced
        return self.standing

    def _outpacing(self, now: float, target: float) -> bool:
        """Calls made in the last half ``target`` came ``EARLY_OUTPACE`` times faster than
        the queue has served them since it began, with ``EARLY_COUNT`` served per half
        target at least (module docstring): it is outpaced, no need to wait and see."""
        span, served = now - self.began, self.served - self.served_began
        half = target / 2
        if span < target or served * half < EARLY_COUNT * span:
            return False
        since, made = now - half, 0
        for at in reversed(self.recent):  # made in about the order they came
            if at >= since:
                made += 1
            elif at < since - target:
                break
        return made * span > EARLY_OUTPACE * served * half

    def probe(self, now: float, interval: float) -> list[tuple[Any, Any]]:
        """The router's tick: start, measure or end a probe of an outpaced queue (module
        docstring; it ends after two intervals, whatever else happens). Returns the
        held (caller, reply) pairs due to go out, each two intervals after its shed."""
        if self.probing:
            if now < self.probe_start + 2 * interval:
                if self.probe_fresh < 0 and now >= self.probe_start + interval:
                    # the calls whose sheds went out before it have come back: count now
                    self.probe_fresh, self.probe_served = self.fresh, self.served
                return []
            self.probing = False
            fresh = self.fresh - self.probe_fresh if self.probe_fresh >= 0 else 0
            served = self.served - self.probe_served
            if fresh > OUTPACE * served:  # calls kept coming while none were told
                self.probe_at = now + PROBE_EVERY * interval
            else:  # they came as others were answered: a closed loop, not outpaced
                self.outpaced = self.stood_outpaced = False
                self.outpaced_until = -1e18  # (a closed loop: it was no overload)
                self.probe_at = 0.0
                self.owed = len(self.held)
        elif self.outpaced or (self.stood_outpaced
                               and now - self.stood_until < 4 * interval):
            if self.probe_at == 0.0:
                self.probe_at = now + PROBE_EVERY * interval
            elif now >= self.probe_at and not self.held:
                self.probing, self.probe_start, self.probe_fresh = True, now, -1
                return []
        else:
            self.probe_at = 0.0
        held, due = self.held, []
        while held and held[0][0] <= now:
            _, caller, reply = held.popleft()
            due.append((caller, reply))
        return due

    def release(self) -> list[tuple[Any, Any]]:
        """Every held (caller, reply) pair, now: the queue is going away (its name's
        targets changed, or the node stops), so nothing will send them at their time."""
        released = [(caller, reply) for _, caller, reply in self.held]
        self.held.clear()
        return released

    def _stop(self, now: float) -> None:
        if self.standing:
            self.standing, self.stood_until = False, now
            self.stood_outpaced = self.outpaced
        self._calm(now)

    def _calm(self, now: float) -> None:
        """Calls no longer come faster than served (from ``now``): the calls that came
        before keep the patience of that overload (``outpaced_until``)."""
        if self.outpaced:
            self.outpaced, self.outpaced_until = False, now
