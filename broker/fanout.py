"""``call_all``: one request to every provider of a name, a reply from each. Pure.

The router (broker/router.py ``request_all``) makes an ``AllCall`` for the caller and one
child call per target: each provider on this node, and each other node that provides the
name (which runs it on each of its own providers and sends their replies back). The
children are ordinary calls of a ``Gather`` peer, so they are routed, acknowledged,
timed and cancelled as calls are, each pinned to its target: one that is refused or
lost is not moved to another provider (every provider runs it at most once). As each
child ends, ``Gather`` turns its outcome into a REPLY for the caller, named by the
provider and its node; when every child has ended, ``max_replies`` replies went out, or
the deadline passed (the children time out with it), the caller gets RESPONSE with the
number of replies, and the children still under way are cancelled.

``request_all``, ``fan_out``, ``reply``, ``reply_of`` and ``gathered`` are functions of
``Router``, bound there as its methods: the children live in its call table.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Sequence

from rpcbus import errors
from rpcbus.broker.calls import AllCall, Call
from rpcbus.protocol import ERROR, REPLY, RESPONSE, valid_name

if TYPE_CHECKING:
    from rpcbus.broker.peers import Caller, Peer
    from rpcbus.broker.router import Router


class Gather:
    """The children's caller: each child's outcome becomes a REPLY of its ``AllCall``.
    A ``Caller`` of the router (broker/peers.py), never a provider."""

    is_node = False
    closed = False
    origin = ""

    def __init__(self, router: "Router", parent: "Call", max_replies: int) -> None:
        self.router = router
        self.parent = parent
        self.label = parent.caller.label           # providers see the caller
        self.user_name = parent.caller.user_name
        self.inflight = 0
        self.calls: dict[int, Call] = {}           # the children under way, by index
        # each child's target: (provider label, node name, a whole node?)
        self.targets: dict[int, tuple[str, str, bool]] = {}
        self.max_replies = max_replies
        self.replies = 0
        self.replied: set[tuple[str, str]] = set()  # (node, provider) of REPLYs from nodes
        self.fanning = False  # children are being made: none ends the call_all yet
        self.done = False

    def send(self, msg: list[Any]) -> None:
        """A child's outcome (it has left every table): a provider's answer or error is
        its REPLY; a node's RESPONSE says its providers' REPLYs all came (its error, a
        REPLY for the node)."""
        provider, node, whole = self.targets[msg[1]]
        if not self.done:
            if msg[0] == RESPONSE:
                if not whole:
                    reply_of(self.router, self, provider, node, msg[2], None)
            elif msg[0] == ERROR:
                reply_of(self.router, self, "" if whole else provider, node, None, msg[2:])
        if not self.calls and not self.fanning:
            gathered(self.router, self)


def fanout_of(router: Router, name: str, now: float) -> int:
    """The providers of ``name`` a call_all made now would reach, as far as this node
    knows without asking (what its caller is charged: broker/session_policy.py)."""
    local = len(router._providers.get(name, ()))
    cluster = router.cluster
    if cluster is None or not cluster.knows(name):
        return local
    return _reach(local, cluster.targets(name, now, False) or ())


def request_all(router: Router, caller: Caller, cid: int, name: str, data: Any,
                timeout_ms: int | None, now: float, traceparent: str | None = None,
                max_replies: int = 0, age: float = 0.0) -> None:
    """An ALL (call_all; from another node, for its providers here only): a REPLY per
    provider of ``name`` across the cluster, then RESPONSE with their number
    (broker/fanout.py). Refused as a REQUEST would be: a duplicate id, a bad name.
    Its time left is a REQUEST's (``age``: ``request``)."""
    if cid in caller.calls:
        router.stats.duplicate_ids += 1
        caller.send([ERROR, cid, errors.INVALID_MESSAGE,
                     f"call id {cid} belongs to a call still in flight"])
        return
    caller.inflight += 1
    call = AllCall(caller, cid, name, data, now + router._time_left(timeout_ms, now, age))
    caller.calls[cid] = call
    call.gather = Gather(router, call, max_replies)
    if router._clock is not None:
        call.started = router.read_at
    call.traceparent = traceparent
    if (name not in router._providers and (router.cluster is None or not router.cluster.knows(name))
        and not valid_name(name, router.max_name)):
        router.stats.invalid_names += 1
        router._conclude(call, [ERROR, cid, errors.INVALID_MESSAGE,
                                f"invalid rpc name {name[:64]!r}"])
        return
    fan_out(router, call, now, discover=True)


def fan_out(router: Router, call: AllCall, now: float, discover: bool) -> None:
    """A child call per target (pinned to it), or, the cluster not yet knowing who
    provides the name, the call waits for discovery (``resume``)."""
    remote: Sequence[tuple[Peer, float]] = ()
    if router.cluster is not None and not call.local_only:
        found = router.cluster.targets(call.name, now, discover)
        if found is None:
            router._park(call)
            return
        remote = found
    gather = call.gather
    local = router._providers.get(call.name, ())
    reach = _reach(len(local), remote)
    if router.max_fanout and reach > router.max_fanout:
        router.stats.fanout_refused += 1
        router._conclude(call, [ERROR, call.cid, errors.LIMIT_EXCEEDED,
                                f"a call_all of {call.name!r} would reach {reach} providers; "
                                f"this node allows {router.max_fanout} (limits.max_fanout): "
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
        gather.targets[i] = (label, target.label if whole else router.name, whole)
        router._dispatch(child, () if whole else (target,), ((target, 1.0),) if whole
                         else (), now)
    gather.fanning = False
    if not gather.calls:  # nobody provides it, or every child ended at once
        gathered(router, gather)


def reply(router: Router, peer: Peer, attempt: int, provider: str, data: Any,
          error: list[Any] | None) -> None:
    """A REPLY from another node for a call_all child sent there: one of its
    providers' answer (``error``: ``[code, message, detail?]``). One the bus delivered
    twice is dropped."""
    call = router._calls.get(attempt)
    gather = call.caller if call is not None else None
    if call is None or call.provider is not peer or not isinstance(gather, Gather):
        router._stray(peer, attempt, None)
        return
    call.accepted = True  # the node runs it: never moved now
    key = (peer.label, provider)
    if key in gather.replied:
        router.stats.late += 1
    elif not gather.done:
        gather.replied.add(key)
        reply_of(router, gather, provider, peer.label, data, error)


def reply_of(router: Router, gather: Gather, provider: str, node: str, data: Any,
             error: list[Any] | None) -> None:
    """A REPLY to the call_all's caller; the call_all ends at ``max_replies``."""
    gather.replies += 1
    parent = gather.parent
    caller = parent.caller
    if caller.closed:
        router.stats.discarded += 1
    else:
        caller.send([REPLY, parent.cid, provider, node, data] if error is None else
                    [REPLY, parent.cid, provider, node, None, list(error)])
    if gather.max_replies and gather.replies >= gather.max_replies:
        gathered(router, gather)


def gathered(router: Router, gather: Gather) -> None:
    """Every child ended, or ``max_replies`` came: the children under way are
    cancelled and the caller gets RESPONSE with the number of replies."""
    if gather.done:
        return
    gather.done = True
    for child in list(gather.calls.values()):
        router._cancel(child)
    assert not gather.calls and gather.inflight == 0, "a child of an ended call_all"
    parent = gather.parent
    router._conclude(parent, [RESPONSE, parent.cid, gather.replies])


def _reach(local: int, remote: Iterable[tuple[Any, float]]) -> int:
    """The providers a call_all reaches: ``local`` here, and each other node's count."""
    return local + int(sum(weight for _, weight in remote if weight > 0))
