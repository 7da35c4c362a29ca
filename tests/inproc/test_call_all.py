"""call_all across cluster3 nodes (in process, over a real redis-server): a reply per
provider, named by provider and node, with its value or its error; the deadline; each
provider runs it once; max_replies and cancelling stop the rest."""

import asyncio
from collections import Counter

import pytest

import rpcbus

from ..timing import wait


async def test_a_reply_from_every_provider_on_every_node(cluster3):
    runs = Counter()
    cancelled = asyncio.Event()

    async def ok(data):
        runs["ok"] += 1
        return {"double": data * 2}

    async def fails(data):
        runs["fails"] += 1
        raise rpcbus.AppError("OUT_OF_STOCK", "none left", {"sku": data})

    async def slow(data):
        runs["slow"] += 1
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            runs["slow stopped"] += 1
            cancelled.set()
            raise

    clients = []
    try:
        for i, (name, handler) in enumerate((("ok", ok), ("fails", fails), ("slow", slow))):
            c = await rpcbus.connect(cluster3.nodes[i].url, name=name)
            await c.provide("inventory.check", handler)
            clients.append(c)
        caller = await rpcbus.connect(cluster3.nodes[0].url, name="asker")
        clients.append(caller)
        loop = asyncio.get_running_loop()
        started = loop.time()
        replies = await caller.call_all("inventory.check", 21, timeout=1.5)
        took = loop.time() - started
        by = {r.provider.split("@")[0]: r for r in replies}
        assert sorted(by) == ["fails", "ok", "slow"], replies
        assert by["ok"].value == {"double": 42} and by["ok"].ok
        assert by["ok"].node == "n1" and by["fails"].node == "n2" and by["slow"].node == "n3"
        err = by["fails"].error
        assert isinstance(err, rpcbus.AppError) and (err.code, err.data) == (
            "OUT_OF_STOCK", {"sku": 21})
        assert isinstance(by["slow"].error, rpcbus.ResponseTimeoutError)
        assert 1.2 < took < 2.5, took
        await asyncio.wait_for(cancelled.wait(), wait(5))        # the slow one was stopped
        assert runs == {"ok": 1, "fails": 1, "slow": 1, "slow stopped": 1}  # each ran once

        # the first reply is enough: the rest are cancelled (or never start)
        runs.clear()
        first = await caller.call_all("inventory.check", 1, timeout=5, max_replies=1)
        assert len(first) == 1 and first[0].provider.split("@")[0] in ("ok", "fails")
        async with asyncio.timeout(wait(5)):
            while runs["slow"] != runs["slow stopped"]:
                await asyncio.sleep(0.01)
        # nobody provides it: no reply, at once
        assert await caller.call_all("nobody.home", None, timeout=5) == []
        # the sync client does the same
        got = await asyncio.to_thread(sync_call_all, cluster3.nodes[1].url)
        assert got == {"ok": {"double": 4}, "fails": "AppError",
                       "slow": "ResponseTimeoutError"}, got
    finally:
        await asyncio.gather(*(c.close() for c in clients))


def sync_call_all(url):
    with rpcbus.connect_sync(url) as c:
        return {r.provider.split("@")[0]: r.value if r.ok else type(r.error).__name__
                for r in c.call_all("inventory.check", 2, timeout=0.5)}


async def test_cancelling_a_call_all_stops_every_handler(cluster3):
    started, stopped = asyncio.Queue(), asyncio.Queue()

    def hanging(tag):
        async def handler(data):
            started.put_nowait(tag)
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                stopped.put_nowait(tag)
                raise
        return handler

    clients = []
    try:
        for i, n in enumerate(cluster3.nodes):
            c = await rpcbus.connect(n.url, name=f"p{i}")
            await c.provide("hang", hanging(f"p{i}"))
            clients.append(c)
        caller = await rpcbus.connect(cluster3.nodes[2].url)
        clients.append(caller)
        task = asyncio.create_task(caller.call_all("hang", None, timeout=20))
        async with asyncio.timeout(wait(5)):                 # every provider runs it
            assert {await started.get() for _ in range(3)} == {"p0", "p1", "p2"}
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        async with asyncio.timeout(wait(5)):
            assert {await stopped.get() for _ in range(3)} == {"p0", "p1", "p2"}
    finally:
        await asyncio.gather(*(c.close() for c in clients))


async def test_a_call_all_is_charged_per_provider_and_its_fan_out_is_capped():
    """20 providers of a name on 2 nodes; the caller may make 50 requests a minute: each
    call_all counts once per provider it reaches, so the third is RATE_LIMITED, unrun;
    with ``limits.max_fanout`` under 20 a call_all is refused LIMIT_EXCEEDED, unrun."""
    import json

    from rpcbus.broker.auth import token_digest

    from .conftest import InProcessCluster

    users = {"svc": {"token_sha256": token_digest("svc"), "provide": ["*"], "call": ["*"]},
             "app": {"token_sha256": token_digest("app"), "call": ["*"],
                     "rate_messages": 50}}
    cluster = InProcessCluster(2, RPCBUS_AUTH_MODE="users",
                               RPCBUS_AUTH_USERS=json.dumps(users),
                               RPCBUS_LIMITS_RATE_WINDOW="60")
    runs = Counter()
    clients = []
    try:
        await cluster.start()
        def counted(i):
            return lambda data: runs.update([i]) or i
        for i in range(20):
            c = await rpcbus.connect(cluster.nodes[i % 2].url, token="svc", name=f"p{i}")
            await c.provide("fan.x", counted(i))
            clients.append(c)
        caller = await rpcbus.connect(cluster.nodes[0].url, token="app")
        clients.append(caller)
        async with asyncio.timeout(wait(5)):   # n1 knows n2's ten (a plain call asks for them)
            while cluster.nodes[0].node.router.fanout_of("fan.x", 0.0) < 20:
                await caller.call("fan.x", None)
                await asyncio.sleep(0.02)
        done = sum(runs.values())
        assert len(await caller.call_all("fan.x", None, timeout=5)) == 20
        assert len(await caller.call_all("fan.x", None, timeout=5)) == 20
        with pytest.raises(rpcbus.RateLimitedError):
            await caller.call_all("fan.x", None, timeout=5)
        assert sum(runs.values()) == done + 40
        for n in cluster.nodes:          # what a reload of limits.max_fanout = 15 sets
            n.node.router.limits_changed(15)
        other = await rpcbus.connect(cluster.nodes[1].url, token="svc")
        clients.append(other)
        with pytest.raises(rpcbus.LimitExceededError, match="would reach 20 providers"):
            await other.call_all("fan.x", None, timeout=5)
        assert sum(runs.values()) == done + 40
    finally:
        for c in clients:
            await c.close()
        await cluster.stop()
