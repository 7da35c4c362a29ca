"""Admission's rules on the router's tables: each target's pace (its ack timeout and
concurrency limit, broker/admission.py ``Pace``), the calls that wait for a free slot
by deadline, which waiting call a freed slot takes, and when a standing queue sheds
(OVERLOADED, not run). Pure; functions of ``Router`` (broker/router.py), bound there as its
methods: a waiting call keeps its place in the call table and its deadline, and leaves
both as any call does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Sequence

from rpcbus import errors
from rpcbus.broker.admission import NODE_LIMIT, PATIENCE, Pace, Waiting
from rpcbus.broker.calls import Call
from rpcbus.broker.fanout import Gather
from rpcbus.protocol import ERROR

if TYPE_CHECKING:
    from rpcbus.broker.peers import Peer
    from rpcbus.broker.router import Router


def admission(router: Router, most: int = 32) -> dict[str, Any]:
    """What admission holds now (``/stats``): per target (the ``most`` busiest), its
    attempts held, concurrency limit, ack timeout, no-load and recent latency; per
    name with calls waiting, how many and whether its queue stands."""
    paced = sorted((p for p in router._provider_peers if p.pace is not None),
                   key=lambda p: -p.load)[:most]
    return {
        "targets": {p.label: {"load": p.load, "limit": round(p.pace.limit, 1),
                              "ack_timeout_ms": p.pace.ack_ms,
                              "no_load_ms": round(p.pace.long * 1000, 2),
                              "latency_ms": round(p.lat * 1000, 2)}
                    for p in paced if p.pace is not None},
        "waiting": {name: {"calls": len(q), "standing": q.standing,
                           "outpaced": q.outpaced, "waited_ms": int(q.waited * 1000)}
                    for name, q in router._waiting.items() if len(q)},
    }


def new_pace(router: Router, peer: Peer) -> Pace:
    """A new target's ack timeout and limit (a node's: all its providers behind it)."""
    router._paced[peer] = None
    pace = peer.pace = Pace(router.ack_timeout, router.ack_timeout_max,
                            max(NODE_LIMIT, router.initial_concurrency) if peer.is_node
                            else router.initial_concurrency,
                            router.max_concurrency)
    return pace


def check_probes(router: Router) -> None:
    """Timed attempts accepted by an ACCEPT_UPTO (which names no attempt) are seen here,
    within a rate sample; one that ended otherwise is no sample."""
    for peer in list(router._probing):
        pace = peer.pace
        assert pace is not None
        call = router._calls.get(pace.probe)
        if call is None or call.provider is not peer:
            pace.probe = 0
            router._probing.pop(peer, None)
        elif call.accepted or call.acked or pace.probe <= peer.accepted_upto:
            router._accepted(peer)


def free(router: Router, call: Call, local: Sequence[Peer],
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
            pace = new_pace(router, peer)  # its name): all its room is free
        if peer.load / pace.limit < fill:
            best, fill = peer, peer.load / pace.limit
    return best


def pace_new_nodes(router: Router, now: float) -> None:
    """Nodes that came to provide a waiting name (joined, or came back under their
    names after a restart) get a pace, so the sweep hands them waiting calls: a
    slot's freeing hands out only the slots of targets that have one, and callers
    that wait for their answers send nothing new that would find these nodes."""
    cluster = router.cluster
    assert cluster is not None
    for name in router._waiting:
        for peer, count in cluster.targets(name, now, False) or ():
            if count > 0 and peer.pace is None and not peer.closed:
                new_pace(router, peer)


def enqueue(router: Router, call: Call, now: float) -> None:
    """Every target of ``call`` is full: it waits for a slot, earliest deadline first,
    unless the name's queue is standing (broker/admission.py ``Waiting.judge``): then
    it is shed at once, OVERLOADED (not run)."""
    queue = router._waiting.get(call.name)
    if queue is None:
        queue = router._waiting[call.name] = Waiting()
    call.queued = now
    made = None if call.local_only else call.made  # None: another node's call
    if queue.standing:
        head = queue.head(lambda c: is_waiting(router, c))
        if head is not None and now - head.queued > patience(
                router, call.deadline - now, now, queue):
            queue.came(made)
            shed(router, call, queue)  # it would wait longer than it may
            return
    router.stats.waited += 1
    router._file_unsent(call)
    queue.push(call, now, made)
    assert call.queued == now and call.provider is None, "a waiting call held by a target"


def is_waiting(router: Router, call: Call) -> bool:
    """``call`` still waits for a slot (its caller gone, it waits for nothing: the
    caller's drop cancels it)."""
    return router._calls.get(call.id) is call and not call.caller.closed


def release(router: Router, peer: Peer, now: float) -> None:
    """A slot at ``peer`` may have freed: it takes the waiting call of a name it serves
    with the earliest deadline, while it has room; a call that tried it before (and
    waits for another target) is passed over, not in the way of those behind it."""
    pace = peer.pace
    if pace is None or peer.closed:
        return

    def live(call: Call) -> bool:
        return is_waiting(router, call)

    while peer.load < pace.limit:
        best: tuple[Call, Waiting] | None = None
        for name, queue in list(router._waiting.items()):
            head = queue.head(live)
            if head is None:
                # empty: forgotten once it has not stood for a while (an overload
                # that goes on comes back to a queue that remembers it stood)
                if (not queue.standing and not queue.probing and not queue.held
                    and now - queue.stood_until > 4 * router.queue_interval):
                    del router._waiting[name]
            elif ((best is None or head.deadline < best[0].deadline)
                  and serves(router, peer, name)):
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
        del router._calls[call.id]
        call.queued = -1.0
        slower = peer.lat - pace.long  # what its own queue adds (``patience``)
        queue.slower = slower if slower > 0.0 else 0.0
        standing = queue.judge(waited, now, router.queue_target, router.queue_interval)
        if ((standing or queued < queue.outpaced_until)
            and waited > patience(router, left, queued, queue)):
            # as CoDel drops: the queue stands, this waited (or it came in an
            # overload that ended since: it was one of its calls)
            shed(router, call, queue)
            continue
        queue.served += 1
        assert call.deadline > now and (call.tried is None or peer not in call.tried), (
            "a slot given to a call that may not take it")
        router._dispatch(call, (), (), now, peer)


def patience(router: Router, left: float, queued: float, queue: Waiting) -> float:
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
    target = router.queue_target
    if queue.outpaced or queued < queue.outpaced_until:
        patience = target - queue.slower
        return patience if patience > 0.5 * target else 0.5 * target
    patience = PATIENCE * left
    return patience if patience > target else target


def shed(router: Router, call: Call, queue: Waiting) -> None:
    """``call`` (out of every table) is refused OVERLOADED: its name's queue stands.
    While the queue is probed (``Waiting.probe``), the reply to one of this node's
    callers goes out two intervals late, unless its deadline comes first."""
    router.stats.overloaded += 1
    router.stats.shed += 1
    hint = max(int(queue.waited * 1000), 1)
    msg = [ERROR, call.cid, errors.OVERLOADED,
           f"every provider of {call.name!r} is busy and calls have waited {hint} ms "
           "for one: shed (not run); retry later", hint]
    due = router._now + 2 * router.queue_interval
    if (queue.probing and not call.local_only and type(call.caller) is not Gather
        and call.deadline > due + router.queue_interval):
        router._conclude(call, msg, queue.held, due)
    else:
        router._conclude(call, msg)


def send_held(router: Router, held: Iterable[tuple[Any, list[Any]]]) -> None:
    """Send the replies a probe held back (``shed``) to callers still connected."""
    for caller, msg in held:
        if caller.closed:
            router.stats.discarded += 1
        else:
            caller.send(msg)


def serves(router: Router, peer: Peer, name: str) -> bool:
    """``peer`` is a target of ``name`` here: a provider of it on this node, or a node
    the cluster knows provides it."""
    if not peer.is_node:
        return name in peer.provides
    cluster = router.cluster
    if cluster is None:
        return False
    found = cluster.targets(name, router._now, False)
    return found is not None and any(p is peer and n > 0 for p, n in found)


def reroute_waiting(router: Router, name: str) -> None:
    """The targets of ``name`` changed for the worse: its waiting calls are routed
    afresh (nobody provides it any more: NO_PROVIDER; else they wait again)."""
    queue = router._waiting.pop(name, None)
    if queue is None:
        return
    send_held(router, queue.release())
    calls: list[Call] = [entry[2] for entry in sorted(queue.heap)]
    for call in calls:
        if router._calls.get(call.id) is call:
            del router._calls[call.id]
            call.queued = -1.0
            router._route(call, router._now, discover=False)
