"""Which provider a call goes to under the ``local-first`` policy. Pure: no I/O, no clock.

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

from typing import Any, Callable, Sequence

POLICIES = ("local-first", "cluster")  # cluster: a weighted draw over the whole cluster
QUIET = 50.0   # calls per second per unit of weight under which a node has room
SLACK = 1.15   # room: the local rate per unit of weight at most this times the cluster's
SLOWER = 2.5   # no room: the local provider this many times slower than other nodes'
INF = float("inf")
LAT_FLOOR = 0.002  # s: latencies under this count as this (queueing noise, a crossing)


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
