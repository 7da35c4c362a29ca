"""Streams at the node: a call answered in parts, each passed on to its caller, at most
a credit window beyond what the caller has read. Pure; functions of ``Router``
(broker/router.py), bound there as its methods: a stream is a call with two more
events (``part``, ``credit``) and one more way to end (``lost_parts``), on the same
call table and with the same one outcome.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rpcbus import errors
from rpcbus.broker.calls import Call, StreamCall
from rpcbus.protocol import CANCEL, CREDIT, ERROR, PART
from rpcbus.schema import Outcome

if TYPE_CHECKING:
    from rpcbus.broker.peers import Caller, Peer
    from rpcbus.broker.router import Router


def part(router: Router, peer: Peer, attempt: int, data: Any, seq: int = -1) -> None:
    """A part of a stream's answer (an implicit accept): pass it to the caller. One
    past the window ahead of what the caller read, or for a call that is not a
    stream, ends it with PROVIDER_ERROR and CANCELs the attempt: no node holds more
    than the window. From another node, ``seq`` numbers it: one seen already (the
    bus delivered it twice) is dropped, one after a gap ends the stream
    CLUSTER_UNAVAILABLE (parts lost on the bus)."""
    call = router._calls.get(attempt)
    if call is None or call.provider is not peer:
        router._stray(peer, attempt, None)
        return
    if isinstance(call, StreamCall) and seq >= 0 and seq != call.parts:
        if seq < call.parts:
            router.stats.late += 1  # a duplicate
        else:
            lost_parts(router, call)
        return
    if not isinstance(call, StreamCall) or call.parts - call.read >= call.window:
        router.stats.stream_overruns += 1
        router._end_attempt(call)
        if call.hrow is not None:
            router._history_end(call, Outcome.ERRORS)
        if not peer.closed:
            peer.send([CANCEL, attempt])
        router.stats.provider_errors += 1
        router._conclude(call, [ERROR, call.cid, errors.PROVIDER_ERROR,
                                f"the provider of {call.name!r} sent a part past its "
                                "credit" if call.window else
                                f"the provider of {call.name!r} answered a call in parts"])
        return
    call.parts += 1
    call.accepted = True  # a part implies the accept: the stream is never moved now
    router.stats.parts += 1
    caller = call.caller
    if caller.closed:
        router.stats.discarded += 1
    else:
        caller.send([PART, call.cid, data])


def credit(router: Router, caller: Caller, cid: int, read: int) -> None:
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


def lost_parts(router: Router, call: Call) -> None:
    """A part of a stream from another node did not come (or its end counted more):
    the stream ends CLUSTER_UNAVAILABLE, the node is told to stop it."""
    router.stats.parts_lost += 1
    router._end_attempt(call)
    provider = call.provider
    if provider is not None and not provider.closed:
        provider.send([CANCEL, call.id])
    router.stats.cluster_unavailable += 1
    router._conclude(call, [ERROR, call.cid, errors.CLUSTER_UNAVAILABLE,
                            f"parts of the stream of {call.name!r} were lost on the "
                            "cluster bus"])
