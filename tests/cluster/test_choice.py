"""The ``local-first`` policy with real nodes (broker/choice.py): calls stay on their
node while it has room, spread over the cluster when callers sit on one node, and leave
a provider that turns slow."""

import asyncio
import time
from collections import Counter

import rpcbus
from tests.cluster.conftest import stats


def serving(name, served, delay):
    """A provider ``name`` that counts its calls and takes ``delay[0]`` s for each."""
    async def handler(data):
        served[name] += 1
        await asyncio.sleep(delay[0])
        return name
    return handler


async def providers_on(nodes, served, delay):
    """A provider ``p1``, ``p2``, ... on each of ``nodes`` (``serving``)."""
    clients = []
    for i, n in enumerate(nodes):
        provider = await rpcbus.connect(n.url)
        await provider.provide("work", serving(f"p{i + 1}", served, delay))
        clients.append(provider)
    return clients


async def load(clients, seconds, inflight):
    """``inflight`` calls at a time on each client, for ``seconds``."""
    until = time.monotonic() + seconds

    async def lane(client):
        while time.monotonic() < until:
            await client.call("work", None, timeout=10)
    await asyncio.gather(*(lane(c) for c in clients for _ in range(inflight)))


async def test_calls_stay_on_their_node_when_every_node_calls_and_provides(make_cluster):
    c = make_cluster(nodes=3, RPCBUS_CLUSTER_POLICY="local-first")
    served = Counter()
    clients = []
    try:
        clients += await providers_on(c.nodes, served, [0.002])
        callers = [await rpcbus.connect(n.url) for n in c.nodes]
        clients += callers
        for caller in callers:  # discovery done everywhere
            await caller.call("work", None, timeout=10)
        await load(callers, 1.0, inflight=10)  # the nodes hear each other's rates
        before = [stats(n)["router"] for n in c.nodes]
        await load(callers, 2.0, inflight=10)
        after = [stats(n)["router"] for n in c.nodes]
    finally:
        await asyncio.gather(*(x.close() for x in clients))
    local = sum(a["local_calls"] - b["local_calls"] for a, b in zip(after, before, strict=True))
    remote = sum(a["remote_calls"] - b["remote_calls"] for a, b in zip(after, before, strict=True))
    assert local > 300 and remote <= 0.05 * (local + remote), (local, remote)


async def test_callers_on_one_node_spread_over_every_provider(make_cluster):
    c = make_cluster(nodes=3, RPCBUS_CLUSTER_POLICY="local-first")
    served = Counter()
    clients = []
    try:
        clients += await providers_on(c.nodes, served, [0.01])
        caller = await rpcbus.connect(c.nodes[0].url)
        clients.append(caller)
        await caller.call("work", None, timeout=10)
        await load([caller], 1.0, inflight=60)  # the nodes hear each other's load
        served.clear()
        await load([caller], 3.0, inflight=60)
    finally:
        await asyncio.gather(*(x.close() for x in clients))
    total = sum(served.values())
    shares = {p: n / total for p, n in served.items()}
    assert all(abs(share - 1 / 3) <= 0.3 / 3 for share in shares.values()), shares


async def test_a_provider_that_turns_slow_loses_its_share_within_two_seconds(make_cluster):
    c = make_cluster(nodes=2, RPCBUS_CLUSTER_POLICY="local-first")
    served = Counter()
    delays = {f"p{i}": [0.005] for i in range(1, 5)}
    clients = []
    try:
        for i in range(1, 5):
            provider = await rpcbus.connect(c.nodes[i % 2].url)
            await provider.provide("work", serving(f"p{i}", served, delays[f"p{i}"]))
            clients.append(provider)
        callers = [await rpcbus.connect(n.url) for n in c.nodes]
        clients += callers
        for caller in callers:
            await caller.call("work", None, timeout=10)
        await load(callers, 1.0, inflight=20)
        delays["p4"][0] = 0.05                    # ten times slower from now on
        await load(callers, 2.0, inflight=20)     # the bound: within 2 s
        served.clear()
        await load(callers, 2.0, inflight=20)
    finally:
        await asyncio.gather(*(x.close() for x in clients))
    assert served["p4"] / sum(served.values()) < 0.1, served
