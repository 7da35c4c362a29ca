"""A node takes clients only once it has joined the cluster: its first calls find their
providers at once (before: it took connections and calls while /readyz said "joining
the cluster", and the first calls waited out the join, up to 1.5 heartbeat intervals)."""

from __future__ import annotations

import asyncio
import threading
import urllib.error
import urllib.request

import rpcbus
from rpcbus.broker.local import free_port
from rpcbus.broker.process import NodeProcess

from .conftest import FAST


def _readyz(port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as r:
            return r.status, r.read().decode().strip()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode().strip()
    except OSError:
        return 0, "not listening"


async def test_a_joining_node_refuses_clients_until_ready_and_the_sdk_waits(make_cluster):
    # heartbeats every 0.6 s: the join (1.5 intervals, 0.9 s) is long enough to be seen
    slow_beats = {"RPCBUS_CLUSTER_HEARTBEAT_INTERVAL": "0.6"}
    cluster = make_cluster(nodes=1, **slow_beats)
    port = free_port()
    joining = NodeProcess("--name", "n2", "--port", str(port), "--redis", cluster.redis_url,
                          env={**FAST, **slow_beats})
    started = threading.Thread(target=joining.start, daemon=True)
    try:
        async with rpcbus.connect(cluster.nodes[0].url) as provider:
            await provider.provide("math.double", lambda x: 2 * x)
            started.start()
            while _readyz(port)[0] == 0:  # wait for it to listen (it is starting)
                await asyncio.sleep(0.01)
            async with rpcbus.connect(f"ws://127.0.0.1:{port}") as caller:
                # the SDK was let in only once the node had joined
                assert _readyz(port) == (200, "ready")
                assert await caller.call("math.double", 21, timeout=5) == 42
    finally:
        await asyncio.to_thread(started.join, 30)
        assert joining.stop() == 0
    assert joining.events("node_ready")
