"""What the cluster link needs of the node's router (rpcbus.broker.router.Router is it).

Declared here so the Redis side never imports the node: the node hands its router to
``ClusterLink``, whose ``ClusterCore`` (cluster/core.py) drives it, and the type checker
holds the router to this contract. Peers passed in
are the link's own (``RemoteNode`` for other nodes as providers, ``RemoteCaller`` for
their INVOKEs as callers); ``now`` is the loop's clock, in seconds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Protocol

if TYPE_CHECKING:
    from rpcbus.cluster.core import ClusterCore
    from rpcbus.cluster.peers import RemoteCaller, RemoteNode


class Routing(Protocol):
    ack_timeout: float
    count_changed: Callable[[str, float], None] | None
    # the rates its providers serve moved far from what the last heartbeat told
    # (``local-first``): the core sends the next heartbeat early
    rates_moved: bool
    # the router's clock when the shell read what it is handling (per-rpc latency)
    read_at: float

    # the link hands itself to the router (which sees it as its view of the cluster)
    @property
    def cluster(self) -> object: ...
    @cluster.setter
    def cluster(self, link: ClusterCore) -> None: ...

    # answers of other nodes to this node's attempts
    def ack(self, peer: RemoteNode, *attempts: int) -> None: ...
    def accept(self, peer: RemoteNode, attempt: int, now: float) -> None: ...
    def respond(self, peer: RemoteNode, attempt: int, data: Any) -> None: ...
    def reject(self, peer: RemoteNode, attempt: int, now: float) -> None: ...
    def provider_error(self, peer: RemoteNode, attempt: int, message: str,
                       code: str = ..., detail: Any = ...) -> None: ...
    def refuse_attempt(self, peer: RemoteNode, attempt: int, code: str,
                       message: str) -> None: ...

    # calls other nodes hand to this node
    def request(self, caller: RemoteCaller, cid: int, name: str, data: Any,
                timeout_ms: int | None, now: float, traceparent: str | None = None) -> None: ...
    def cancel_from(self, caller: RemoteCaller, cid: int) -> None: ...

    # nodes and the bus coming and going
    def drop_peer(self, peer: RemoteNode | RemoteCaller, now: float,
                  acks_may_follow: bool = ...) -> None: ...
    def fail_peer(self, peer: RemoteNode, code: str, message: str) -> None: ...
    def cluster_down(self, now: float) -> None: ...

    # discovery
    def resume(self, name: str, now: float) -> None: ...
    def waiting(self, name: str) -> bool: ...
    def provider_counts(self) -> dict[str, int]: ...
    def providers_of(self, name: str) -> list[Any]: ...
    def advertised(self, name: str) -> float: ...
