"""Which provider a call goes to under the ``local-first`` policy. Pure: no I/O, no clock.

The router (broker/router.py) keeps, for each provider peer, its ``load`` (the
attempts it has sent there and not yet seen end) and, for each provider on this node,
its ``rate`` (attempts sent per second, smoothed over about a second by the
router's tick). A local provider's load and rate are all of its work: every call to it
passes this router, this node's callers' and other nodes' INVOKEs alike. A node's load
is what this node has sent there; its ``reported`` rates are what that node said, in
its last heartbeat, its own providers get per rpc.

``local_first`` chooses:

1. among the local providers, by the power of two choices: two different ones drawn
   at random by weight, the one with fewer attempts outstanding per unit of weight (as
   Envoy's and Finagle's least-request balancers do), so a slow or stuck provider,
   whose attempts pile up, loses its share within about a second;
2. that provider, while this node has room: the local providers' rate per unit of
   weight is under ``QUIET`` calls per second (light load stays local however the
   cluster is loaded), or not above ``SLACK`` times the cluster's (every candidate's
   rate over every candidate's weight);
3. else the same two-choice draw among the other nodes (their load: what this node
   has outstanding there): the call spills to the least loaded.

With callers spread evenly, every node's providers serve about the cluster's rate, so
calls stay on their node and each provider gets its weight's share. With callers on
one node, that node's providers take up to ``SLACK`` times their share and the rest
spreads over the others. Rates, not loads, decide the room: a local provider answers
sooner than a remote one, so it would take more than its share at an even load.
Weights (a weights file, or a node's advertised sum) scale the draws, the loads and the
rates. ``tried`` (the targets a call already went to) are left out.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

POLICIES = ("local-first", "cluster")  # cluster: a weighted draw over the whole cluster
QUIET = 50.0   # calls per second per unit of weight under which a node has room
SLACK = 1.15   # room: the local rate per unit of weight at most this times the cluster's


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
    if best is not None and (not remote or _room(name, local, remote)):
        return best[0]
    found = least_loaded(remote, rand) if remote else None
    if found is None:
        return None if best is None else best[0]
    return found[0]


def least_loaded(candidates: Sequence[tuple[Any, float]],
                 rand: Callable[[], float]) -> tuple[Any, float] | None:
    """Two different candidates drawn at random by weight; the one with fewer attempts
    outstanding per unit of weight (the first on a tie). None when no candidate has
    weight."""
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
    return second if second[0].load / second[1] < first[0].load / first[1] else first


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
          remote: Sequence[tuple[Any, float]]) -> bool:
    """The local providers serve at most ``SLACK`` times the cluster's rate per unit of
    weight (or under ``QUIET``). Rates are smoothed over about a second, as long as a
    heartbeat takes to bring the other nodes' news: smoothed less, the cut sends every
    call away, then none, in turns, and the local providers end above their share."""
    rate = weight = 0.0
    for peer, w in local:
        rate += peer.rate
        weight += w
    if weight <= 0:
        return False
    mine = rate / weight
    if mine < QUIET:
        return True
    for peer, w in remote:
        rate += peer.reported.get(name, 0.0)
        weight += w
    target = SLACK * rate / weight
    return mine <= target
