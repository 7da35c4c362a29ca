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

Why one module this long (about 1,700 lines): every event of a call (request,
ACK, ACCEPT, answer, REJECT, error, CANCEL, a deadline, a peer or the bus gone) moves
the one state ``Call`` holds, and streams and call_all are calls with a few more
events, so their rules read and assert against the same tables. What does not move
that state lives apart: the peers' protocols (broker/peers.py), the choice (broker/choice.py),
the providers' figures (broker/figures.py), admission (broker/admission.py) and
call_all's gathering (broker/fanout.py). The per-call path (``request``,
``_dispatch``, ``respond``, ``_conclude``) is kept in few frames on purpose: each
frame less is about 1 % of a local call's instructions at the node.
"""

from __future__ import annotations

import random
from bisect import bisect_left
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence, cast

from rpcbus import errors
from rpcbus.broker.admission import INITIAL_LIMIT, NODE_LIMIT, PATIENCE, Pace, Waiting
from rpcbus.broker.choice import LAT_FLOOR, POLICIES, QUIET, SLOWER, Draws, local_first
from rpcbus.broker.discovery import HALF, LAT_STEP, MinuteStats
from rpcbus.broker.fanout import Gather
from rpcbus.broker.figures import RATE_SAMPLE, ProviderFigures, failed_at
from rpcbus.broker.peers import Caller, ClusterView, Peer, Provider
from rpcbus.broker.rpcstats import OTHER, RpcStatsTable
from rpcbus.deadlines import Deadlines
from rpcbus.protocol import (
    ACCEPT,
    ACK_CHECK,
    ALL,
    CANCEL,
    CREDIT,
    DEFAULT_MAX_NAME,
    ERROR,
    MAX_ERROR_MESSAGE,
    PART,
    REPLY,
    REQUEST,
    RESPONSE,
    STREAM,
    valid_name,
)
from rpcbus.provider import Held
from rpcbus.schema import BOUNDS, Outcome

if TYPE_CHECKING:
    from rpcbus.broker.history import History, Row
    from rpcbus.broker.weights import Weights

HISTORY_SAMPLE = 16  # the load history measures latency and sizes of 1 attempt in 16
_HISTORY_MASK = HISTORY_SAMPLE - 1
LAT_SAMPLE = 8      # attempts at a busy provider: 1 in this many is timed for ``lat``
_LAT_MASK = LAT_SAMPLE - 1
# REJECT reasons (docs/protocol.md): full now (may take it later); read after its ack window
BUSY, LATE = "BUSY", "LATE"
PROBE_GAP = 0.05  # s between a target's timed accepts (``Pace.probe``), at most
HELD = 0.02       # s: a frame that may have waited longer than this was read late
# ``Call.checked`` of an attempt at another node while the bus resets (``cluster_down``):
# waiting for the bus to come back, then asked again after it did (``cluster_up``)
BUS_DOWN, ASKED_AGAIN = -1.0, -2.0


class Call:
    """One call from a caller, across all its attempts."""

    __slots__ = ("id", "caller", "cid", "name", "data", "deadline", "provider",
                 "accepted", "acked", "checked", "tried", "local_only", "started",
                 "traceparent", "hrow", "hstart", "unsure", "sent", "probe", "window",
                 "queued", "slow", "begun", "made")
    # set by each dispatch (see the end of __init__)
    id: int
    provider: Peer | None
    accepted: bool
    acked: bool
    checked: float
    begun: float

    def __init__(self, caller: Caller, cid: int, name: str, data: Any, deadline: float) -> None:
        self.caller = caller
        self.cid = cid                    # the caller's own id for the call
        self.name = name
        self.data = data
        self.deadline = deadline
        self.tried: set[Peer] | None = None  # earlier providers; None while on the first
        self.local_only = caller.is_node     # an INVOKE: never forwarded to a third node
        self.started = 0.0                   # ``read_at`` when it came (metrics on)
        self.traceparent: str | None = None
        self.hrow: Row | None = None         # the current attempt's load-history row
        self.hstart = 0.0
        self.unsure = False                  # a node it was sent to stayed silent
        self.sent = 0.0                      # ``read_at`` of its timed attempt, else 0
        self.probe = False                   # its attempt tries an idle provider again
        self.queued = -1.0                   # ``_now`` when it began waiting for a slot
        self.slow = False                    # a provider was too slow or full to take it
        self.made = 0.0                      # when its caller made it, as far as known
        # a stream's credit window (StreamCall); -1: a call_all's child sent to a node,
        # which runs it on each of its providers (broker/fanout.py); 0: a call
        self.window = 0
        # id (the current attempt's), provider, accepted, acked and checked (when the
        # node was asked whether it started the attempt; 0.0: not; BUS_DOWN or ASKED_AGAIN
        # while the bus reset: ``cluster_down``) are set by each dispatch, and begun (when
        # the attempt was sent) by each that sends one.


class StreamCall(Call):
    """A stream: a call answered in parts, at most ``window`` beyond what its caller has
    ``read`` (``parts``: those passed to the caller; both start over with each attempt,
    which none has reached before its first part)."""

    __slots__ = ("parts", "read")

    def __init__(self, caller: Caller, cid: int, name: str, data: Any, deadline: float,
                 window: int) -> None:
        super().__init__(caller, cid, name, data, deadline)
        self.window = window
        self.parts = self.read = 0



class AllCall(Call):
    """A call_all of a caller (broker/fanout.py): never sent itself; its children are."""

    __slots__ = ("gather",)

    def __init__(self, caller: Caller, cid: int, name: str, data: Any, deadline: float) -> None:
        super().__init__(caller, cid, name, data, deadline)
        self.id = -1            # none until it waits for discovery (``_park``)
        self.provider = None
        self.gather: Gather


class RouterStats:
    """Counters; every drop is counted here (the node logs and exports them)."""

    __slots__ = ("ok", "provider_errors", "no_provider", "response_timeouts",
                 "ack_timeouts", "rejects", "provider_gone", "retries", "late", "foreign",
                 "discarded", "invalid_names", "parked", "cluster_unavailable", "cancelled",
                 "ack_checks", "calls_ok", "calls_failed", "duplicate_ids", "local_calls",
                 "remote_calls", "parts", "stream_overruns", "parts_lost",
                 "accept_timeouts", "overloaded", "waited", "shed", "busy", "fanout_refused",
                 "bus_waits", "answers_lost", "handed_back")
    ok: int
    provider_errors: int
    no_provider: int
    response_timeouts: int
    ack_timeouts: int
    rejects: int
    provider_gone: int
    retries: int
    late: int
    foreign: int
    discarded: int
    invalid_names: int
    parked: int
    cluster_unavailable: int
    cancelled: int
    ack_checks: int
    # Calls of this node's own callers that ended (answered / failed). A call that crosses
    # nodes also ends as an INVOKE on the node that served it, which the counters above
    # count there too: sum these over nodes to count each call once.
    calls_ok: int
    calls_failed: int
    duplicate_ids: int  # REQUESTs refused: the caller's id belongs to a call in flight
    # first attempts of this node's own callers' calls: to a provider here / another node
    local_calls: int
    remote_calls: int
    parts: int            # stream parts passed on to their callers
    stream_overruns: int  # streams ended: their provider sent a part past its credit
    parts_lost: int       # streams ended: a part from another node never came (or twice)
    accept_timeouts: int  # calls ended ACCEPT_TIMEOUT: a provider that may run a call
    #                       before it accepts (deepstream's) did not accept in time
    overloaded: int       # calls ended OVERLOADED (not run): shed, or no slot in time
    waited: int           # calls that waited for a free slot (broker/admission.py)
    shed: int             # of those ended OVERLOADED: shed on arrival (a standing queue)
    busy: int             # attempts a provider or node turned away full, or read too late
    fanout_refused: int   # call_alls that would reach more than limits.max_fanout (not run)
    bus_waits: int        # attempts at other nodes that waited through a bus reset
    answers_lost: int     # of the CLUSTER_UNAVAILABLE: ran at a node, the answer lost
    handed_back: int      # calls a draining node refused SHUTTING_DOWN (not run): their
    #                       callers send them to another node

    def __init__(self) -> None:
        for name in self.__slots__:
            setattr(self, name, 0)

    def failed(self) -> int:
        """Calls that ended with an error (``ok + failed()``: every call ended)."""
        return (self.provider_errors + self.no_provider + self.response_timeouts
                + self.provider_gone + self.cluster_unavailable + self.invalid_names
                + self.accept_timeouts + self.overloaded)

    def as_dict(self) -> dict[str, int]:
        return {**{name: getattr(self, name) for name in self.__slots__},
                "failed": self.failed()}


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

    def fanout_of(self, name: str, now: float) -> int:
        """The providers of ``name`` a call_all made now would reach, as far as this node
        knows without asking (what its caller is charged: broker/session_policy.py)."""
        local = len(self._providers.get(name, ()))
        cluster = self.cluster
        if cluster is None or not cluster.knows(name):
            return local
        return _reach(local, cluster.targets(name, now, False) or ())

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

    def admission(self, most: int = 32) -> dict[str, Any]:
        """What admission holds now (``/stats``): per target (the ``most`` busiest), its
        attempts held, concurrency limit, ack timeout, no-load and recent latency; per
        name with calls waiting, how many and whether its queue stands."""
        paced = sorted((p for p in self._provider_peers if p.pace is not None),
                       key=lambda p: -p.load)[:most]
        return {
            "targets": {p.label: {"load": p.load, "limit": round(p.pace.limit, 1),
                                  "ack_timeout_ms": p.pace.ack_ms,
                                  "no_load_ms": round(p.pace.long * 1000, 2),
                                  "latency_ms": round(p.lat * 1000, 2)}
                        for p in paced if p.pace is not None},
            "waiting": {name: {"calls": len(q), "standing": q.standing,
                               "outpaced": q.outpaced, "waited_ms": int(q.waited * 1000)}
                        for name, q in self._waiting.items() if len(q)},
        }

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

    def drop_peer(self, peer: Peer, now: float, acks_may_follow: bool = False) -> None:
        """``peer`` is gone. Attempts it accepted — or, a node, acknowledged — fail now
        with PROVIDER_GONE (they may have run; re-routing them could run them twice). Its
        other attempts never started there and go elsewhere at once — except at a node
        whose ACKs may still be on their way (``acks_may_follow``: declared dead for its
        silence, it may only be paused and still start an INVOKE younger than half the
        ack timeout; replaced by a new process, its ACK may come through another Redis
        shard than the news): those wait for their ack deadline, where ``tick`` makes
        sure this node hears the bus (``ClusterView.probe``) and, an ack timeout later,
        moves them only if it does (``settled``), else ends them CLUSTER_UNAVAILABLE.

        Calls it made as a caller are cancelled, as by its CANCEL: their providers (here
        or on the nodes they went to) get CANCEL, so nobody works for a caller that left.
        """
        calls = peer.calls
        while calls:  # one at a time: cancelling one may free a slot another then takes
            self._cancel(next(iter(calls.values())))
        if peer not in self._provider_peers and not peer.is_node:
            return
        self._provider_peers.discard(peer)
        self.figures.forget(peer)
        self._probing.pop(peer, None)
        self._paced.pop(peer, None)
        if peer.provides:  # one that provides keeps a set of its own (a Provider)
            # in name order: a set's order follows the process's string hashing, and
            # what this sends (PROVIDER_UPDATEs) would differ between runs of a seed
            self.unprovide(cast(Provider, peer), sorted(peer.provides))
        if self.history is not None and not peer.is_node:
            self.history.forget(peer)
        for call in [c for c in self._calls.values() if c.provider is peer]:
            if acks_may_follow and not (call.accepted or call.acked):
                continue  # its ack deadline settles it
            self._end_attempt(call)
            if call.hrow is not None:
                self._history_end(call, Outcome.ERRORS)  # errors: the provider left
            if (call.accepted or call.acked or call.id <= peer.accepted_upto
                    or peer.runs_before_accept):
                self.stats.provider_gone += 1
                self._conclude(call, [ERROR, call.cid, errors.PROVIDER_GONE,
                                      f"the provider of {call.name!r} is gone"])
            else:
                self._retry(call, now)
        if peer.is_node and self._waiting:  # calls waiting for it go where they now can
            for name in list(self._waiting):
                self._reroute_waiting(name)

    def cluster_down(self, now: float) -> None:
        """The bus session ended (it reconnects by itself); waiting calls resume.

        A call at another node waits for the bus to come back, until its deadline
        (``cluster_up`` then asks that node what became of it): it may be running there,
        so it is neither moved nor failed. A stream or a call_all's child at another node
        fails CLUSTER_UNAVAILABLE: parts or replies sent meanwhile are lost. Calls waiting
        for discovery go to local providers, if any.
        """
        for call in [c for c in self._calls.values() if c.provider is not None
                     and c.provider.is_node]:
            node = call.provider
            assert node is not None  # (the filter's)
            if call.window:
                self._end_attempt(call)
                self.stats.cluster_unavailable += 1
                self._conclude(call, [ERROR, call.cid, errors.CLUSTER_UNAVAILABLE,
                                      "the cluster bus went down during the call"])
            else:
                self.stats.bus_waits += 1
                call.checked = BUS_DOWN  # its deadline entries wait for the bus (``tick``)
                call.sent = 0.0  # its time, gap included, measures nothing of the node
                pace = node.pace
                if pace is not None and pace.probe == call.id:  # nor its accept time
                    pace.probe = 0
                    self._probing.pop(node, None)
        for name in list(self._parked):
            self.resume(name, now)

    def cluster_up(self, now: float) -> None:
        """The bus is back: each call that waited through the reset at another node is
        asked about there (``[ACK_CHECK, id, age_ms]``; ``age_ms`` -1: its ACK came, so it
        started). That node answers ACK (still running: its answer will come), REJECT
        (never started, and never will: the call moves) or DONE (it ran and answered, and
        the answer was lost while this node was away: ``lost``). One that is not
        answered within the node's ack timeout ends CLUSTER_UNAVAILABLE, never moved."""
        for call in [c for c in self._calls.values() if c.checked == BUS_DOWN]:
            provider = call.provider
            assert provider is not None and provider.is_node, "held, yet not at a node"
            call.checked = ASKED_AGAIN
            if not provider.closed:
                provider.send([ACK_CHECK, call.id,
                               -1 if call.acked else int((now - call.begun) * 1000)])
            if not call.acked:
                pace = provider.pace
                due = now + (pace.rto if pace is not None else self.ack_timeout)
                self._deadlines.add(call.id, due if due < call.deadline else call.deadline)

    def lost(self, peer: Peer, attempt: int) -> None:
        """The node ran ``attempt`` and sent its answer, which never came (lost on the bus
        while this node's subscription was down): the call ends CLUSTER_UNAVAILABLE, a
        code that says it may have run."""
        call = self._attempt_of(peer, attempt)
        if call is None:
            return
        self._end_attempt(call)
        self.stats.cluster_unavailable += 1
        self.stats.answers_lost += 1
        self._conclude(call, [ERROR, call.cid, errors.CLUSTER_UNAVAILABLE,
                              f"node {peer.label} took the call and answered it, but the "
                              "answer was lost on the cluster bus (it may have run)"])

    def fail_peer(self, peer: Peer, code: str, message: str) -> None:
        """Every attempt at ``peer`` ends with ``code`` (their outcome cannot be known
        here, so they neither wait nor move); the peer stays."""
        for call in [c for c in self._calls.values() if c.provider is peer]:
            self._end_attempt(call)
            if code == errors.CLUSTER_UNAVAILABLE:
                self.stats.cluster_unavailable += 1
            if not peer.closed:
                peer.send([CANCEL, call.id])
            self._conclude(call, [ERROR, call.cid, code, message])

    def waiting(self, name: str) -> bool:
        """Calls are waiting for the discovery of ``name``."""
        return any(self._calls.get(c.id) is c for c in self._parked.get(name, ()))

    def hand_back(self) -> int:
        """The node stops: calls still waiting for discovery or for a free slot (no
        provider holds them, and none ran) are answered SHUTTING_DOWN, which tells their
        callers to send them to another node. Returns how many.
        """
        handed = 0
        for queue in self._waiting.values():
            self._send_held(queue.release())
        waiting: dict[str, list[Call]] = {name: [entry[2] for entry in queue.heap]
                                          for name, queue in self._waiting.items()}
        self._waiting.clear()
        for name in list(self._parked):
            waiting.setdefault(name, []).extend(self._parked.pop(name))
        for calls in waiting.values():
            for call in calls:
                if self._calls.get(call.id) is call:
                    self._end_attempt(call)
                    handed += 1
                    self.stats.handed_back += 1
                    self._conclude(call, [ERROR, call.cid, errors.SHUTTING_DOWN,
                                          "the node is shutting down: not run, call again "
                                          "on another node"])
        return handed

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

    def request_all(self, caller: Caller, cid: int, name: str, data: Any,
                    timeout_ms: int | None, now: float, traceparent: str | None = None,
                    max_replies: int = 0, age: float = 0.0) -> None:
        """An ALL (call_all; from another node, for its providers here only): a REPLY per
        provider of ``name`` across the cluster, then RESPONSE with their number
        (broker/fanout.py). Refused as a REQUEST would be: a duplicate id, a bad name.
        Its time left is a REQUEST's (``age``: ``request``)."""
        if cid in caller.calls:
            self.stats.duplicate_ids += 1
            caller.send([ERROR, cid, errors.INVALID_MESSAGE,
                         f"call id {cid} belongs to a call still in flight"])
            return
        caller.inflight += 1
        call = AllCall(caller, cid, name, data, now + self._time_left(timeout_ms, now, age))
        caller.calls[cid] = call
        call.gather = Gather(self, call, max_replies)
        if self._clock is not None:
            call.started = self.read_at
        call.traceparent = traceparent
        if (name not in self._providers and (self.cluster is None or not self.cluster.knows(name))
                and not valid_name(name, self.max_name)):
            self.stats.invalid_names += 1
            self._conclude(call, [ERROR, cid, errors.INVALID_MESSAGE,
                                  f"invalid rpc name {name[:64]!r}"])
            return
        self._fan_out(call, now, discover=True)

    def _fan_out(self, call: AllCall, now: float, discover: bool) -> None:
        """A child call per target (pinned to it), or, the cluster not yet knowing who
        provides the name, the call waits for discovery (``resume``)."""
        remote: Sequence[tuple[Peer, float]] = ()
        if self.cluster is not None and not call.local_only:
            found = self.cluster.targets(call.name, now, discover)
            if found is None:
                self._park(call)
                return
            remote = found
        gather = call.gather
        local = self._providers.get(call.name, ())
        reach = _reach(len(local), remote)
        if self.max_fanout and reach > self.max_fanout:
            self.stats.fanout_refused += 1
            self._conclude(call, [ERROR, call.cid, errors.LIMIT_EXCEEDED,
                                  f"a call_all of {call.name!r} would reach {reach} providers; "
                                  f"this node allows {self.max_fanout} (limits.max_fanout): "
                                  "not run"])
            return
        gather.fanning = True  # a child that ends at once does not end the call_all yet
        targets: list[tuple[Peer, str, bool]] = [(p, p.label, False) for p in local]
        targets += [(node, node.label, True) for node, weight in remote if weight > 0]
        for i, (target, label, whole) in enumerate(targets, 1):
            child = Call(gather, i, call.name, call.data, call.deadline)
            child.local_only = True   # counted once, as its call_all, not as a call
            child.traceparent = call.traceparent
            if whole:
                child.window = -1
            gather.calls[i] = child
            gather.inflight += 1
            gather.targets[i] = (label, target.label if whole else self.name, whole)
            self._dispatch(child, () if whole else (target,), ((target, 1.0),) if whole
                           else (), now)
        gather.fanning = False
        if not gather.calls:  # nobody provides it, or every child ended at once
            self.gathered(gather)

    def reply(self, peer: Peer, attempt: int, provider: str, data: Any,
              error: list[Any] | None) -> None:
        """A REPLY from another node for a call_all child sent there: one of its
        providers' answer (``error``: ``[code, message, detail?]``). One the bus delivered
        twice is dropped."""
        call = self._calls.get(attempt)
        gather = call.caller if call is not None else None
        if call is None or call.provider is not peer or not isinstance(gather, Gather):
            self._stray(peer, attempt, None)
            return
        call.accepted = True  # the node runs it: never moved now
        key = (peer.label, provider)
        if key in gather.replied:
            self.stats.late += 1
        elif not gather.done:
            gather.replied.add(key)
            self.reply_of(gather, provider, peer.label, data, error)

    def reply_of(self, gather: Gather, provider: str, node: str, data: Any,
                 error: list[Any] | None) -> None:
        """A REPLY to the call_all's caller; the call_all ends at ``max_replies``."""
        gather.replies += 1
        parent = gather.parent
        caller = parent.caller
        if caller.closed:
            self.stats.discarded += 1
        else:
            caller.send([REPLY, parent.cid, provider, node, data] if error is None else
                        [REPLY, parent.cid, provider, node, None, list(error)])
        if gather.max_replies and gather.replies >= gather.max_replies:
            self.gathered(gather)

    def gathered(self, gather: Gather) -> None:
        """Every child ended, or ``max_replies`` came: the children under way are
        cancelled and the caller gets RESPONSE with the number of replies."""
        if gather.done:
            return
        gather.done = True
        for child in list(gather.calls.values()):
            self._cancel(child)
        parent = gather.parent
        self._conclude(parent, [RESPONSE, parent.cid, gather.replies])

    def part(self, peer: Peer, attempt: int, data: Any, seq: int = -1) -> None:
        """A part of a stream's answer (an implicit accept): pass it to the caller. One
        past the window ahead of what the caller read, or for a call that is not a
        stream, ends it with PROVIDER_ERROR and CANCELs the attempt: no node holds more
        than the window. From another node, ``seq`` numbers it: one seen already (the
        bus delivered it twice) is dropped, one after a gap ends the stream
        CLUSTER_UNAVAILABLE (parts lost on the bus)."""
        call = self._calls.get(attempt)
        if call is None or call.provider is not peer:
            self._stray(peer, attempt, None)
            return
        if isinstance(call, StreamCall) and seq >= 0 and seq != call.parts:
            if seq < call.parts:
                self.stats.late += 1  # a duplicate
            else:
                self._lost_parts(call)
            return
        if not isinstance(call, StreamCall) or call.parts - call.read >= call.window:
            self.stats.stream_overruns += 1
            self._end_attempt(call)
            if call.hrow is not None:
                self._history_end(call, Outcome.ERRORS)
            if not peer.closed:
                peer.send([CANCEL, attempt])
            self.stats.provider_errors += 1
            self._conclude(call, [ERROR, call.cid, errors.PROVIDER_ERROR,
                                  f"the provider of {call.name!r} sent a part past its "
                                  "credit" if call.window else
                                  f"the provider of {call.name!r} answered a call in parts"])
            return
        call.parts += 1
        call.accepted = True  # a part implies the accept: the stream is never moved now
        self.stats.parts += 1
        caller = call.caller
        if caller.closed:
            self.stats.discarded += 1
        else:
            caller.send([PART, call.cid, data])

    def credit(self, caller: Caller, cid: int, read: int) -> None:
        """The caller has read ``read`` parts of stream ``cid`` in all (never more than
        were passed to it): its provider may send up to the window beyond. An older or
        repeated count, an unknown id or a call are ignored."""
        call = caller.calls.get(cid)
        if not isinstance(call, StreamCall):
            return
        if read > call.parts:
            read = call.parts
        if read <= call.read:
            return
        call.read = read
        provider = call.provider
        if provider is not None and not provider.closed:
            provider.send([CREDIT, call.id, read])

    def _lost_parts(self, call: Call) -> None:
        """A part of a stream from another node did not come (or its end counted more):
        the stream ends CLUSTER_UNAVAILABLE, the node is told to stop it."""
        self.stats.parts_lost += 1
        self._end_attempt(call)
        provider = call.provider
        if provider is not None and not provider.closed:
            provider.send([CANCEL, call.id])
        self.stats.cluster_unavailable += 1
        self._conclude(call, [ERROR, call.cid, errors.CLUSTER_UNAVAILABLE,
                              f"parts of the stream of {call.name!r} were lost on the "
                              "cluster bus"])

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

    def tick(self, now: float) -> None:
        """Apply every deadline due by ``now``: ack timeouts retry (``_not_acked``),
        response timeouts fail (``_too_late``). Slots freed meanwhile go to waiting calls;
        the providers' figures move on (``ProviderFigures.sample`` and ``rotate``)."""
        self._now = now
        self._held.tick(now)
        figures = self.figures
        if self._probing and now >= figures.sampled + RATE_SAMPLE:
            self._check_probes()
        if self._waiting:  # slots are handed over as they free; the sweep makes sure
            interval = self.queue_interval
            for queue in self._waiting.values():
                if queue.outpaced or queue.probing or queue.stood_outpaced or queue.held:
                    self._send_held(queue.probe(now, interval))
            if self.cluster is not None:
                self._pace_new_nodes(now)
            for peer in list(self._paced):
                if peer.pace is not None and peer.load < peer.pace.limit:
                    self._release(peer, now)
        if now >= figures.rotated + HALF:  # each provider's last minute moves on (discovery)
            figures.rotate(now)
        if now >= figures.sampled + RATE_SAMPLE and self.local_first:
            figures.sample(now)  # each provider's rate, lat and steady move on
        calls = self._calls
        for attempt in self._deadlines.expire(now):
            call = calls.get(attempt)
            if call is None:
                continue                  # finished long ago: its id just waited here
            if now >= call.deadline:
                self._give_up(call, attempt, self._too_late(call, now), now)
            elif (call.accepted or call.acked or call.provider is None
                  or attempt <= call.provider.accepted_upto):
                # The ack deadline of an attempt acknowledged since (or a parked call's
                # entry): only now file its response deadline, so the many calls that
                # finish first cost no entry.
                self._deadlines.add(attempt, call.deadline)
            else:
                self._not_acked(call, call.provider, attempt, now)

    def _too_late(self, call: Call, now: float) -> list[Any]:
        """``call``'s deadline passed: the ERROR its caller gets, counted."""
        if call.queued >= 0:
            # waited for a free slot all its time: never sent (not run)
            self.stats.overloaded += 1
            msg = [ERROR, call.cid, errors.OVERLOADED,
                   f"every provider of {call.name!r} was busy: no slot came free within "
                   f"the call's deadline (waited {now - call.queued:.3f} s; not run)",
                   int(self.queue_target * 1000)]
        elif call.provider is None:
            # waiting for discovery: it never left this node (not run). Known to have
            # no provider (one moving off a stopping node did not reappear in time):
            # NO_PROVIDER; not known, as the cluster has not answered: that is no
            # "nobody provides it"
            if self.cluster is not None and not self.cluster.knows(call.name):
                self.stats.cluster_unavailable += 1
                msg = [ERROR, call.cid, errors.CLUSTER_UNAVAILABLE,
                       f"the cluster did not say in time who provides {call.name!r} "
                       "(not run)"]
            else:
                self.stats.no_provider += 1
                msg = [ERROR, call.cid, errors.NO_PROVIDER,
                       f"no provider of {call.name!r} was found within the call's "
                       "deadline (not run)"]
        elif call.checked == BUS_DOWN:
            # at another node, and this node's bus still down: that, not the provider
            assert call.provider is not None, "held for the bus, yet at no node"
            self.stats.cluster_unavailable += 1
            msg = [ERROR, call.cid, errors.CLUSTER_UNAVAILABLE,
                   f"the cluster bus was down until the call's deadline (it may have "
                   f"run at node {call.provider.label})"]
        else:
            self.stats.response_timeouts += 1
            msg = [ERROR, call.cid, errors.RESPONSE_TIMEOUT,
                   f"no response from {call.name!r} in time"]
        return msg

    def _not_acked(self, call: Call, provider: Peer, attempt: int, now: float) -> None:
        """``attempt`` at ``provider`` reached its ack timeout unacknowledged: a node is
        asked whether it started it (the ask's own timeout comes here again), else the
        attempt is given up (``_give_up``): the call moves on, or fails where moving it
        could run it twice."""
        if call.checked < 0:  # at a node when the bus went down (``cluster_down``)
            if call.checked == BUS_DOWN:  # still down: it waits, as it may be running
                self._deadlines.add(attempt, call.deadline)
                return
            # asked after the bus came back, and not answered: nothing tells
            self.stats.cluster_unavailable += 1
            msg = [ERROR, call.cid, errors.CLUSTER_UNAVAILABLE,
                   f"node {provider.label} did not say, after this node's cluster "
                   "bus came back, whether it ran the call"]
        elif provider.is_node and not call.checked:
            # No ACK yet from a node: ask before moving the call (it may have started).
            # A node given up is not asked, but this node still makes sure it would
            # hear an ACK still on its way before it moves the call (``settled``).
            self.stats.ack_checks += 1
            call.checked = now
            if not provider.closed:
                provider.send([ACK_CHECK, attempt])
            elif self.cluster is not None:
                self.cluster.probe()
            pace = provider.pace
            due = now + (pace.rto if pace is not None else self.ack_timeout)
            self._deadlines.add(attempt, due if due < call.deadline else call.deadline)
            return
        elif (provider.is_node and self.cluster is not None
              and not self.cluster.settled(provider, call.checked)):
            # Silent, but this node cannot show it would have heard an ACK: moving
            # the call could run it twice. Its outcome is unknown here.
            self.stats.cluster_unavailable += 1
            msg = [ERROR, call.cid, errors.CLUSTER_UNAVAILABLE,
                   f"cannot tell whether node {provider.label} started the call: "
                   "this node does not hear the cluster bus"]
        elif provider.runs_before_accept:  # it may be running it: never moved
            self.stats.ack_timeouts += 1
            self.stats.accept_timeouts += 1
            msg = [ERROR, call.cid, errors.ACCEPT_TIMEOUT,
                   f"the provider of {call.name!r} did not accept the call in time "
                   "(it may have run)"]
        else:
            self.stats.ack_timeouts += 1
            msg = None
            pace = provider.pace
            if pace is not None:  # it was slow to take it: wait longer there, send less
                pace.timed_out(now)
                self._probing.pop(provider, None)
            if not provider.is_node:
                call.slow = True
        self._give_up(call, attempt, msg, now)

    def _give_up(self, call: Call, attempt: int, msg: list[Any] | None, now: float) -> None:
        """End ``attempt`` (cancelled at its provider): the call ends with ``msg``, or with
        None moves to another provider."""
        del self._calls[attempt]
        if call.provider is not None:
            self._took(call.provider, call)
        if call.hrow is not None:
            self._history_end(call, Outcome.RESPONSE_TIMEOUTS
                              if msg is not None and msg[2] != errors.ACCEPT_TIMEOUT
                              else Outcome.ACK_TIMEOUTS)
        provider = call.provider
        if provider is not None and not provider.closed:
            provider.send([CANCEL, attempt])
        if msg is not None:
            if provider is not None:
                failed_at(provider, call)  # it did not answer in time
            self._conclude(call, msg)
            return
        assert provider is not None  # parked calls (no provider) never come here
        if provider.is_node and self.cluster is not None:
            self.cluster.silent(call.name, provider)
            call.unsure = True
        self._retry(call, now)

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
        self._seq = attempt = self._seq + 1
        call.id = attempt
        call.provider = None
        call.accepted = call.acked = False
        call.checked = 0.0
        self._calls[attempt] = call
        self._deadlines.add(attempt, call.deadline)
        self._parked.setdefault(call.name, []).append(call)

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

    # -- admission (broker/admission.py) ---------------------------------------------

    def _pace(self, peer: Peer) -> Pace:
        """A new target's ack timeout and limit (a node's: all its providers behind it)."""
        self._paced[peer] = None
        pace = peer.pace = Pace(self.ack_timeout, self.ack_timeout_max,
                                max(NODE_LIMIT, self.initial_concurrency) if peer.is_node
                                else self.initial_concurrency,
                                self.max_concurrency)
        return pace

    def _accepted(self, peer: Peer) -> None:
        """``peer``'s timed attempt was accepted (or acknowledged) now."""
        pace = peer.pace
        assert pace is not None and pace.probe
        pace.accepted(self.read_at - pace.probe_at)
        self._probing.pop(peer, None)

    def _check_probes(self) -> None:
        """Timed attempts accepted by an ACCEPT_UPTO (which names no attempt) are seen here,
        within a rate sample; one that ended otherwise is no sample."""
        for peer in list(self._probing):
            pace = peer.pace
            assert pace is not None
            call = self._calls.get(pace.probe)
            if call is None or call.provider is not peer:
                pace.probe = 0
                self._probing.pop(peer, None)
            elif call.accepted or call.acked or pace.probe <= peer.accepted_upto:
                self._accepted(peer)

    def _free(self, call: Call, local: Sequence[Peer],
              remote: Sequence[tuple[Peer, float]]) -> Peer | None:
        """The target the choice picked is full: the least loaded one of the others with
        room (by load over limit), not tried yet; None when every one is full."""
        tried = call.tried
        best: Peer | None = None
        fill = 1.0
        for peer in [*local, *(p for p, n in remote if n > 0)]:
            if peer.closed or (tried is not None and peer in tried):
                continue
            pace = peer.pace
            if pace is None:  # a node never sent a call (it joined, or came back under
                pace = self._pace(peer)  # its name): all its room is free
            if peer.load / pace.limit < fill:
                best, fill = peer, peer.load / pace.limit
        return best

    def _pace_new_nodes(self, now: float) -> None:
        """Nodes that came to provide a waiting name (joined, or came back under their
        names after a restart) get a pace, so the sweep hands them waiting calls: a
        slot's freeing hands out only the slots of targets that have one, and callers
        that wait for their answers send nothing new that would find these nodes."""
        cluster = self.cluster
        assert cluster is not None
        for name in self._waiting:
            for peer, count in cluster.targets(name, now, False) or ():
                if count > 0 and peer.pace is None and not peer.closed:
                    self._pace(peer)

    def _enqueue(self, call: Call, now: float) -> None:
        """Every target of ``call`` is full: it waits for a slot, earliest deadline first,
        unless the name's queue is standing (broker/admission.py ``Waiting.judge``): then
        it is shed at once, OVERLOADED (not run)."""
        queue = self._waiting.get(call.name)
        if queue is None:
            queue = self._waiting[call.name] = Waiting()
        call.queued = now
        made = None if call.local_only else call.made  # None: another node's call
        if queue.standing:
            head = queue.head(self._is_waiting)
            if head is not None and now - head.queued > self._patience(
                    call.deadline - now, now, queue):
                queue.came(made)
                self._shed(call, queue)  # it would wait longer than it may
                return
        self.stats.waited += 1
        self._seq = attempt = self._seq + 1
        call.id = attempt
        call.provider = None
        call.accepted = call.acked = False
        call.checked = 0.0
        self._calls[attempt] = call
        self._deadlines.add(attempt, call.deadline)
        queue.push(call, now, made)

    def _is_waiting(self, call: Call) -> bool:
        """``call`` still waits for a slot (its caller gone, it waits for nothing: the
        caller's drop cancels it)."""
        return self._calls.get(call.id) is call and not call.caller.closed

    def _release(self, peer: Peer, now: float) -> None:
        """A slot at ``peer`` may have freed: it takes the waiting call of a name it serves
        with the earliest deadline, while it has room; a call that tried it before (and
        waits for another target) is passed over, not in the way of those behind it."""
        pace = peer.pace
        if pace is None or peer.closed:
            return
        live = self._is_waiting
        while peer.load < pace.limit:
            best: tuple[Call, Waiting] | None = None
            for name, queue in list(self._waiting.items()):
                head = queue.head(live)
                if head is None:
                    # empty: forgotten once it has not stood for a while (an overload
                    # that goes on comes back to a queue that remembers it stood)
                    if (not queue.standing and not queue.probing and not queue.held
                            and now - queue.stood_until > 4 * self.queue_interval):
                        del self._waiting[name]
                elif ((best is None or head.deadline < best[0].deadline)
                      and self._serves(peer, name)):
                    if head.deadline <= now or (head.tried is not None and peer in head.tried):
                        # it will not go there (it tried it, or its time is up: the
                        # tick ends it); the next that would, if any
                        head = queue.first(live, lambda c: c.deadline > now and (
                            c.tried is None or peer not in c.tried))
                        if head is None or (best is not None
                                            and head.deadline >= best[0].deadline):
                            continue
                    best = (head, queue)
            if best is None:
                return
            call, queue = best
            queued = call.queued
            waited, left = now - queued, call.deadline - queued
            queue.take(call)
            del self._calls[call.id]
            call.queued = -1.0
            slower = peer.lat - pace.long  # what its own queue adds (``_patience``)
            queue.slower = slower if slower > 0.0 else 0.0
            standing = queue.judge(waited, now, self.queue_target, self.queue_interval)
            if ((standing or queued < queue.outpaced_until)
                    and waited > self._patience(left, queued, queue)):
                # as CoDel drops: the queue stands, this waited (or it came in an
                # overload that ended since: it was one of its calls)
                self._shed(call, queue)
                continue
            queue.served += 1
            self._dispatch(call, (), (), now, peer)

    def _patience(self, left: float, queued: float, queue: Waiting) -> float:
        """How long a call that had ``left`` s when it began to wait (at ``queued``) may
        wait for a slot while its queue stands. While calls come faster than they are
        served (``Waiting.outpaced``: more is offered than the providers serve, and a
        longer wait would only make every answer later), the target less what the
        target's own queue adds to an answer now (``Waiting.slower``; half the target
        at least): so an overload makes an answered call later by about the target in
        all, not by the target plus the provider's queue. A call that came then keeps
        that patience when the overload ends (``Waiting.outpaced_until``): the last
        calls of an overload are not a burst. Else the target, or a share of ``left``,
        if longer (a burst being worked off: its callers gave it that time)."""
        target = self.queue_target
        if queue.outpaced or queued < queue.outpaced_until:
            patience = target - queue.slower
            return patience if patience > 0.5 * target else 0.5 * target
        patience = PATIENCE * left
        return patience if patience > target else target

    def _shed(self, call: Call, queue: Waiting) -> None:
        """``call`` (out of every table) is refused OVERLOADED: its name's queue stands.
        While the queue is probed (``Waiting.probe``), the reply to one of this node's
        callers goes out two intervals late, unless its deadline comes first."""
        self.stats.overloaded += 1
        self.stats.shed += 1
        hint = max(int(queue.waited * 1000), 1)
        msg = [ERROR, call.cid, errors.OVERLOADED,
               f"every provider of {call.name!r} is busy and calls have waited {hint} ms "
               "for one: shed (not run); retry later", hint]
        due = self._now + 2 * self.queue_interval
        if (queue.probing and not call.local_only and type(call.caller) is not Gather
                and call.deadline > due + self.queue_interval):
            self._conclude(call, msg, queue.held, due)
        else:
            self._conclude(call, msg)

    def _send_held(self, held: Iterable[tuple[Any, list[Any]]]) -> None:
        """Send the replies a probe held back (``_shed``) to callers still connected."""
        for caller, msg in held:
            if caller.closed:
                self.stats.discarded += 1
            else:
                caller.send(msg)

    def _serves(self, peer: Peer, name: str) -> bool:
        """``peer`` is a target of ``name`` here: a provider of it on this node, or a node
        the cluster knows provides it."""
        if not peer.is_node:
            return name in peer.provides
        cluster = self.cluster
        if cluster is None:
            return False
        found = cluster.targets(name, self._now, False)
        return found is not None and any(p is peer and n > 0 for p, n in found)

    def _reroute_waiting(self, name: str) -> None:
        """The targets of ``name`` changed for the worse: its waiting calls are routed
        afresh (nobody provides it any more: NO_PROVIDER; else they wait again)."""
        queue = self._waiting.pop(name, None)
        if queue is None:
            return
        self._send_held(queue.release())
        calls: list[Call] = [entry[2] for entry in sorted(queue.heap)]
        for call in calls:
            if self._calls.get(call.id) is call:
                del self._calls[call.id]
                call.queued = -1.0
                self._route(call, self._now, discover=False)

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
        ``held``, its reply goes there, to be sent at ``due`` (``_send_held``)."""
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


def _reach(local: int, remote: Iterable[tuple[Any, float]]) -> int:
    """The providers a call_all reaches: ``local`` here, and each other node's count."""
    return local + int(sum(weight for _, weight in remote if weight > 0))
