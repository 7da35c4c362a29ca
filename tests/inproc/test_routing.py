"""Calls across nodes: reach, weighted choice, discovery, failover. In-process nodes (the
cluster link and bus on this test's loop) over a real redis-server; a paused node process
is in tests/cluster/test_routing.py."""

import asyncio
import math
from collections import Counter

import pytest
import redis.asyncio

import rpcbus
from rpcbus import protocol as p
from rpcbus.cluster.messages import RPC_QUERY, decode_batch

from ..hang import Hang
from ..integration.raw import RawPeer
from ..timing import wait
from .conftest import stats


def served_by(name):
    async def handler(data, ctx):  # on the loop: the nodes here share it with the providers
        return {"served_by": name, "data": data}
    return handler


async def test_callers_on_every_node_reach_providers_on_every_other(cluster3):
    urls = [n.url for n in cluster3.nodes]
    provs = [await rpcbus.connect(u, name=f"prov-{i + 1}") for i, u in enumerate(urls)]
    callers = [await rpcbus.connect(u) for u in urls]
    try:
        for i, p in enumerate(provs):
            await p.provide(f"only.n{i + 1}", served_by(f"n{i + 1}"))
        for ci, c in enumerate(callers):
            for pi in range(3):
                got = await c.call(f"only.n{pi + 1}", ci, timeout=5)
                assert got == {"served_by": f"n{pi + 1}", "data": ci}
    finally:
        for c in provs + callers:
            await c.close()


async def test_weighted_choice_follows_provider_counts(cluster3):
    n1, n2, n3 = cluster3.nodes
    # the cluster-wide weighted draw (cluster.policy = "cluster"; local-first keeps n1's
    # callers' calls on n1), a draw per call, for the binomial bound below
    # (cluster.affinity draws a frame's calls 32 at a time; tests/unit/test_cluster_pure.py
    # checks the shares of those)
    for n in cluster3.nodes:
        n.node.router.local_first = False
        n.node.router.draws.affinity = 1
        # room for every call the draw sends a target: admission would move calls past a
        # node's starting limit (256) to the other node, which is not the draw measured
        n.node.router.initial_concurrency = 4000
        for peer in n.node.router._paced:   # the nodes, paced as they joined
            peer.pace.limit = 4000.0
    provs = [await rpcbus.connect(n1.url) for _ in range(3)] + [await rpcbus.connect(n2.url)]
    try:
        for i, p in enumerate(provs):
            await p.provide("weighted", served_by("n1" if i < 3 else "n2"))
        for caller_node in (n3, n1):               # from a node without providers, and from A
            async with rpcbus.connect(caller_node.url) as c:
                # the counts the draw weighs, as this node knows them: a discovery may be
                # answered before the last of n1's PROVIDEs is heard (the first 500 calls
                # then went 241 to n1, not 375)
                await c.call("weighted", -1, timeout=5)
                cache = caller_node.node.link.core.cache
                remote = {"n1": 3, "n2": 1} if caller_node is n3 else {"n2": 1}
                async with asyncio.timeout(wait(5)):
                    while {n: cache.entries["weighted"].counts.get(n) for n in remote} != remote:
                        await asyncio.sleep(0.01)
                # 500 at a time: 4,000 at once can hold this one process's loop past half
                # the ack timeout, and providers refuse REQUESTs read that late (stale),
                # which moves them to the other node and skews the shares measured here
                got = []
                for start in range(0, 4000, 500):
                    got += await asyncio.gather(*(c.call("weighted", i, timeout=30)
                                                  for i in range(start, start + 500)))
                assert sum(p.stale_requests for p in provs) == 0
                share = Counter(g["served_by"] for g in got)["n1"] / 4000
                # Binomial(4000, 0.75): sd = sqrt(.75 * .25 / 4000) = 0.00685; 4.9 sd is a
                # two-sided false-failure chance below one in a million.
                assert abs(share - 0.75) < 4.9 * math.sqrt(0.75 * 0.25 / 4000), (
                    caller_node.name, share)
    finally:
        for p in provs:
            await p.close()


async def test_provide_and_unprovide_reach_other_nodes_before_the_ttl(cluster3):
    n1, n2, n3 = cluster3.nodes
    async with rpcbus.connect(n1.url) as p1, rpcbus.connect(n3.url) as p3, \
            rpcbus.connect(n2.url) as c:
        await p1.provide("moving", served_by("n1"))
        assert (await c.call("moving", 0, timeout=5))["served_by"] == "n1"
        await p1.unprovide("moving")
        await p3.provide("moving", served_by("n3"))
        async with asyncio.timeout(wait(5)):                # updates, not the 60 s TTL
            while True:                               # n1's 0 may arrive before n3's 1
                try:
                    if (await c.call("moving", 0, timeout=5))["served_by"] == "n3":
                        break
                except rpcbus.NoProviderError:
                    pass
        await p3.unprovide("moving")
        async with asyncio.timeout(wait(5)):
            while True:
                try:
                    await c.call("moving", 0, timeout=5)
                except rpcbus.NoProviderError:
                    break


async def test_a_burst_of_calls_to_an_unknown_name_makes_one_query(cluster3):
    """...answered by every node, the zeros on the asker's own topic only: nothing about
    the name reaches the control topic but the query."""
    n2 = cluster3.nodes[1]
    before = stats(n2)["cluster"]
    spy = redis.asyncio.Redis.from_url(cluster3.redis.url)
    pubsub = spy.pubsub()
    await pubsub.subscribe("rpcbus:ctrl")
    try:
        async with rpcbus.connect(n2.url) as c:
            got = await asyncio.gather(*(c.call("nobody.provides.this", i, timeout=5)
                                         for i in range(1000)), return_exceptions=True)
        on_ctrl = []  # all the spy got by 0.5 s after the calls ended (answers come first)
        deadline = asyncio.get_running_loop().time() + 0.5
        while asyncio.get_running_loop().time() < deadline:
            msg = await pubsub.get_message(timeout=0.1)
            if msg is not None and msg["type"] == "message":
                on_ctrl += [x for x in decode_batch(msg["data"]).messages
                            if "nobody.provides.this" in x]
    finally:
        await pubsub.aclose()
        await spy.aclose()
    assert all(isinstance(g, rpcbus.NoProviderError) for g in got)
    after = stats(n2)["cluster"]
    assert after["queries_sent"] == before["queries_sent"] + 1
    assert after["query_retries"] == before["query_retries"]  # both zeros reached n2
    assert on_ctrl == [[RPC_QUERY, "nobody.provides.this"]]


async def test_reject_and_silent_providers_fail_over_across_nodes(cluster3):
    n1, n2, n3 = cluster3.nodes
    for n in cluster3.nodes:  # a draw per call: some of the calls must reach n1's providers
        n.node.router.draws.affinity = 1  # (with draws held for a frame, n1 may get none of the 50)
    runs = Counter()

    def refuse(data):
        runs[("refuse", data)] += 1
        raise rpcbus.Reject()

    def good(data):
        runs[("good", data)] += 1
        return data

    async with rpcbus.connect(n1.url) as a, rpcbus.connect(n1.url) as _b, \
            rpcbus.connect(n2.url) as g, rpcbus.connect(n3.url) as c:
        await a.provide("failover", refuse)
        await g.provide("failover", good)
        assert await asyncio.gather(*(c.call("failover", i, timeout=10)
                                      for i in range(200))) == list(range(200))
        assert all(runs[("good", i)] == 1 for i in range(200))
        assert any(runs[("refuse", i)] for i in range(200))
        await a.unprovide("failover")
        await g.unprovide("failover")
    # A provider that never accepts nor answers: n1's own ack timeout (0.3 s) moves
    # each call, n1 has no other provider and REJECTs, and the origin tries n2.
    silent = await RawPeer.open(n1.url)
    await silent.provide("failover2")
    async with rpcbus.connect(n2.url) as g, rpcbus.connect(n3.url) as c:
        await g.provide("failover2", good)
        got = await asyncio.gather(*(c.call("failover2", 1000 + i, timeout=10)
                                     for i in range(50)))
        assert got == [1000 + i for i in range(50)]
        assert all(runs[("good", 1000 + i)] == 1 for i in range(50))
        cancel = await silent.expect(p.CANCEL)        # n1 told its silent provider
        assert cancel[1] > 0
    await silent.close()


async def test_a_cancelled_call_cancels_its_handler_on_another_node(cluster3):
    n1, n2, _ = cluster3.nodes
    slow = Hang()
    started, cancelled = slow.started, slow.cancelled

    async with rpcbus.connect(n2.url) as prov, rpcbus.connect(n1.url) as caller:
        await prov.provide("far.slow", slow)
        call = asyncio.create_task(caller.call("far.slow", 1, timeout=30))
        async with asyncio.timeout(wait(5)):
            await started.wait()
        call.cancel()
        async with asyncio.timeout(wait(5)):
            await cancelled.wait()                    # on n2, through n1 and the bus
        assert stats(n1)["pending"] == 0
        async with asyncio.timeout(wait(5)):
            while stats(n2)["pending"]:
                await asyncio.sleep(0.01)


async def test_a_call_that_crosses_nodes_is_counted_once_in_the_nodes_call_counts(cluster3):
    """calls_ok / calls_failed (the heartbeat's, the dashboard's and rpcbus bench's live
    rate) count a call on its caller's node only; the router's other counters also count
    it as an INVOKE on the node that served it."""
    n1, n2, n3 = cluster3.nodes
    async with rpcbus.connect(n2.url) as prov, rpcbus.connect(n1.url) as caller:
        await prov.provide("count.once", lambda d: d)
        await prov.provide("count.fail", lambda d: 1 / 0)
        assert await asyncio.gather(*(caller.call("count.once", i, timeout=5)
                                      for i in range(40))) == list(range(40))
        for _ in range(3):
            with pytest.raises(rpcbus.ProviderError):
                await caller.call("count.fail", timeout=5)
    routers = [stats(n)["router"] for n in (n1, n2, n3)]
    assert [r["calls_ok"] for r in routers] == [40, 0, 0]
    assert [r["calls_failed"] for r in routers] == [3, 0, 0]
    assert routers[1]["ok"] == 40                     # n2 served them: INVOKEs ended there
