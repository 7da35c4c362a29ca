"""Discovery across two nodes (in process, over a real redis-server): every name with its
providers per node, and one name's providers with their last minute's figures, whichever
node is asked (permissions: tests/integration/test_security.py)."""

import asyncio

import rpcbus

from ..timing import wait


async def test_names_and_providers_with_their_last_minute_from_any_node(cluster2):
    n1, n2 = cluster2.nodes
    clients = []

    async def quick(data):
        return data

    async def failing(data):
        raise rpcbus.AppError("NOPE", "no")
    try:
        for node, name, rpc, handler in ((n1, "a1", "work", quick), (n1, "a2", "work", quick),
                                         (n2, "b1", "work", failing), (n2, "b2", "other", quick)):
            c = await rpcbus.connect(node.url, name=name)
            await c.provide(rpc, handler)
            clients.append(c)
        await clients[0].provide("quiet", quick)   # a1's second name: nobody calls it
        callers = [await rpcbus.connect(n.url) for n in (n1, n2)]
        clients += callers
        for caller in callers:
            for i in range(40):
                try:
                    await caller.call("work", i, timeout=5)
                except rpcbus.AppError:
                    pass
        async with asyncio.timeout(wait(10)):     # until each node's heartbeat has told the other
            while True:                     # every call ended, as its provider's node counts
                found = {(r["provider"].split("@")[0], r["node"]): r
                         for r in await callers[1].providers("work") if r["provider"]}
                known = [{r["rpc"] for r in await c.rpcs()} for c in callers]
                if sum(r["calls"] for r in found.values()) == 80 and all(
                        names == {"work", "other", "quiet"} for names in known):
                    break
                await asyncio.sleep(0.1)
        assert set(found) == {("a1", "n1"), ("a2", "n1"), ("b1", "n2")}
        # figures per (provider, rpc): a1's quiet name carries none of its calls of "work"
        [quiet] = await callers[1].providers("quiet")
        assert found[("a1", "n1")]["calls"] > 0 and quiet["provider"].startswith("a1@")
        assert (quiet["calls"], quiet["calls_per_s"], quiet["outstanding"]) == (0, 0.0, 0)
        assert found[("b1", "n2")]["errors"] == found[("b1", "n2")]["calls"] > 0
        assert all(r["errors"] == 0 and r["weight"] == 1.0 for k, r in found.items()
                   if k[0] != "b1")
        assert all(r["p50_ms"] is not None and r["p99_ms"] >= r["p50_ms"]
                   for r in found.values() if r["calls"] >= 8)
        for caller in callers:              # the same names from either node
            assert await caller.rpcs() == [
                {"rpc": "other", "providers": 1, "nodes": {"n2": 1}},
                {"rpc": "quiet", "providers": 1, "nodes": {"n1": 1}},
                {"rpc": "work", "providers": 3, "nodes": {"n1": 2, "n2": 1}}]
        assert await callers[0].providers("nobody") == []
    finally:
        await asyncio.gather(*(c.close() for c in clients))
