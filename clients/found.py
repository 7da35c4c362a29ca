"""What discovery answers (docs/protocol.md, "Discovery"), typed for the application:
``Client.rpcs()`` gives ``RpcInfo`` items, ``Client.providers(name)`` ``ProviderInfo``
items. They are the decoded answers as they come (plain dicts at run time); the types
let a type checker catch a wrong key (``info["name"]``: it is ``"rpc"``)."""

from __future__ import annotations

from typing import NotRequired, TypedDict


class RpcInfo(TypedDict):
    """A name the cluster provides that the user may call."""

    rpc: str                 # the name
    providers: int           # its providers across the cluster
    nodes: dict[str, int]    # node name -> its providers there


class ProviderInfo(TypedDict):
    """One provider of a name, with its node's figures of it for that name alone (a
    connection providing several names has figures per name); a node that gave too
    little to say more appears once as ``{"provider": None, "node", "count"}``."""

    provider: str | None               # its label (``user/name@session``); None: see count
    node: str
    count: NotRequired[int]            # only with provider None: that node's providers
    weight: NotRequired[float]         # the asked node's weights file's (1 without one)
    calls_per_s: NotRequired[float]    # calls ended over about the last minute, per s
    ms: NotRequired[float]             # a timed attempt's time, peak EWMA
    outstanding: NotRequired[int]      # attempts under way now
    calls: NotRequired[int | None]     # these four: over about the last minute
    errors: NotRequired[int | None]    # (p50/p99 None: no attempt timed)
    p50_ms: NotRequired[float | None]
    p99_ms: NotRequired[float | None]
