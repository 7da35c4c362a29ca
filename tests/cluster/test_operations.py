"""What an operator sees of a cluster: readiness follows the bus; trace context crosses
nodes; metrics count the bus."""

import asyncio
import glob
import json
from pathlib import Path

import rpcbus

from ..integration.test_operations import TRACE, get, samples


async def test_trace_context_crosses_nodes_and_bus_traffic_is_counted(make_cluster):
    c = make_cluster(nodes=2)
    n1, n2 = c.nodes
    async with rpcbus.connect(n2.url) as prov, rpcbus.connect(n1.url) as caller:
        await prov.provide("ops.trace", lambda d, ctx: [ctx.traceparent, d])
        assert await caller.call("ops.trace", 1, traceparent=TRACE, timeout=5) == [TRACE, 1]
        assert await caller.call("ops.trace", 2, timeout=5) == [None, 2]
    m = samples(n1)
    assert m[("rpcbus_calls_total", frozenset({"rpc": "ops.trace", "outcome": "ok"}.items()))] \
        == 2
    assert m[("rpcbus_bus_messages_total", frozenset({"direction": "out"}.items()))] > 0
    assert m[("rpcbus_cluster_available", frozenset())] == 1
    assert ("rpcbus_calls_total", frozenset({"rpc": "ops.trace", "outcome": "ok"}.items())) \
        not in samples(n2)                                  # counted once, where the caller is


async def test_readyz_follows_the_cluster_bus(make_cluster):
    c = make_cluster(nodes=2)
    n1 = c.nodes[0]
    await ready(n1)                  # after a first round of heartbeats ("joining" before)
    assert get(n1, "/readyz") == (200, "ready\n")
    c.redis.kill()
    await asyncio.to_thread(n1.wait_event, "cluster_unavailable", 10.0)
    assert get(n1, "/readyz") == (503, "cluster bus (Redis) unreachable\n")
    assert get(n1, "/healthz")[0] == 200                    # alive: local calls still work
    c.redis.start()
    await asyncio.to_thread(n1.wait_event, "bus_up", 15.0, count=2)
    await ready(n1)


async def test_a_node_started_while_redis_is_down_serves_local_calls_and_joins_later(
        make_cluster):
    c = make_cluster(nodes=2)
    c.redis.kill()
    n1 = await asyncio.to_thread(c.restart, 0)       # waits for Redis a while, then serves
    assert n1.events("node_ready_without_bus")
    assert get(n1, "/readyz") == (503, "cluster bus (Redis) unreachable\n")
    async with rpcbus.connect(n1.url) as prov, rpcbus.connect(n1.url) as caller:
        await prov.provide("local", lambda d: d + 1)
        assert await caller.call("local", 1, timeout=5) == 2
        c.redis.start()
        await ready(n1, 15.0)
        assert await caller.call("local", 2, timeout=5) == 3


async def ready(node, timeout=10.0):
    """Until /readyz answers 200 (a node is "joining" until it heard a round of heartbeats)."""
    async with asyncio.timeout(timeout):
        while get(node, "/readyz")[0] != 200:
            await asyncio.sleep(0.05)


async def test_history_names_the_routing_and_the_serving_node(make_cluster, tmp_path):
    c = make_cluster(nodes=2, RPCBUS_HISTORY_DIR=str(tmp_path), RPCBUS_HISTORY_WINDOW="0.5")
    n1, n2 = c.nodes
    async with rpcbus.connect(n2.url, name="far-worker") as prov, \
            rpcbus.connect(n1.url) as caller:
        await prov.provide("h.far", lambda d: d)
        assert await asyncio.gather(*(caller.call("h.far", i, timeout=5)
                                      for i in range(150))) == list(range(150))
    for node in (n1, n2):
        assert node.stop() == 0                             # the last window is flushed
    rows = [json.loads(line) for path in glob.glob(f"{tmp_path}/*/*/node=*/*.jsonl")
            for line in Path(path).read_text().splitlines()]
    far = [r for r in rows if r["rpc"] == "h.far"]
    worked = [r for r in far if r["calls"]]
    assert {(r["served_by"], r["routed_by"], r["provider"]) for r in worked} == \
        {("n2", "n1", "far-worker")}
    # a 0.5 s window in which the provider was connected but got no call has a presence
    # row from its node (docs/history.md), and one that calls were in flight through
    # without ending in it a row of their route; whether either happens is timing
    for r in far:
        if not r["calls"]:
            assert (r["served_by"], r["routed_by"], r["provider"], r["peak_in_flight"]) \
                == ("n2", "n2", "far-worker", 0) or (
                (r["served_by"], r["routed_by"], r["provider"]) == ("n2", "n1", "far-worker")
                and r["peak_in_flight"] > 0), r
    assert sum(r["ok"] for r in far) == sum(r["calls"] for r in far) == 150
