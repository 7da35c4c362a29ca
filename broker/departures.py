"""What the router does when a peer or the cluster bus goes: attempts that may have
run end with a code that says so, those that never started move, calls a caller left
are cancelled, and a draining node hands back the calls nobody holds. Pure; functions of
``Router`` (broker/router.py), bound there as its methods, on its call table.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from rpcbus import errors
from rpcbus.broker import queueing
from rpcbus.broker.calls import ASKED_AGAIN, BUS_DOWN, Call
from rpcbus.protocol import ACK_CHECK, CANCEL, ERROR
from rpcbus.schema import Outcome

if TYPE_CHECKING:
    from rpcbus.broker.peers import Peer, Provider
    from rpcbus.broker.router import Router


def drop_peer(router: Router, peer: Peer, now: float, acks_may_follow: bool = False) -> None:
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
        router._cancel(next(iter(calls.values())))
    if peer not in router._provider_peers and not peer.is_node:
        return
    router._provider_peers.discard(peer)
    router.figures.forget(peer)
    router._probing.pop(peer, None)
    router._paced.pop(peer, None)
    if peer.provides:  # one that provides keeps a set of its own (a Provider)
        # in name order: a set's order follows the process's string hashing, and
        # what this sends (PROVIDER_UPDATEs) would differ between runs of a seed
        router.unprovide(cast("Provider", peer), sorted(peer.provides))
    if router.history is not None and not peer.is_node:
        router.history.forget(peer)
    for call in [c for c in router._calls.values() if c.provider is peer]:
        if acks_may_follow and not (call.accepted or call.acked):
            continue  # its ack deadline settles it
        router._end_attempt(call)
        if call.hrow is not None:
            router._history_end(call, Outcome.ERRORS)  # errors: the provider left
        if (call.accepted or call.acked or call.id <= peer.accepted_upto
            or peer.runs_before_accept):
            router.stats.provider_gone += 1
            router._conclude(call, [ERROR, call.cid, errors.PROVIDER_GONE,
                                    f"the provider of {call.name!r} is gone"])
        else:
            router._retry(call, now)
    if peer.is_node and router._waiting:  # calls waiting for it go where they now can
        for name in list(router._waiting):
            queueing.reroute_waiting(router, name)
    assert not peer.calls and (acks_may_follow or all(
        c.provider is not peer for c in router._calls.values())), "a call left at a peer gone"


def cluster_down(router: Router, now: float) -> None:
    """The bus session ended (it reconnects by itself); waiting calls resume.

    A call at another node waits for the bus to come back, until its deadline
    (``cluster_up`` then asks that node what became of it): it may be running there,
    so it is neither moved nor failed. A stream or a call_all's child at another node
    fails CLUSTER_UNAVAILABLE: parts or replies sent meanwhile are lost. Calls waiting
    for discovery go to local providers, if any.
    """
    for call in [c for c in router._calls.values() if c.provider is not None
                 and c.provider.is_node]:
        node = call.provider
        assert node is not None  # (the filter's)
        if call.window:
            router._end_attempt(call)
            router.stats.cluster_unavailable += 1
            router._conclude(call, [ERROR, call.cid, errors.CLUSTER_UNAVAILABLE,
                                    "the cluster bus went down during the call"])
        else:
            router.stats.bus_waits += 1
            call.checked = BUS_DOWN  # its deadline entries wait for the bus (``tick``)
            call.sent = 0.0  # its time, gap included, measures nothing of the node
            pace = node.pace
            if pace is not None and pace.probe == call.id:  # nor its accept time
                pace.probe = 0
                router._probing.pop(node, None)
    for name in list(router._parked):
        router.resume(name, now)


def cluster_up(router: Router, now: float) -> None:
    """The bus is back: each call that waited through the reset at another node is
    asked about there (``[ACK_CHECK, id, age_ms]``; ``age_ms`` -1: its ACK came, so it
    started). That node answers ACK (still running: its answer will come), REJECT
    (never started, and never will: the call moves) or DONE (it ran and answered, and
    the answer was lost while this node was away: ``lost``). One that is not
    answered within the node's ack timeout ends CLUSTER_UNAVAILABLE, never moved."""
    for call in [c for c in router._calls.values() if c.checked == BUS_DOWN]:
        provider = call.provider
        assert provider is not None and provider.is_node, "held, yet not at a node"
        call.checked = ASKED_AGAIN
        if not provider.closed:
            provider.send([ACK_CHECK, call.id,
                           -1 if call.acked else int((now - call.begun) * 1000)])
        if not call.acked:
            pace = provider.pace
            due = now + (pace.rto if pace is not None else router.ack_timeout)
            router._deadlines.add(call.id, due if due < call.deadline else call.deadline)


def lost(router: Router, peer: Peer, attempt: int) -> None:
    """The node ran ``attempt`` and sent its answer, which never came (lost on the bus
    while this node's subscription was down): the call ends CLUSTER_UNAVAILABLE, a
    code that says it may have run."""
    call = router._attempt_of(peer, attempt)
    if call is None:
        return
    router._end_attempt(call)
    router.stats.cluster_unavailable += 1
    router.stats.answers_lost += 1
    router._conclude(call, [ERROR, call.cid, errors.CLUSTER_UNAVAILABLE,
                            f"node {peer.label} took the call and answered it, but the "
                            "answer was lost on the cluster bus (it may have run)"])


def fail_peer(router: Router, peer: Peer, code: str, message: str) -> None:
    """Every attempt at ``peer`` ends with ``code`` (their outcome cannot be known
    here, so they neither wait nor move); the peer stays."""
    for call in [c for c in router._calls.values() if c.provider is peer]:
        router._end_attempt(call)
        if code == errors.CLUSTER_UNAVAILABLE:
            router.stats.cluster_unavailable += 1
        if not peer.closed:
            peer.send([CANCEL, call.id])
        router._conclude(call, [ERROR, call.cid, code, message])
    assert all(c.provider is not peer for c in router._calls.values()), "an attempt left"


def hand_back(router: Router) -> int:
    """The node stops: calls still waiting for discovery or for a free slot (no
    provider holds them, and none ran) are answered SHUTTING_DOWN, which tells their
    callers to send them to another node. Returns how many.
    """
    handed = 0
    for queue in router._waiting.values():
        queueing.send_held(router, queue.release())
    waiting: dict[str, list[Call]] = {name: [entry[2] for entry in queue.heap]
                                      for name, queue in router._waiting.items()}
    router._waiting.clear()
    for name in list(router._parked):
        waiting.setdefault(name, []).extend(router._parked.pop(name))
    for calls in waiting.values():
        for call in calls:
            if router._calls.get(call.id) is call:
                router._end_attempt(call)
                handed += 1
                router.stats.handed_back += 1
                router._conclude(call, [ERROR, call.cid, errors.SHUTTING_DOWN,
                                        "the node is shutting down: not run, call again "
                                        "on another node"])
    assert not router._waiting and not router._parked, "a call still waiting after its drain"
    return handed
