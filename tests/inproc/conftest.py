"""The middle layer: a real node (sessions, router, WebSocket server) on the test's own
event loop, real WebSocket clients, no processes. For what needs no process of its own:
a node's answers to what clients send. Kills, pauses, signals and real CPU contention stay
in tests/integration, tests/cluster and tests/faults."""

from __future__ import annotations

import asyncio

import pytest

from rpcbus.broker import config as config_mod
from rpcbus.broker.local import RedisServer
from rpcbus.broker.node import Node

from ..timing import wait

# As tests/integration/conftest.py: short timeouts keep failover tests quick.
FAST = {
    "RPCBUS_AUTH_MODE": "none",
    "RPCBUS_NODE_PORT": "0",
    "RPCBUS_RPC_ACK_TIMEOUT": "0.3",
    "RPCBUS_RPC_RESPONSE_TIMEOUT": "2.0",
    "RPCBUS_SERVER_DRAIN_TIMEOUT": "5.0",
}


class InProcessNode:
    """A ``Node`` running as a task of the current loop; ``url`` once it is ready."""

    def __init__(self, **env: str) -> None:
        self.node = Node(config_mod.load(None, env={**FAST, **env}))
        self.task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        return self.node.url

    @property
    def name(self) -> str:
        return self.node.name

    async def start(self) -> InProcessNode:
        self.task = asyncio.create_task(self.node.run(), name="inproc-node")
        async with asyncio.timeout(wait(10)):
            while not self.node.ready:           # run() sets it, nothing to await on
                assert not self.task.done(), self.task.exception()
                await asyncio.sleep(0.005)
        return self

    async def stop(self) -> None:
        """The graceful stop; raises what the node's run() raised."""
        assert self.task is not None
        self.node.stop()
        async with asyncio.timeout(wait(15)):
            await self.task
        assert self.node.failed is None, self.node.failed


@pytest.fixture
async def node():
    """One in-process node per test; it must stop cleanly."""
    n = await InProcessNode().start()
    yield n
    await n.stop()


@pytest.fixture
async def start_node():
    """Start in-process nodes with extra settings (``RPCBUS_*``); all stopped afterwards."""
    started: list[InProcessNode] = []

    async def start(**env: str) -> InProcessNode:
        n = await InProcessNode(**env).start()
        started.append(n)
        return n

    yield start
    for n in started:
        await n.stop()


def stats(n: InProcessNode) -> dict:
    """The node's /stats counters (read directly: an HTTP request from this loop's thread
    would block the node it asks)."""
    return n.node.snapshot()


# As tests/cluster/conftest.py: quick heartbeats and failover.
CLUSTER_FAST = {
    "RPCBUS_RPC_ACK_TIMEOUT": "0.5",
    "RPCBUS_RPC_RESPONSE_TIMEOUT": "5.0",
    "RPCBUS_CLUSTER_HEARTBEAT_INTERVAL": "0.25",
    "RPCBUS_CLUSTER_HEARTBEAT_MISSES": "3",
}


class InProcessCluster:
    """A real redis-server (a process: the bus needs one) and in-process nodes n1..nN."""

    def __init__(self, nodes: int = 3, **env: str) -> None:
        self.redis = RedisServer().start()
        self.nodes = [InProcessNode(**{**CLUSTER_FAST, "RPCBUS_NODE_NAME": f"n{i + 1}",
                                       "RPCBUS_CLUSTER_REDIS_URL": self.redis.url, **env})
                      for i in range(nodes)]

    async def start(self) -> InProcessCluster:
        for n in self.nodes:
            await n.start()
        async with asyncio.timeout(wait(10)):  # until every node has heard every other
            while not all(len(n.node.link.membership.members) >= len(self.nodes) - 1
                          for n in self.nodes):
                await asyncio.sleep(0.02)
        return self

    async def stop(self) -> None:
        try:
            for n in self.nodes:
                await n.stop()
        finally:
            self.redis.stop()


async def _cluster(nodes: int):
    c = InProcessCluster(nodes)
    try:
        await c.start()
        yield c
    finally:
        await c.stop()


@pytest.fixture
async def cluster2():
    """Two in-process nodes n1, n2 on one real redis-server."""
    async for c in _cluster(2):
        yield c


@pytest.fixture
async def cluster3():
    """Three in-process nodes n1..n3 on one real redis-server."""
    async for c in _cluster(3):
        yield c
