"""A node's place in the cluster: the Redis bus feeding the cluster core (the shell).

``ClusterLink`` runs the bus (cluster/bus.py) and hands what it hears to a
``ClusterCore`` (cluster/core.py, the rules) with the loop's clock; the core's
messages leave through the bus's outbox. Nothing here decides anything about
a call. ``run()`` serves the bus until cancelled; cancelling it closes the bus's
Redis connections.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable

from rpcbus.cluster import messages as m
from rpcbus.cluster.bus import Bus
from rpcbus.cluster.core import ClusterCore
from rpcbus.cluster.membership import Membership
from rpcbus.cluster.routing import Routing
from rpcbus.cluster.seal import Sealer
from rpcbus.cluster.settings import ClusterSection


class ClusterLink:
    """See the module docstring; ``core`` is the router's view of the cluster."""

    def __init__(self, router: Routing, config: ClusterSection, me: str, url: str,
                 info: Callable[[], Any]) -> None:
        self.loop = asyncio.get_running_loop()
        self.up = asyncio.Event()             # set while the bus is connected
        self.on_lost: Callable[[], None] = lambda: None  # the bus went down (the node's)
        incarnation = m.new_incarnation()
        sealer = None
        if config.seal != "none":
            sealer = Sealer(config.seal, config.keys, config.key_id, config.max_skew)
        time_now = self.loop.time
        self.bus = Bus(config.redis_url, config.namespace, me, incarnation,
                       lambda batch, now: None, self._on_up, self._on_down, sealer=sealer,
                       max_skew=config.max_skew, tls_ca=config.redis_tls_ca,
                       on_skew=self._on_skew, on_unencodable=self._unencodable,
                       clock=time_now, loopback_only=config.loopback_only)
        self.core = ClusterCore(router, config, me, url, info, outbox=self.bus.outbox,
                                clock=time_now, stale=self.bus.stale,
                                incarnation=incarnation, started=time.time())
        on_batch = self.core.on_batch

        def batch_in(batch: Any, now: float) -> None:  # one call per batch
            router.read_at = time.perf_counter()  # the outcomes' time (per-rpc latency)
            on_batch(batch, now)
        self.bus.on_batch = batch_in

    # what the node reads

    @property
    def available(self) -> bool:
        return self.core.available

    @property
    def starting(self) -> int:
        return self.core.starting

    @property
    def membership(self) -> Membership:
        return self.core.membership

    def joined(self, now: float) -> bool:
        return self.core.joined(now)

    def clock_problem(self, now: float) -> str | None:
        return self.core.clock_problem(now)

    def snapshot(self) -> dict[str, Any]:
        return {**self.core.snapshot(), "bus": {**self.bus.stats, **self.bus.outbox.stats},
                "bus_rejected": dict(self.bus.rejected)}

    # what the node does

    async def run(self) -> None:
        await self.bus.run()

    def set_state(self, state: str) -> None:
        """Announce ``ready`` or ``terminating`` now (and in every heartbeat after)."""
        self.core.set_state(state, self.loop.time())

    async def wait_joined(self) -> None:
        """Until ``joined``: the bus is up and a first round of heartbeats was heard."""
        while not self.core.joined(self.loop.time()):
            if not self.core.available:
                await self.up.wait()
            else:
                await asyncio.sleep(self.core.joined_at() - self.loop.time())

    def stalled(self, now: float) -> None:
        self.core.stalled(now)

    def tick(self, now: float) -> None:
        self.core.tick(now)

    # what the bus tells

    def _on_up(self) -> None:
        self.up.set()
        self.core.on_up(self.loop.time())

    def _on_down(self, reason: str) -> None:
        self.up.clear()
        self.core.on_down(reason, self.loop.time())
        self.on_lost()

    def _on_skew(self, sender: str, offset_s: float) -> None:
        self.core.on_skew(sender, offset_s, self.loop.time())

    def _unencodable(self, topic: str, to: int, msg: list[Any], why: str) -> None:
        self.core.unencodable(topic, to, msg, why)
