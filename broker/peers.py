"""What the router (broker/router.py) reads and keeps of the peers a call passes, and
of the cluster: the ``Caller``, ``Peer`` and ``ClusterView`` protocols. Typing only.

A ``Caller`` is whoever makes calls: a client's session, another node's INVOKE (its
calls may only go to local providers, and an accept is reported back), or a call_all's
``Gather``. A ``Peer`` is a caller that may also be sent attempts, as a provider: a
client's session, or another node (its attempts become INVOKEs there). The router
keeps what the protocols mark as kept: a caller's calls in flight by its own ids (a
CANCEL finds its call in O(1), and a caller that leaves cancels them all), a
provider's names, load and times.
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from rpcbus.broker.admission import Pace
    from rpcbus.broker.calls import Call
    from rpcbus.broker.discovery import MinuteStats
    from rpcbus.broker.history import Row


class Caller(Protocol):
    """Whoever makes calls: a client's session, another node's INVOKEs, or a call_all's
    ``Gather`` (broker/fanout.py): all the router reads or keeps of one as a caller."""

    inflight: int           # its calls in flight (kept by the router)
    calls: dict[int, Call]  # those calls by its own ids (kept by the router)

    @property
    def closed(self) -> bool: ...
    @property
    def label(self) -> str: ...             # how providers see it as a caller (and logs)
    @property
    def user_name(self) -> str | None: ...  # the caller's authenticated user, for providers
    @property
    def is_node(self) -> bool: ...          # another node (or its INVOKE), not a client
    @property
    def origin(self) -> str: ...            # the node a call came from ("" for clients)

    def send(self, msg: list[Any]) -> None: ...


class Peer(Caller, Protocol):
    """A client session or another node: a caller that may also be sent attempts, as a
    provider (a node: of its providers' names). All the router reads or keeps of one."""

    # as a provider: every attempt sent to it up to this id that it did not REJECT, it
    # accepted (a client's ACCEPT_UPTO; 0 for other peers)
    accepted_upto: int
    load: int               # attempts sent to it, not yet ended (kept by the router)
    attempts: int           # attempts ever sent to it (kept by the router)
    rate: float             # attempts sent per second, over about a second (figures)
    lat: float              # seconds an attempt takes there, smoothed (kept by the router)
    steady: float           # ``lat`` smoothed over time: judges a local provider slow
    # a provider here: its figures per rpc it provides (discovery), else None
    minutes: dict[str, MinuteStats] | None
    seen: float             # ``lat`` when an attempt there last ended (kept by the router)
    # as a provider: it may run a call before it accepts it (a deepstream client), so an
    # attempt there is never moved: not at its ack timeout (ACCEPT_TIMEOUT), not when it
    # leaves (PROVIDER_GONE)
    runs_before_accept: bool
    # as a provider: its ack timeout and concurrency limit (broker/admission.py), set
    # by the router when it first provides or is first sent an attempt
    pace: Pace | None

    @property
    def provides(self) -> AbstractSet[str]: ...  # names it provides (kept by the router)
    @property
    def provider_name(self) -> str: ...     # how the load history names it as a provider
    @property
    def hrows(self) -> dict[Any, Row]: ...  # its load-history rows (providers on this node)


class Provider(Peer, Protocol):
    @property
    def provides(self) -> set[str]: ...


class ClusterView(Protocol):
    available: bool  # False while the cluster bus is down

    def targets(self, name: str, now: float, discover: bool) -> list[tuple[Peer, int]] | None:
        """Other nodes providing ``name`` as (node peer, provider count).

        None when ``discover`` and the answer is not known yet: a discovery
        has started and ``Router.resume(name)`` will follow.
        """

    def silent(self, name: str, node: Peer) -> None:
        """``node`` did not acknowledge an attempt for ``name`` in time."""

    def knows(self, name: str) -> bool:
        """True when ``name`` has an entry (so it was valid when it was asked for)."""

    def provided(self, name: str) -> bool:
        """True when another node is known to provide ``name``."""

    def probe(self) -> None:
        """Check that this node hears the bus (``settled`` says when it has)."""

    def settled(self, node: Peer, since: float) -> bool:
        """True when this node can trust that ``node``, asked at ``since`` whether it
        started an attempt, did not: this node hears the bus (its own messages sent
        since come back) and threw nothing of ``node``'s away unread."""
