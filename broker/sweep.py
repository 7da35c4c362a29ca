"""The router's deadline sweep: each tick applies every deadline due. An attempt
unacknowledged by its ack timeout is moved to another target, or a node is first
asked whether it started it; a call whose time is up ends with the code that says
what became of it (RESPONSE_TIMEOUT, OVERLOADED, NO_PROVIDER, CLUSTER_UNAVAILABLE,
ACCEPT_TIMEOUT). Slots freed meanwhile go to waiting calls, and the providers'
figures move on. Pure; functions of ``Router`` (broker/router.py), bound there as
its methods, on its call table.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rpcbus import errors
from rpcbus.broker import queueing
from rpcbus.broker.calls import BUS_DOWN, Call
from rpcbus.broker.discovery import HALF
from rpcbus.broker.figures import RATE_SAMPLE, failed_at
from rpcbus.protocol import ACK_CHECK, CANCEL, ERROR
from rpcbus.schema import Outcome

if TYPE_CHECKING:
    from rpcbus.broker.peers import Peer
    from rpcbus.broker.router import Router


def tick(router: Router, now: float) -> None:
    """Apply every deadline due by ``now``: ack timeouts retry (``not_acked``),
    response timeouts fail (``too_late``). Slots freed meanwhile go to waiting calls;
    the providers' figures move on (``ProviderFigures.sample`` and ``rotate``)."""
    router._now = now
    router._held.tick(now)
    figures = router.figures
    if router._probing and now >= figures.sampled + RATE_SAMPLE:
        queueing.check_probes(router)
    if router._waiting:  # slots are handed over as they free; the sweep makes sure
        interval = router.queue_interval
        for queue in router._waiting.values():
            if queue.outpaced or queue.probing or queue.stood_outpaced or queue.held:
                queueing.send_held(router, queue.probe(now, interval))
        if router.cluster is not None:
            queueing.pace_new_nodes(router, now)
        for peer in list(router._paced):
            if peer.pace is not None and peer.load < peer.pace.limit:
                queueing.release(router, peer, now)
    if now >= figures.rotated + HALF:  # each provider's last minute moves on (discovery)
        figures.rotate(now)
    if now >= figures.sampled + RATE_SAMPLE and router.local_first:
        figures.sample(now)  # each provider's rate, lat and steady move on
    calls = router._calls
    for attempt in router._deadlines.expire(now):
        call = calls.get(attempt)
        if call is None:
            continue                  # finished long ago: its id just waited here
        if now >= call.deadline:
            give_up(router, call, attempt, too_late(router, call, now), now)
        elif (call.accepted or call.acked or call.provider is None
              or attempt <= call.provider.accepted_upto):
            # The ack deadline of an attempt acknowledged since (or a parked call's
            # entry): only now file its response deadline, so the many calls that
            # finish first cost no entry.
            router._deadlines.add(attempt, call.deadline)
        else:
            not_acked(router, call, call.provider, attempt, now)


def too_late(router: Router, call: Call, now: float) -> list[Any]:
    """``call``'s deadline passed: the ERROR its caller gets, counted."""
    assert now >= call.deadline, "a call ended before its deadline"
    if call.queued >= 0:
        # waited for a free slot all its time: never sent (not run)
        router.stats.overloaded += 1
        msg = [ERROR, call.cid, errors.OVERLOADED,
               f"every provider of {call.name!r} was busy: no slot came free within "
               f"the call's deadline (waited {now - call.queued:.3f} s; not run)",
               int(router.queue_target * 1000)]
    elif call.provider is None:
        # waiting for discovery: it never left this node (not run). Known to have
        # no provider (one moving off a stopping node did not reappear in time):
        # NO_PROVIDER; not known, as the cluster has not answered: that is no
        # "nobody provides it"
        if router.cluster is not None and not router.cluster.knows(call.name):
            router.stats.cluster_unavailable += 1
            msg = [ERROR, call.cid, errors.CLUSTER_UNAVAILABLE,
                   f"the cluster did not say in time who provides {call.name!r} "
                   "(not run)"]
        else:
            router.stats.no_provider += 1
            msg = [ERROR, call.cid, errors.NO_PROVIDER,
                   f"no provider of {call.name!r} was found within the call's "
                   "deadline (not run)"]
    elif call.checked == BUS_DOWN:
        # at another node, and this node's bus still down: that, not the provider
        assert call.provider is not None, "held for the bus, yet at no node"
        router.stats.cluster_unavailable += 1
        msg = [ERROR, call.cid, errors.CLUSTER_UNAVAILABLE,
               f"the cluster bus was down until the call's deadline (it may have "
               f"run at node {call.provider.label})"]
    else:
        router.stats.response_timeouts += 1
        msg = [ERROR, call.cid, errors.RESPONSE_TIMEOUT,
               f"no response from {call.name!r} in time"]
    return msg


def not_acked(router: Router, call: Call, provider: Peer, attempt: int, now: float) -> None:
    """``attempt`` at ``provider`` reached its ack timeout unacknowledged: a node is
    asked whether it started it (the ask's own timeout comes here again), else the
    attempt is given up (``give_up``): the call moves on, or fails where moving it
    could run it twice."""
    assert not (call.accepted or call.acked), "an accepted attempt taken for silent"
    if call.checked < 0:  # at a node when the bus went down (``cluster_down``)
        if call.checked == BUS_DOWN:  # still down: it waits, as it may be running
            router._deadlines.add(attempt, call.deadline)
            return
        # asked after the bus came back, and not answered: nothing tells
        router.stats.cluster_unavailable += 1
        msg = [ERROR, call.cid, errors.CLUSTER_UNAVAILABLE,
               f"node {provider.label} did not say, after this node's cluster "
               "bus came back, whether it ran the call"]
    elif provider.is_node and not call.checked:
        # No ACK yet from a node: ask before moving the call (it may have started).
        # A node given up is not asked, but this node still makes sure it would
        # hear an ACK still on its way before it moves the call (``settled``).
        router.stats.ack_checks += 1
        call.checked = now
        if not provider.closed:
            provider.send([ACK_CHECK, attempt])
        elif router.cluster is not None:
            router.cluster.probe()
        pace = provider.pace
        due = now + (pace.rto if pace is not None else router.ack_timeout)
        router._deadlines.add(attempt, due if due < call.deadline else call.deadline)
        return
    elif (provider.is_node and router.cluster is not None
          and not router.cluster.settled(provider, call.checked)):
        # Silent, but this node cannot show it would have heard an ACK: moving
        # the call could run it twice. Its outcome is unknown here.
        router.stats.cluster_unavailable += 1
        msg = [ERROR, call.cid, errors.CLUSTER_UNAVAILABLE,
               f"cannot tell whether node {provider.label} started the call: "
               "this node does not hear the cluster bus"]
    elif provider.runs_before_accept:  # it may be running it: never moved
        router.stats.ack_timeouts += 1
        router.stats.accept_timeouts += 1
        msg = [ERROR, call.cid, errors.ACCEPT_TIMEOUT,
               f"the provider of {call.name!r} did not accept the call in time "
               "(it may have run)"]
    else:
        router.stats.ack_timeouts += 1
        msg = None
        pace = provider.pace
        if pace is not None:  # it was slow to take it: wait longer there, send less
            pace.timed_out(now)
            router._probing.pop(provider, None)
        if not provider.is_node:
            call.slow = True
    give_up(router, call, attempt, msg, now)


def give_up(router: Router, call: Call, attempt: int, msg: list[Any] | None, now: float) -> None:
    """End ``attempt`` (cancelled at its provider): the call ends with ``msg``, or with
    None moves to another provider."""
    assert router._calls.get(attempt) is call, "an attempt given up twice"
    del router._calls[attempt]
    if call.provider is not None:
        router._took(call.provider, call)
    if call.hrow is not None:
        router._history_end(call, Outcome.RESPONSE_TIMEOUTS
                            if msg is not None and msg[2] != errors.ACCEPT_TIMEOUT
                            else Outcome.ACK_TIMEOUTS)
    provider = call.provider
    if provider is not None and not provider.closed:
        provider.send([CANCEL, attempt])
    if msg is not None:
        if provider is not None:
            failed_at(provider, call)  # it did not answer in time
        router._conclude(call, msg)
        return
    assert provider is not None  # parked calls (no provider) never come here
    if provider.is_node and router.cluster is not None:
        router.cluster.silent(call.name, provider)
        call.unsure = True
    router._retry(call, now)
