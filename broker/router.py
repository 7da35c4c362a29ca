"""The RPC routing state machine of one node. Pure: no sockets, no clock, no tasks.

Events come in as method calls (a request from a caller, an accept, answer,
reject or error from a provider, a peer gone, a ``tick`` with ``now``);
messages go out through ``peer.send(msg)`` on the peers involved. The node
shell (broker/node.py) feeds it and flushes what peers were sent.

Per call (docs/protocol.md has the diagram)::

    request ──▶ choose an untried provider ──▶ AWAIT_ACK ──accept──▶ ACCEPTED
                        ▲                         │  │                 │
                        └── reject / ack timeout ─┘  └─── answer ──────┴──▶ done
                            / provider gone           (RESPONSE or ERROR)

* Every attempt gets a fresh id assigned here; only the provider chosen for
  that attempt can accept, answer or reject it. Anything else is dropped and
  counted (``late`` for ids no longer pending, ``foreign`` for the wrong peer).
* A finished call leaves the call table at once; its deadline entry (just the
  attempt id) is ignored when it comes due (clients/deadlines.py).
* Exactly one outcome reaches the caller: RESPONSE, or ERROR with one of
  NO_PROVIDER, RESPONSE_TIMEOUT, PROVIDER_ERROR, PROVIDER_GONE, INVALID_MESSAGE,
  CLUSTER_UNAVAILABLE (or a code a serving node reported).
  The response deadline is never retried (the provider may have run the call).
* No attempt starts once the call's time is up.

What it reads of peers and of the cluster is in broker/peers.py.

In a cluster the router also asks a ``ClusterView`` (cluster/link.py) for the
other nodes that provide a name, and chooses among them and its own providers
(broker/choice.py: ``Draws`` by weight under the ``cluster`` policy, the rates and
latencies under ``local-first``). A call for a name whose providers elsewhere are
being discovered waits, with its deadline, until ``resume(name)``. A node attempt
is first acknowledged (``ack``: the node has it) within the ack timeout;
after that it waits for the node's ACCEPT, answer or REJECT until the
call's deadline, and the node gets to try its own providers. A node attempt
with no ACK by the ack timeout is not moved at once: the node is asked
(``[ACK_CHECK, id]``) whether it started the attempt, as its ACK may just be
late; it answers ACK (started: wait for it) or REJECT (not started, and it
never will: move on). Only a node that stays silent for another ack timeout
is given up (CANCEL) and the call moved, so a late ACK never makes a call
run on two nodes.

Where its rules live: this class holds the tables (calls by attempt id, providers by
name, deadlines, the waiting queues) and the per-call path (``request``,
``_dispatch``, ``respond``, ``_conclude``), kept in few frames on purpose: each frame
less is about 1 % of a local call's instructions at the node. The rules of the
events that move the same tables but are not on that path are functions in modules
of their own, bound here as methods (listed after ``__init__``): streams
(broker/streams.py), call_all (broker/fanout.py), admission's queues
(broker/queueing.py), the deadline sweep (broker/sweep.py) and peers or the bus gone
(broker/departures.py). What a call holds is broker/calls.py; the peers' protocols
broker/peers.py; the choice broker/choice.py; the providers' figures
broker/figures.py; each target's pace broker/admission.py. This module is about 900
lines, most of them the per-call path and its docstrings.
"""

from __future__ import annotations

import random
from bisect import bisect_left
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Sequence, cast

from rpcbus import errors
from rpcbus.broker import departures, fanout, queueing, streams, sweep
from rpcbus.broker.admission import INITIAL_LIMIT, Waiting
from rpcbus.broker.calls import AllCall, Call, RouterStats, StreamCall
from rpcbus.broker.choice import LAT_FLOOR, POLICIES, QUIET, SLOWER, Draws, local_first
from rpcbus.broker.discovery import LAT_STEP, MinuteStats
from rpcbus.broker.fanout import Gather
from rpcbus.broker.figures import ProviderFigures, failed_at
from rpcbus.broker.peers import Caller, ClusterView, Peer, Provider
from rpcbus.broker.rpcstats import OTHER, RpcStatsTable
from rpcbus.deadlines import Deadlines
from rpcbus.protocol import (
    ACCEPT,
    ALL,
    CANCEL,
    DEFAULT_MAX_NAME,
    ERROR,
    MAX_ERROR_MESSAGE,
    REQUEST,
    RESPONSE,
    STREAM,
    valid_name,
)
from rpcbus.provider import Held
from rpcbus.schema import BOUNDS, Outcome

if TYPE_CHECKING:
    from rpcbus.broker.history import History
    from rpcbus.broker.weights import Weights

HISTORY_SAMPLE = 16  # the load history measures latency and sizes of 1 attempt in 16
_HISTORY_MASK = HISTORY_SAMPLE - 1
LAT_SAMPLE = 8      # attempts at a busy provider: 1 in this many is timed for ``lat``
_LAT_MASK = LAT_SAMPLE - 1
# REJECT reasons (docs/protocol.md): full now (may take it later); read after its ack window
BUSY, LATE = "BUSY", "LATE"
PROBE_GAP = 0.05  # s between a target's timed accepts (``Pace.probe``), at most
HELD = 0.02       # s: a frame that may have waited longer than this was read late


class Router:
    """Calls, attempts, deadlines and the choice of provider for one node."""

    # Slots, not a __dict__: past 30 attributes CPython 3.11 stops sharing an instance
    # dict's keys and every ``self.x`` on the hot path costs more (one attribute over
    # made request + respond 6 % dearer under callgrind)
    __slots__ = ("_calls", "_clock", "_deadlines", "_held",
                 "_held_after", "_now", "_paced",
                 "_parked", "_probing", "_provider_peers",
                 "_providers", "_seq",
                 "_waiting",
                 "ack_timeout", "ack_timeout_max", "cluster", "count_changed", "draining",
                 "draws", "figures", "history", "initial_concurrency", "local_first",
                 "max_concurrency", "max_fanout", "max_name", "max_timeout", "name",
                 "new_batch",
                 "prefer_local", "queue_interval", "queue_target", "read_at",
                 "response_timeout", "rpc_stats", "stats")

    def __init__(self, *, ack_timeout: float, response_timeout: float, max_timeout: float,
                 now: float, granularity: float = 0.01, max_name: int = DEFAULT_MAX_NAME,
                 rand: Callable[[], float] = random.random,
                 cluster: ClusterView | None = None, prefer_local: bool = False,
                 affinity: int = 1, policy: str = "cluster",
                 clock: Callable[[], float] | None = None, ack_timeout_max: float = 0.0,
                 queue_target: float = 0.1, queue_interval: float = 0.1,
                 max_concurrency: int = 10_000,
                 initial_concurrency: float = INITIAL_LIMIT, max_fanout: int = 0,
                 name: str = "") -> None:
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}, not {policy!r}")
        # each target's ack timeout follows it between these (broker/admission.py)
        self.ack_timeout = ack_timeout
        self.ack_timeout_max = max(ack_timeout_max, ack_timeout)
        # calls beyond every target's limit wait (``_waiting``, by name); once their waits
        # stay over ``queue_target`` for ``queue_interval``, new ones are shed OVERLOADED
        self.queue_target = queue_target
        self.queue_interval = queue_interval
        self.max_concurrency = max_concurrency  # the most attempts any one target holds
        self.max_fanout = max_fanout  # the most providers a call_all may reach (0: any)
        self.initial_concurrency = initial_concurrency  # a new provider's (a node's: more)
        self._waiting: dict[str, Waiting] = {}
        # how long a frame read now may have waited in this process (``tick`` runs every
        # ``granularity``): a call's time counts from when it may have come, not was read
        self._held = Held(granularity, now)
        self._held_after = granularity + HELD
        # targets with an attempt timed to its accept; targets with a pace (the sweep hands
        # them free slots). Dicts, not sets: walked in the order they came, so a seed of the
        # simulator replays exactly (a set's order follows the objects' addresses)
        self._probing: dict[Peer, None] = {}
        self._paced: dict[Peer, None] = {}
        # the ``now`` of the latest event that carried one: what an answer (which comes
        # without one) dispatches a waiting call by; at most a sweep old
        self._now = now
        self.response_timeout = response_timeout
        self.max_timeout = max_timeout
        self.max_name = max_name
        self.cluster = cluster
        self.prefer_local = prefer_local
        # the node drains: a client's call it cannot place is refused SHUTTING_DOWN (not
        # run: its SDK sends it to another node, where its provider may have moved)
        self.draining = False
        self.draws = Draws(rand, affinity)  # the ``cluster`` policy's choice, and weights
        # broker/choice.py, which weighs each provider's ``load`` and ``rate`` (kept only
        # under this policy); else weighted draws. Set at start, never changed after.
        self.local_first = policy == "local-first"
        # given: per-rpc metrics on, timed by the readings of this clock the shell sets as
        # ``read_at``; None: off
        self._clock = clock
        self.rpc_stats = RpcStatsTable()
        # the shell's fine clock (``time.perf_counter``) when it read what it is handling
        # (a frame, a bus batch, a tick): a call's start and its outcome's time (per-rpc
        # latency, with metrics on), an attempt's (``local-first``); one clock reading per
        # frame, not two per call
        self.read_at = 0.0
        self.name = name  # this node's, for call_all's replies
        self.history: History | None = None  # the load history, once it records (``record``)
        self._parked: dict[str, list[Call]] = {}
        # told (name, advertised) when what this node offers of a name changes (``join``)
        self.count_changed: Callable[[str, float], None] | None = None
        self._providers: dict[str, list[Peer]] = {}
        self._calls: dict[int, Call] = {}
        self._provider_peers: set[Peer] = set()  # peers that ever provided: only they hold attempts
        # their rates, latencies and last minutes, for the choice and the heartbeats
        self.figures = ProviderFigures(self._providers, self._provider_peers, self._calls, now)
        self._deadlines = Deadlines[int](granularity, now)
        self._seq = 0
        self.stats = RouterStats()
        # new_batch(): the calls handed in from here on came together (a client's frame),
        # so no draw made for earlier calls holds for them (``Draws``)
        self.new_batch: Callable[[], None] = self.draws.new_batch

    # -- rules kept beside this class: functions of the router in their own modules,
    # bound here as its methods (one lookup, as a method of its own) where the node or
    # this class calls them; those modules call each other's functions directly

    # streams (broker/streams.py): a call answered in parts, within its caller's credit
    part = streams.part
    credit = streams.credit
    _lost_parts = streams.lost_parts
    # call_all (broker/fanout.py): a child call per provider, a REPLY from each
    request_all = fanout.request_all
    reply = fanout.reply
    fanout_of = fanout.fanout_of
    _fan_out = fanout.fan_out
    # admission (broker/queueing.py): each target's pace, calls waiting for a slot, shedding
    admission = queueing.admission
    _pace = queueing.new_pace
    _free = queueing.free
    _enqueue = queueing.enqueue
    _release = queueing.release
    _reroute_waiting = queueing.reroute_waiting
    # the deadline sweep (broker/sweep.py): ack timeouts, response timeouts, waiting calls
    tick = sweep.tick
    # peers and the bus that go, and a drain's hand-back (broker/departures.py)
    drop_peer = departures.drop_peer
    cluster_down = departures.cluster_down
    cluster_up = departures.cluster_up
    lost = departures.lost
    fail_peer = departures.fail_peer
    hand_back = departures.hand_back

    # -- what a node can be asked about ------------------------------------------

    @property
    def now(self) -> float:
        """The ``now`` of the latest event that carried one (at most a sweep old)."""
        return self._now

    @property
    def rates_moved(self) -> bool:
        """The rates this node's providers serve moved far from what the last heartbeat
        told (``ProviderFigures.sample``): the cluster core sends the next one early."""
        return self.figures.rates_moved

    @property
    def pending(self) -> int:
        """Attempts in flight (each call has exactly one at a time)."""
        return len(self._calls)

    @property
    def timers(self) -> int:
        """Deadline entries not yet swept (ids of finished attempts wait there too)."""
        return len(self._deadlines)

    def providers_of(self, name: str) -> list[Peer]:
        return list(self._providers.get(name, ()))

    def history_pending(self) -> dict[Any, int]:
        """Attempts pending now per load-history row (for ``History.scan`` and ``roll``)."""
        counts: dict[Any, int] = {}
        for call in self._calls.values():
            row = call.hrow
            if row is not None:
                counts[row] = counts.get(row, 0) + 1
        return counts

    def provided_pairs(self) -> set[tuple[str, str]]:
        """(rpc, provider name) of every provider connected here (load-history presence)."""
        return {(name, p.provider_name) for name, peers in self._providers.items()
                for p in peers}

    def provider_counts(self) -> dict[str, int]:
        return {name: len(peers) for name, peers in self._providers.items()}

    def advertised(self, name: str) -> float:
        """What this node counts for in other nodes' weighted choice of ``name``: its
        number of providers, or with weights loaded the sum of their weights."""
        peers = self._providers.get(name, ())
        weights = self.draws.weights
        if weights is None:
            return len(peers)
        weight = weights.of
        return sum(weight(name, p.provider_name) for p in peers)

    # -- the node's own events -----------------------------------------------------

    def join(self, cluster: ClusterView, count_changed: Callable[[str, float], None]) -> None:
        """This node is in a cluster (cluster/core.py ``ClusterCore`` joins it, once): calls
        may go to other nodes' providers (``cluster``), and each change in what this node
        offers of a name is told to ``count_changed(name, advertised)``."""
        assert self.count_changed is None, "the router joined a cluster twice"
        self.cluster, self.count_changed = cluster, count_changed

    def record(self, history: History) -> None:
        """The node's load history records from now on (broker/history.py)."""
        assert self.history is None, "two load histories"
        self.history = history

    def drain(self) -> None:
        """The node stops: a client's call it cannot place here is refused SHUTTING_DOWN
        (not run: its SDK sends it to another node, where its provider may have moved)."""
        self.draining = True

    def limits_changed(self, max_fanout: int) -> None:
        """A reload changed ``limits.max_fanout``: call_alls from now on reach at most that
        many providers (0: any)."""
        assert max_fanout >= 0, max_fanout
        self.max_fanout = max_fanout

    def set_weights(self, weights: Weights | None) -> None:
        """Use ``weights`` (broker.weights.Weights, or None: all 1) from the next call on;
        what this node advertises for each name changes with them."""
        self.draws.set_weights(weights)
        if self.count_changed is not None:
            for name in self._providers:
                self.count_changed(name, self.advertised(name))

    # -- providers -----------------------------------------------------------------

    def provide(self, peer: Provider, names: list[str]) -> None:
        """Add ``peer`` as a provider of each name (idempotent)."""
        self._provider_peers.add(peer)
        if peer.minutes is None and not peer.is_node:
            peer.minutes = {}
        if peer.pace is None:
            self._pace(peer)
        for name in names:
            peers = self._providers.setdefault(name, [])
            if peer not in peers:
                peers.append(peer)
                self.draws.changed(name)  # draw again
                if self.count_changed is not None:
                    self.count_changed(name, self.advertised(name))
            peer.provides.add(name)
            if peer.minutes is not None and name not in peer.minutes:
                peer.minutes[name] = MinuteStats(self._now)
        if self._waiting:  # calls waiting for a slot may have one now
            self._release(peer, self._now)

    def unprovide(self, peer: Provider, names: list[str]) -> None:
        """Stop choosing ``peer`` for these names; its calls in flight go on."""
        for name in names:
            peers = self._providers.get(name)
            if peers is not None and peer in peers:
                peers.remove(peer)
                self.draws.changed(name)  # it may have been the drawn target
                if not peers:
                    del self._providers[name]
                    if name in self._waiting:  # its waiting calls may have no target now
                        self._reroute_waiting(name)
                if self.count_changed is not None:
                    self.count_changed(name, self.advertised(name))
            peer.provides.discard(name)
            if peer.minutes is not None:  # provided again, it is counted afresh
                peer.minutes.pop(name, None)

    def waiting(self, name: str) -> bool:
        """Calls are waiting for the discovery of ``name``."""
        return any(self._calls.get(c.id) is c for c in self._parked.get(name, ()))

    # -- calls -----------------------------------------------------------------------

    def request(self, caller: Caller, cid: int, name: str, data: Any,
                timeout_ms: int | None, now: float, traceparent: str | None = None,
                window: int = 0, age: float = 0.0) -> None:
        """A REQUEST (or an INVOKE from another node): route it, or answer an error.
        ``age``: how long its frame took to be read beyond the connection's least delay
        (its SENT): off its time left, as the time this process was held is.

        ``traceparent`` (W3C trace context) travels with every attempt to the provider.
        A ``cid`` of one of the caller's calls in flight is refused (INVALID_MESSAGE):
        every call is known by its caller's id alone. A ``window`` makes it a stream
        (STREAM): its provider answers in PARTs, at most ``window`` ahead of what the
        caller has read (its CREDITs: ``part``, ``credit``), then RESPONSE or ERROR ends
        it; a stream is routed, accepted, timed and cancelled as a call is."""
        calls = caller.calls
        if cid in calls:
            self.stats.duplicate_ids += 1
            caller.send([ERROR, cid, errors.INVALID_MESSAGE,
                         f"call id {cid} belongs to a call still in flight"])
            return
        caller.inflight += 1
        self._now = now
        timeout = self._time_left(timeout_ms, now, age)
        call = (Call(caller, cid, name, data, now + timeout) if not window else
                StreamCall(caller, cid, name, data, now + timeout, window))
        calls[cid] = call
        call.made = now - age
        if self._clock is not None:
            call.started = self.read_at
        if traceparent is not None:
            call.traceparent = traceparent
        if timeout <= 0:  # its caller's time ran out while the frame waited here unread
            self.stats.response_timeouts += 1
            self._conclude(call, [ERROR, cid, errors.RESPONSE_TIMEOUT,
                                  f"the call's time ran out before this node could read it "
                                  f"({name[:64]!r}; not run)"])
            return
        local = self._providers.get(name)
        if local is not None and (self.cluster is None or call.local_only):
            self._dispatch(call, local, (), now)  # served here: the common case, directly
            return
        if (local is None and (self.cluster is None or not self.cluster.knows(name))
                and not valid_name(name, self.max_name)):
            self.stats.invalid_names += 1
            self._conclude(call, [ERROR, cid, errors.INVALID_MESSAGE,
                                  f"invalid rpc name {name[:64]!r}"])
            return
        self._route(call, now, discover=True)

    def _time_left(self, timeout_ms: int | None, now: float, age: float) -> float:
        """A new call's time left (s): what its caller asked for (or the node's default),
        at most ``max_timeout``, less how long its frame may have waited to be read, when
        over ``HELD``: ``age`` (its SENT), or the time this process was held (stopped,
        starved) since its last sweep (the frame may have waited that long unread while
        its caller's clock ran on), whichever is longer."""
        if timeout_ms is None:
            timeout = self.response_timeout
        else:
            timeout = timeout_ms / 1000.0
            if timeout > self.max_timeout:
                timeout = self.max_timeout
        late = age
        if now - self._held.ticked > self._held_after:
            held = self._held.late_by(now)
            if held > late:
                late = held
        return timeout - late if late > HELD else timeout

    def resume(self, name: str, now: float) -> None:
        """Discovery of ``name`` finished: route the calls that waited for it (one batch
        for ``affinity``)."""
        self.new_batch()
        for call in self._parked.pop(name, ()):
            if self._calls.get(call.id) is call:  # not timed out meanwhile
                del self._calls[call.id]
                if type(call) is AllCall:
                    self._fan_out(call, now, discover=False)
                else:
                    self._route(call, now, discover=False)

    def ack(self, peer: Peer, *attempts: int) -> None:
        """A node has these attempts (one ACK names a batch's): each may try all its
        providers until the call's deadline."""
        calls = self._calls
        probe = peer.pace.probe if peer.pace is not None else 0
        for attempt in attempts:
            call = calls.get(attempt)  # _attempt_of, inlined (an ACK per cross call)
            if call is None or call.provider is not peer:
                self._stray(peer, attempt, None)
            elif not (call.acked or call.accepted):
                call.acked = True  # its ack deadline entry, when due, files the deadline
                if attempt == probe:
                    self._accepted(peer)

    def accept(self, peer: Peer, attempt: int, now: float) -> None:
        """The provider took the call: from now on only the response deadline applies."""
        call = self._attempt_of(peer, attempt)
        if call is None or call.accepted:
            return
        call.accepted = True  # its ack deadline entry, when due, files the call's deadline
        if peer.pace is not None and attempt == peer.pace.probe:
            self._accepted(peer)
        if call.caller.is_node:
            call.caller.send([ACCEPT, call.cid])  # tell the origin node

    def respond(self, peer: Peer, attempt: int, data: Any) -> None:
        """The provider's answer (an implicit accept): pass it to the caller. A stream's
        RESPONSE ends it; from another node its data is the number of parts sent, and a
        stream that got fewer ends with CLUSTER_UNAVAILABLE (parts lost on the bus)."""
        call = self._calls.pop(attempt, None)
        if call is None or call.provider is not peer:
            self._stray(peer, attempt, call)
            return
        if call.window > 0:  # a StreamCall (a slot read: cheaper than isinstance)
            if peer.is_node and data != cast(StreamCall, call).parts:
                self._calls[attempt] = call  # out of the tables as _lost_parts expects it
                self._lost_parts(call)
                return
            data = None
        peer.load -= 1  # as ``_took``, whose slot release comes after the answer here
        assert peer.load >= 0, peer.label
        if call.sent:
            took = self._timed(peer, call)
            pace = peer.pace
            assert pace is not None  # every target has one (``_dispatch``)
            if attempt == pace.probe:  # an answer is an accept too
                pace.accepted(took)
                self._probing.pop(peer, None)
        if call.hstart:  # a measured attempt of the load history (answers are derived)
            assert self.history is not None and call.hrow is not None
            self.history.answered(call.hrow, call.hstart, data)
        self.stats.ok += 1
        self._conclude(call, [RESPONSE, call.cid, data])
        if self._waiting:  # a slot freed: a waiting call takes it
            self._release(peer, self._now)

    def provider_error(self, peer: Peer, attempt: int, message: str,
                       code: str = errors.PROVIDER_ERROR, detail: Any = None) -> None:
        """The provider's handler failed (or, from a node, the call failed there);
        ``detail`` is an application error's ``[app_code, data]`` (code APP_ERROR)."""
        call = self._attempt_of(peer, attempt)
        if call is None:
            return
        self._end_attempt(call)
        if call.hrow is not None:
            self._history_end(call, Outcome.ERRORS)  # errors
        failed_at(peer, call)
        self.stats.provider_errors += 1
        self._conclude(call, [ERROR, call.cid, code, message[:MAX_ERROR_MESSAGE]]
                       if detail is None else
                       [ERROR, call.cid, code, message[:MAX_ERROR_MESSAGE], detail])

    def refuse_attempt(self, peer: Peer, attempt: int, code: str, message: str) -> None:
        """The attempt could not be handed to ``peer`` (its data cannot be encoded): the
        call ends with ``code``; the provider never saw it (history: rejected)."""
        call = self._attempt_of(peer, attempt)
        if call is None:
            return
        self._end_attempt(call, unrun=True)  # it never reached the provider
        if call.hrow is not None:
            self._history_end(call, Outcome.REJECTED)
        self._conclude(call, [ERROR, call.cid, code, message])

    def reject(self, peer: Peer, attempt: int, now: float, reason: str = "") -> None:
        """The provider (or node) declined, unrun: the call goes to another target not
        yet tried. ``reason`` BUSY (full now, or a node's OVERLOADED) halves the target's
        limit, LATE (read after half its ack window) also backs its ack timeout off; a
        provider's call may then come back to it (it waits for a slot, and is sent with
        the longer window), a node's goes elsewhere. Either way a call no target then
        takes ends OVERLOADED, not NO_PROVIDER."""
        call = self._attempt_of(peer, attempt)
        if call is None:
            return
        self._now = now
        self.stats.rejects += 1
        self._end_attempt(call, unrun=True)
        if call.hrow is not None:
            self._history_end(call, Outcome.REJECTED)  # rejected
        if reason == BUSY or reason == LATE:
            self.stats.busy += 1
            pace = peer.pace
            assert pace is not None  # a target that had an attempt
            call.slow = True
            if reason == LATE:
                pace.timed_out(now)
            else:
                pace.refused(now)
            if not peer.is_node and type(call.caller) is not Gather:
                # a provider full or slow now: the call may come back to it (a
                # call_all's child is that provider's alone: it ends, as for any REJECT)
                self.stats.retries += 1
                self._route(call, now, discover=False)
                return
            # a node whose providers were all too busy for it: another node, or none
        self._retry(call, now)

    def cancel_from(self, caller: Caller, cid: int) -> None:
        """The caller gave call ``cid`` up (a client's CANCEL, or the origin node's for an
        INVOKE): it leaves every table, its provider (a client, or the node it was sent
        to, which cancels it there) gets CANCEL, nobody is answered. One lookup: the
        cost does not grow with the calls in flight. An unknown ``cid`` is ignored."""
        call = caller.calls.get(cid)
        if call is not None:
            self._cancel(call)

    def _cancel(self, call: Call) -> None:
        if type(call) is AllCall:  # its children under way are cancelled
            call.gather.done = True
            if self._calls.get(call.id) is call:  # waiting for discovery
                del self._calls[call.id]
            for child in list(call.gather.calls.values()):
                self._cancel(child)
            del call.caller.calls[call.cid]
            call.caller.inflight -= 1
            self.stats.cancelled += 1
            return
        self._end_attempt(call)
        del call.caller.calls[call.cid]
        call.caller.inflight -= 1
        if call.hrow is not None:
            # the history has no outcome of its own for a call given up: its caller
            # stopped waiting, counted as a response timeout
            self._history_end(call, Outcome.RESPONSE_TIMEOUTS)
        self.stats.cancelled += 1
        if call.provider is not None and not call.provider.closed:
            call.provider.send([CANCEL, call.id])

    # -- internals -------------------------------------------------------------------

    def _attempt_of(self, peer: Peer, attempt: int) -> Call | None:
        call = self._calls.get(attempt)
        if call is None or call.provider is not peer:
            self._stray(peer, attempt, None)
            return None
        return call

    def _stray(self, peer: Peer, attempt: int, popped: Call | None) -> None:
        """A message about an attempt that is not pending, or not this peer's: count, drop."""
        if popped is not None:
            self._calls[attempt] = popped  # popped by respond(): it stays pending
        if attempt in self._calls:
            self.stats.foreign += 1
        else:
            self.stats.late += 1

    def _route(self, call: Call, now: float, discover: bool) -> None:
        """Find the targets of a call (a call out of every table) and dispatch it."""
        local = self._providers.get(call.name, ())
        cluster = self.cluster
        remote: Sequence[tuple[Peer, float]] = ()
        if not (cluster is None or call.local_only or (local and self.prefer_local)):
            found = cluster.targets(call.name, now, discover)
            if found is None:
                self._park(call)
                return
            remote = found
        self._dispatch(call, local, remote, now)

    def _park(self, call: Call) -> None:
        self.stats.parked += 1
        self._file_unsent(call)
        self._parked.setdefault(call.name, []).append(call)

    def _file_unsent(self, call: Call) -> None:
        """``call`` waits at no target (for discovery, or for a slot): it is in the call
        table under an attempt id of its own, with its deadline filed, so a CANCEL, its
        caller's leaving or its deadline finds it as any attempt's."""
        self._seq = attempt = self._seq + 1
        call.id = attempt
        call.provider = None
        call.accepted = call.acked = False
        call.checked = 0.0
        self._calls[attempt] = call
        self._deadlines.add(attempt, call.deadline)

    def _dispatch(self, call: Call, local: Sequence[Peer],
                  remote: Sequence[tuple[Peer, float]], now: float,
                  to: Peer | None = None) -> None:
        """Choose a target of ``call`` (out of every table) among ``local`` and ``remote``
        and send it a new attempt, or make the call wait for a slot (``_enqueue``);
        ``to``: a waiting call's target, which has room (``_release``). One function, not
        a choice and a send: every call passes here (a call frame less: 1.3 % of a local
        call's instructions at the node)."""
        tried = call.tried
        if to is not None:
            provider: Peer | None = to
        elif self.local_first:
            if (len(local) == 1 and tried is None and self.draws.weights is None
                    and (not remote or (local[0].rate < QUIET
                                        and local[0].steady <= SLOWER * LAT_FLOOR))):
                provider = local[0]  # alone, quiet, quick: nothing to weigh
            elif not local and len(remote) == 1 and tried is None:
                provider = remote[0][0] if remote[0][1] > 0 else None  # one target
            else:
                draws = self.draws
                provider = local_first(call.name, draws.local_weights(call.name, local),
                                       remote, tried, draws.rand)
                if (provider is not None and provider.is_node
                        and provider not in self._provider_peers):
                    self._provider_peers.add(provider)  # its ``rate``: what is sent there
        else:
            provider = self.draws.choose(call.name, local, remote, tried)
        if provider is None:
            self._no_target(call)
            return
        pace = provider.pace
        if pace is None:
            pace = self._pace(provider)
        # it holds all it may: another, or wait for a slot (a call_all's child is for
        # that one target: it goes, the fan-out is bounded by the providers' number)
        if provider.load >= pace.limit and to is None and type(call.caller) is not Gather:
            provider = self._free(call, local, remote)
            if provider is None:
                self._enqueue(call, now)
                return
            pace = provider.pace
            assert pace is not None  # ``_free`` takes targets with a pace
        left = call.deadline - now
        if left <= 0:
            self.stats.response_timeouts += 1
            self._conclude(call, [ERROR, call.cid, errors.RESPONSE_TIMEOUT,
                                  f"time ran out before a provider of {call.name!r} took the call"])
            return
        self._seq = attempt = self._seq + 1
        call.id = attempt
        call.provider = provider
        call.accepted = call.acked = False
        call.checked = 0.0
        call.begun = now
        self._calls[attempt] = call
        # what its choice and its limit weigh (its outstanding; ends in _took)
        if provider.load:  # its time measured for 1 attempt in LAT_SAMPLE
            call.sent = 0.0 if attempt & _LAT_MASK else self.read_at
            call.probe = False
        else:  # idle: always measured; if its ``lat`` shrank since last measured,
            # this attempt tries it again, alone (as slow as last seen until it
            # ends, which measures it afresh)
            call.sent = self.read_at
            call.probe = provider.lat < provider.seen
            if call.probe:
                provider.lat = provider.seen
                if provider.steady < provider.seen:
                    provider.steady = provider.seen
        provider.load += 1
        provider.attempts += 1
        minutes = provider.minutes  # its figures for this name (discovery)
        if minutes is not None and (stat := minutes.get(call.name)) is not None:
            stat.sent += 1
        # never past its limit (a call_all's child excepted: above)
        assert provider.load <= pace.limit + 1 or type(call.caller) is Gather, provider.label
        if not pace.probe and self.read_at >= pace.probe_at + PROBE_GAP:
            pace.probe = attempt  # timed to its accept (``_accepted``)
            pace.probe_at = call.sent = self.read_at
            self._probing[provider] = None
        if call.tried is None and not call.local_only:
            if provider.is_node:
                self.stats.remote_calls += 1
            else:
                self.stats.local_calls += 1
        history = self.history
        if history is not None and not provider.is_node:  # History.start, inlined (hot)
            # the provider's own row cache: rpc name -> row for calls routed here,
            # (name, origin) -> row for INVOKEs from other nodes (local_only: an INVOKE)
            slot = (call.name, call.caller.origin) if call.local_only else call.name
            try:
                row = provider.hrows[slot]
            except KeyError:
                row = history.row_for(provider, slot)
            row.started += 1
            call.hrow = row
            if not attempt & _HISTORY_MASK or not row.in_n:  # measured: 1 in 16, and the
                call.hstart = history.sample(row, call.data)  # row's first in this window
        ack = pace.rto
        if left > ack:
            self._deadlines.add(attempt, now + ack)
        else:
            self._deadlines.add(attempt, call.deadline)
        caller = call.caller
        if ack > self.ack_timeout and not provider.is_node:
            # its ack window is over the floor the client was told at AUTH: it judges the
            # REQUEST's freshness by this one (a node reads its own ``pace``)
            self._send_paced(call, provider, attempt, left, now, pace.ack_ms)
        elif call.window:
            if call.window > 0:  # a StreamCall: every field, its window last; no part yet
                stream = cast(StreamCall, call)
                stream.parts = stream.read = 0
                provider.send([STREAM, attempt, call.name, call.data, int(left * 1000) or 1,
                               caller.label, int(now * 1000), call.traceparent,
                               caller.user_name, call.window])
            else:  # a call_all's child at another node: its providers' REPLYs come back
                provider.send([ALL, attempt, call.name, call.data, int(left * 1000) or 1,
                               caller.label, int(now * 1000), call.traceparent,
                               caller.user_name])
        elif call.traceparent is None and caller.user_name is None:
            provider.send([REQUEST, attempt, call.name, call.data, int(left * 1000) or 1,
                           caller.label, int(now * 1000)])
        else:
            provider.send([REQUEST, attempt, call.name, call.data, int(left * 1000) or 1,
                           caller.label, int(now * 1000), call.traceparent, caller.user_name])

    def _send_paced(self, call: Call, provider: Peer, attempt: int, left: float, now: float,
                    ack_ms: int) -> None:
        """A REQUEST or STREAM with every field and the attempt's ack window last."""
        caller = call.caller
        provider.send([STREAM if call.window > 0 else REQUEST, attempt, call.name, call.data,
                       int(left * 1000) or 1, caller.label, int(now * 1000), call.traceparent,
                       caller.user_name, call.window if call.window > 0 else None, ack_ms])
        if call.window > 0:
            stream = cast(StreamCall, call)
            stream.parts = stream.read = 0

    def _accepted(self, peer: Peer) -> None:
        """``peer``'s timed attempt was accepted (or acknowledged) now."""
        pace = peer.pace
        assert pace is not None and pace.probe
        pace.accepted(self.read_at - pace.probe_at)
        self._probing.pop(peer, None)

    def _no_target(self, call: Call) -> None:
        if self.draining and not call.local_only and type(call.caller) is not Gather:
            self.stats.handed_back += 1
            self._conclude(call, [ERROR, call.cid, errors.SHUTTING_DOWN,
                                  f"the node is shutting down and no provider of "
                                  f"{call.name!r} took the call here: not run, call again "
                                  "on another node"])
            return
        if call.slow:  # its providers live, but each was too slow or full to take it
            self.stats.overloaded += 1
            hint = int(self.ack_timeout * 1000)
            self._conclude(call, [ERROR, call.cid, errors.OVERLOADED,
                                  f"every provider of {call.name!r} was too busy to take the "
                                  "call in time (not run); retry later", hint])
            return
        cluster = self.cluster
        if cluster is not None and not cluster.available and not call.local_only:
            self.stats.cluster_unavailable += 1
            self._conclude(call, [ERROR, call.cid, errors.CLUSTER_UNAVAILABLE,
                                  f"no local provider of {call.name!r} took the call and the "
                                  "cluster bus is down"])
            return
        if call.unsure:  # a node that provides it was too slow to answer: not "nobody"
            self.stats.cluster_unavailable += 1
            self._conclude(call, [ERROR, call.cid, errors.CLUSTER_UNAVAILABLE,
                                  f"no provider of {call.name!r} took the call: a node that "
                                  "provides it did not answer in time (not run)"])
            return
        self.stats.no_provider += 1
        if call.tried is None:
            self._conclude(call, [ERROR, call.cid, errors.NO_PROVIDER,
                                  f"no provider for {call.name!r}"])
        else:
            self._conclude(call, [ERROR, call.cid, errors.NO_PROVIDER,
                                  f"no provider of {call.name!r} took the call"])

    def _retry(self, call: Call, now: float) -> None:
        """Move a call (already out of the tables) to another untried target."""
        self.stats.retries += 1
        provider = call.provider
        assert provider is not None  # a call is retried from an attempt at a provider
        if type(call.caller) is Gather:  # a call_all's child stays with its target
            self._conclude(call, [ERROR, call.cid, errors.NO_PROVIDER,
                                  f"{provider.label} did not take the call (not run)"])
            return
        if call.tried is None:
            call.tried = {provider}
        else:
            call.tried.add(provider)
        self._route(call, now, discover=False)

    def _history_end(self, call: Call, outcome: Outcome) -> None:
        """History.end, inlined (hot): the attempt's outcome goes into its row."""
        row, call.hrow = call.hrow, None
        assert row is not None and self.history is not None  # callers check call.hrow
        row.outcomes[outcome] += 1
        if call.hstart:
            self.history.observe(row, call.hstart)
            call.hstart = 0.0

    def _end_attempt(self, call: Call, unrun: bool = False) -> None:
        """The current attempt leaves the call table (its deadline entry is ignored later).
        ``unrun``: its target declined it, or never got it: how soon is no latency of the
        target's (a quick refusal read as one made its no-load latency, ``Pace.long``,
        a fraction of its answers')."""
        del self._calls[call.id]
        if call.provider is not None:
            if unrun:
                call.sent = 0.0  # not timed (``_took``)
            self._took(call.provider, call)

    def _took(self, peer: Peer, call: Call) -> None:
        """``call``'s attempt at ``peer`` ended other than by its RESPONSE (``respond``
        ends those itself): one attempt less outstanding there, its time, when measured
        (``sent``), taken (``_timed``), and a waiting call may take the slot
        (``_release``)."""
        peer.load -= 1
        assert peer.load >= 0, peer.label
        if call.sent:
            self._timed(peer, call)
        if self._waiting:
            self._release(peer, self._now)

    def _timed(self, peer: Peer, call: Call) -> float:
        """How long ``call``'s attempt at ``peer`` took (it was ``sent``), now that it
        ended: it moves ``lat`` (peak EWMA: up at once, down ``LAT_STEP`` of the way; a
        probe's time is taken as it is), the provider's figures for the rpc, and, for
        one attempt in ``LAT_SAMPLE``, the target's limit. ``respond`` and ``_took``."""
        took = self.read_at - call.sent
        lat = peer.lat
        peer.lat = peer.seen = (took if took > lat or call.probe
                                else lat + LAT_STEP * (took - lat))
        minutes = peer.minutes
        if minutes is not None and (stat := minutes.get(call.name)) is not None:
            # MinuteStats.sample, inlined
            stat.buckets[bisect_left(BOUNDS, took)] += 1
            lat = stat.seen
            stat.seen = took if took > lat else lat + LAT_STEP * (took - lat)
        pace = peer.pace
        if pace is not None and not call.id & _LAT_MASK:
            pace.sample(took, peer.load + 1, self.read_at)
        return took

    def _provided(self, name: str, msg: list[Any]) -> bool:
        """``name`` is (or was, for this answer) provided here or on another node: junk
        names, called and never provided, share one metrics row and push no real one out."""
        cluster = self.cluster
        return (msg[0] == RESPONSE or name in self._providers
                or (cluster is not None and cluster.provided(name)))

    def _conclude(self, call: Call, msg: list[Any],
                  held: deque[tuple[float, Any, list[Any]]] | None = None,
                  due: float = 0.0) -> None:
        """The call's one outcome; the call must already be out of every table. With
        ``held``, its reply goes there, to be sent at ``due`` (broker/queueing.py ``send_held``)."""
        if not call.local_only:  # a call of this node's own caller (an INVOKE is the origin's)
            answered = msg[0] == RESPONSE
            if answered:
                self.stats.calls_ok += 1
            else:
                self.stats.calls_failed += 1
            if self._clock is not None:
                stats = self.rpc_stats.by_name.get(call.name)
                if stats is None:  # a row of its own only for a name somebody provides
                    stats = self.rpc_stats.get(call.name if self._provided(call.name, msg)
                                               else OTHER)
                took = self.read_at - call.started
                if answered:  # RpcStats.answered, inlined (every call passes here)
                    stats.ok += 1
                    stats.buckets[bisect_left(BOUNDS, took)] += 1
                    stats.sum += took
                else:
                    stats.error(msg[2], took)
        caller = call.caller
        caller.inflight -= 1
        del caller.calls[call.cid]
        if caller.closed:
            self.stats.discarded += 1
        elif held is not None:
            held.append((due, caller, msg))
        else:
            caller.send(msg)
