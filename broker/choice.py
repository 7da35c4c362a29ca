"""Which provider a call goes to. Pure: no I/O, no clock.

Under the ``cluster`` policy, a weighted draw over every target (``Draws``, at the end);
under ``local-first``, ``local_first``:

The router (broker/router.py) keeps, for each provider peer, its ``load`` (the
attempts it has sent there and not yet seen end) and, for each provider on this node,
its ``rate`` (attempts sent per second, smoothed over about a second by the
router's tick), ``lat`` (the seconds an attempt takes there: one in 8 timed, peak
EWMA) and ``steady`` (``lat`` smoothed over about a quarter second by the tick). A
local provider's load, rate and time are all of its work: every call to it passes this
router, this node's callers' and other nodes' INVOKEs alike. A node's load
and ``rate`` are what this node has sent there; its ``reported`` rates and ``latency``
are what that node said, in its last heartbeat, of its own providers, per rpc.

``local_first`` chooses:

1. among the local providers, by the power of two choices: two different ones drawn
   at random by weight, the one with fewer attempts outstanding (plus one) times the
   time an attempt takes there, per unit of weight (Envoy's least-request balancer
   weighs the outstanding, Finagle's and Linkerd's peak-EWMA balancers the time too),
   so a slow or stuck provider, whose attempts pile up and take long, loses its share
   within about a second;
2. that provider, while this node has room (for a share of the calls): it is not
   ``SLOWER`` times slower than the other nodes' providers of the name (its ``steady``
   against the median of their ``latency``, each at least ``LAT_FLOOR``; none
   measured: not slow: a stall of a few ms on a busy machine, which lifts ``lat`` at
   once, sends no call away), and the local providers' rate per unit of weight is under
   ``QUIET`` calls per second (light load stays local however the cluster is loaded)
   or not above ``SLACK`` times the cluster's (every candidate's rate over every
   candidate's weight, leaving out nodes that slow); above that, the share of its
   callers' calls (kept here and sent away) that keeps it at that bound;
3. else the same two-choice draw among the other nodes, by their load (what this node
   has outstanding there, plus one) times their providers' ``latency``: the call spills
   to the least loaded, and away from a node whose providers turned slow.

With callers spread evenly, every node's providers serve about the cluster's rate, so
calls stay on their node and each provider gets its weight's share. With callers on
one node, that node's providers take up to ``SLACK`` times their share and the rest
spreads over the others. Rates, not loads, decide the room: a local provider answers
sooner than a remote one, so it would take more than its share at an even load.
A local provider that turned slow sends its node's calls elsewhere within about a
second, whether or not it has local peers; idle, its ``lat`` shrinks, so one call tries
it again every half second or so (the router: ``probe``), and it takes its share back
once it is quick again.
Weights (a weights file, or a node's advertised sum) scale the draws, the loads and the
rates. ``tried`` (the targets a call already went to) are left out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Sequence

if TYPE_CHECKING:
    from rpcbus.broker.peers import Peer
    from rpcbus.broker.weights import Weights

POLICIES = ("local-first", "cluster")  # cluster: a weighted draw over the whole cluster
QUIET = 50.0   # calls per second per unit of weight under which a node has room
SLACK = 1.15   # room: the local rate per unit of weight at most this times the cluster's
SLOWER = 2.5   # no room: the local provider this many times slower than other nodes'
INF = float("inf")
LAT_FLOOR = 0.002  # s: latencies under this count as this (queueing noise, a crossing)
# names whose first attempts ``Draws`` counts; past that the counts start over (every
# share starts even again), so names provided elsewhere and gone keep no memory
BALANCED_NAMES = 4096


def local_first(name: str, local: Sequence[tuple[Any, float]],
                remote: Sequence[tuple[Any, float]], tried: set[Any] | None,
                rand: Callable[[], float]) -> Any | None:
    """The target of one attempt of ``name``: ``local`` and ``remote`` are the
    candidates with their weights (a remote node's: the sum it advertises). None when
    no candidate outside ``tried`` has any weight."""
    if tried is not None:
        local = [(p, w) for p, w in local if p not in tried]
        remote = [(p, w) for p, w in remote if p not in tried]
    best = least_loaded(local, rand) if local else None
    if best is not None:
        if not remote:
            return best[0]
        typical = _median([theirs for node, _ in remote
                           if (theirs := node.latency.get(name, 0.0)) > 0])
        # none measured yet (their providers idle): nothing to judge this one slow by
        slow = SLOWER * (typical if typical > LAT_FLOOR else LAT_FLOOR) if typical else INF
        if best[0].steady <= slow:
            keep = _room(name, local, remote, slow)
            if keep >= 1.0 or rand() < keep:
                return best[0]
    found = least_loaded(remote, rand, name) if remote else None
    if found is None:
        return None if best is None else best[0]
    return found[0]


def least_loaded(candidates: Sequence[tuple[Any, float]], rand: Callable[[], float],
                 name: str | None = None) -> tuple[Any, float] | None:
    """Two different candidates drawn at random by weight; the one of lower cost (the
    first on a tie): attempts outstanding plus one, times the seconds an attempt takes
    there (a local provider's ``lat``; with ``name``, other nodes, the ``latency`` they
    report for it), per unit of weight, as Finagle's and Linkerd's peak-EWMA balancers
    weigh. None when no candidate has weight."""
    if len(candidates) == 1:
        return candidates[0] if candidates[0][1] > 0 else None
    total = 0.0
    for _, weight in candidates:
        total += weight
    if total <= 0:
        return None
    first = _draw(candidates, total, rand, None)
    if total - first[1] <= 0:
        return first  # the only one with weight
    second = _draw(candidates, total - first[1], rand, first[0])
    return second if _cost(second, name) < _cost(first, name) else first


def _cost(candidate: tuple[Any, float], name: str | None) -> float:
    """Outstanding plus one, times the time an attempt takes there, per unit of weight."""
    peer, weight = candidate
    lat: float = peer.lat if name is None else peer.latency.get(name, 0.0)
    load: int = peer.load
    return (load + 1) * (lat if lat > LAT_FLOOR else LAT_FLOOR) / weight


def _median(values: list[float]) -> float:
    """The median of ``values`` (the lower middle one), 0 when there are none."""
    return sorted(values)[(len(values) - 1) // 2] if values else 0.0


def _draw(candidates: Sequence[tuple[Any, float]], total: float,
          rand: Callable[[], float], besides: Any) -> tuple[Any, float]:
    """One of ``candidates`` but ``besides``, at random by weight (``total``: theirs)."""
    pick = rand() * total
    last = None
    for candidate in candidates:
        if candidate[0] is besides or candidate[1] <= 0:
            continue
        last = candidate
        pick -= candidate[1]
        if pick < 0:
            return candidate
    assert last is not None  # total > 0: some candidate has weight
    return last  # rounding left a sliver above the last one


def _room(name: str, local: Sequence[tuple[Any, float]],
          remote: Sequence[tuple[Any, float]], slow: float) -> float:
    """The share of calls to keep here: 1 while the local providers serve at most
    ``SLACK`` times the cluster's rate per unit of weight (or under ``QUIET``), else
    that bound over what this node's callers ask (the local providers' rate and what
    this node sends other nodes, per unit of local weight), so the local rate settles
    at the bound rather than swinging around it: sending every call away above it, at
    a start, before the heartbeats told each other's rates, all four nodes of a spread
    sent every call away for a second and took five to settle. Rates are smoothed over
    about a second, as long as a heartbeat takes to bring the other nodes' news.
    Nodes whose providers take over ``slow`` s are left out of the cluster's rate: they
    serve less because they are slow, which is no reason to send them more."""
    rate = weight = 0.0
    for peer, w in local:
        rate += peer.rate
        weight += w
    if weight <= 0:
        return 0.0
    mine = rate / weight
    if mine < QUIET:
        return 1.0
    everyone, weights, sent = rate, weight, 0.0
    for node, w in remote:
        sent += node.rate
        if node.latency.get(name, 0.0) <= slow:
            everyone += node.reported.get(name, 0.0)
            weights += w
    target = SLACK * everyone / weights
    return 1.0 if mine <= target else target * weight / (rate + sent)


class Draws:
    """The ``cluster`` policy's choice of a call's target (``choose``), and the weights
    every policy draws local providers by (``local_weights``). Chance comes only from
    ``rand``.

    A target's chance is its weight over the sum: a local provider weighs 1 (or its
    weight from the weights file, ``weights``), a node the count (or weight sum) it
    advertises. With ``affinity`` K > 1 a first attempt's draw also takes the next K - 1
    first attempts of that name handed in with it (one client frame: ``new_batch()``
    before each), so they go to one node in one bus batch. Such a draw is only among the
    targets behind their share of the name's first attempts (``_balanced``), so each
    target stays within about K calls of its weight's share (docs/cluster.md, "Choice").
    A call already tried somewhere draws among the targets it has not tried."""

    __slots__ = ("_balance", "_drawn", "affinity", "new_batch", "rand", "weights")

    def __init__(self, rand: Callable[[], float], affinity: int = 1) -> None:
        self.rand = rand
        self.affinity = affinity  # first attempts per draw (1: a draw each)
        self.weights: Weights | None = None  # provider weights, when a file is loaded
        # name -> [the drawn target, first attempts it still takes, the remote targets
        # list it was drawn from (a new list: the targets changed, draw again), the
        # name's first attempts per target (``_balanced``)], for the calls of one batch
        self._drawn: dict[str, list[Any]] = {}
        # name -> (the remote targets list, first attempts per target since that list
        # or the local providers last changed): what ``_balanced`` draws by
        self._balance: dict[str, tuple[Sequence[Any], dict[Peer, int]]] = {}
        # new_batch(): the calls handed in from here on came together (a client's frame),
        # so no draw made for earlier calls holds for them. It is the table's own clear,
        # called without a Python frame (every client frame starts a batch); the table is
        # never replaced, only emptied.
        self.new_batch: Callable[[], None] = self._drawn.clear

    def set_weights(self, weights: Weights | None) -> None:
        """Draw by ``weights`` (None: all 1) from the next call on."""
        self.weights = weights
        self._balance.clear()  # shares by the new weights from here on

    def changed(self, name: str) -> None:
        """The local providers of ``name`` changed: no draw of it holds, shares start even."""
        self._drawn.pop(name, None)
        self._balance.pop(name, None)

    def local_weights(self, name: str, local: Sequence[Peer]) -> list[tuple[Peer, float]]:
        """The local providers with their weights (1 without a weights file)."""
        return self._weighing(name, local, (), None)

    def choose(self, name: str, local: Sequence[Peer], remote: Sequence[tuple[Peer, float]],
               tried: set[Peer] | None) -> Peer | None:
        """The target of a call to ``name`` among ``local`` providers and ``remote`` (node,
        weight) not in ``tried``; None when none is left with any weight."""
        if remote and tried is None:  # a first attempt that may cross nodes
            if not local and len(remote) == 1:  # one target: nothing to draw or hold
                return remote[0][0] if remote[0][1] > 0 else None
            drawn = self._drawn.get(name)
            if drawn is not None and drawn[1] and drawn[2] is remote and not drawn[0].closed:
                provider: Peer = drawn[0]  # the draw holds (``affinity``)
                drawn[1] -= 1
                drawn[3][provider] += 1
                return provider
            if self.affinity > 1:
                held, taken = self._balanced(name, local, remote)  # a draw
                if held is not None:
                    self._drawn[name] = [held, self.affinity - 1, remote, taken]
                return held
            return self._weighted(name, local, remote, None)  # a draw per call
        if self.weights is not None or remote:  # weighted, without the targets tried
            return self._weighted(name, local, remote, tried)
        candidates = local if tried is None else [p for p in local if p not in tried]
        n = len(candidates)
        if n <= 1:
            return candidates[0] if n else None
        return candidates[int(self.rand() * n)]

    def _weighted(self, name: str, local: Sequence[Peer], remote: Sequence[tuple[Peer, float]],
                  tried: set[Peer] | None) -> Peer | None:
        """A target not in ``tried``, at random by weight (``_weighing``); None when no
        such target has any weight."""
        weighted = self._weighing(name, local, remote, tried)
        total = sum(n for _, n in weighted)
        return self._pick(weighted, total) if total > 0 else None

    def _weighing(self, name: str, local: Sequence[Peer], remote: Sequence[tuple[Peer, float]],
                  tried: set[Peer] | None) -> list[tuple[Peer, float]]:
        """The targets not in ``tried`` with their weights: a local provider's from the
        weights file (1 without one), a node's the sum it advertises."""
        if self.weights is None:
            weighted = [(p, 1.0) for p in local if tried is None or p not in tried]
        else:
            weight = self.weights.of
            weighted = [(p, weight(name, p.provider_name)) for p in local
                        if tried is None or p not in tried]
        weighted += [(p, n) for p, n in remote if tried is None or p not in tried]
        return weighted

    def _pick(self, weighted: Sequence[tuple[Peer, float]], total: float) -> Peer:
        """One of ``weighted`` at random by weight; ``total`` is their sum (over 0)."""
        assert total > 0 and weighted, "a draw among no weight"
        pick = self.rand() * total
        for provider, n in weighted:
            pick -= n
            if pick < 0:
                return provider
        return weighted[-1][0]  # rounding left a sliver above the last one

    def _balanced(self, name: str, local: Sequence[Peer], remote: Sequence[tuple[Peer, float]]
                  ) -> tuple[Peer | None, dict[Peer, int]]:
        """A first attempt's draw when draws hold (``affinity``), counted: only among the
        targets behind their weight's share of the name's first attempts since its targets
        last changed, by how far behind. Returns the target (None: none has weight) and
        the counts, where the calls the draw then holds are counted too.

        Held draws make bigger batches, and drawn at random they would spread calls in
        lumps of up to ``affinity``: over a short window one target could get several
        lumps more than its share. Drawing only among the targets behind keeps every
        target within about one hold of its share at any time, so shares per window stay
        the weights' (what ``rpcbus analyze``'s fairness checks); the draw stays random
        among those behind, so no fixed order of calls can line up with the targets."""
        balance = self._balance.get(name)
        if balance is None or balance[0] is not remote:  # new targets: every share starts even
            if balance is None and len(self._balance) >= BALANCED_NAMES:
                self._balance.clear()
            balance = self._balance[name] = (remote, {})
        taken = balance[1]
        weighted = self._weighing(name, local, remote, None)
        total = sum(n for _, n in weighted)
        if total <= 0:
            return None, taken
        calls = sum(taken.values()) + 1  # this one too
        # what each target is behind by: the gaps add up to 1, as the counts are of these
        # targets only, so some target is behind (all of them, should rounding say none)
        behind = [(p, gap) for p, n in weighted if (gap := calls * n / total - taken.get(p, 0)) > 0]
        provider = (self._pick(behind, sum(gap for _, gap in behind)) if behind
                    else self._pick(weighted, total))
        taken[provider] = taken.get(provider, 0) + 1
        return provider, taken
