"""What the router keeps of one call (``Call``, and a stream's and a call_all's
additions) and its counters (``RouterStats``). Records only: the rules that move them
are the router's (broker/router.py and the modules beside it)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rpcbus.broker.fanout import Gather
    from rpcbus.broker.history import Row
    from rpcbus.broker.peers import Caller, Peer

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
