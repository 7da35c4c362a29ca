"""What the bus's seal setting lets someone with Redis access do (docs/security.md "Trust
on the bus"): on an unsealed bus, run calls and invent members; on a sealed one, not even
replay a node's own past control batches to it after it restarts."""

import asyncio
import json
import time

import redis.asyncio as aioredis

import rpcbus
from rpcbus.cluster import messages as m
from rpcbus.cluster.seal import START_SLACK, new_key

from ..timing import wait
from .conftest import stats


async def first_batch_from(pubsub, sender):
    async with asyncio.timeout(wait(10)):
        while True:
            msg = await pubsub.get_message(timeout=1)
            if msg and msg["type"] == "message":
                batch = m.decode_batch(msg["data"])
                if batch.sender == sender:
                    return batch


async def test_an_unsealed_bus_lets_anyone_on_redis_run_calls_and_invent_nodes(make_cluster):
    c = make_cluster(nodes=2, RPCBUS_CLUSTER_SEAL="none")     # on loopback: allowed
    n1, n2 = c.nodes
    runs = []
    forger = aioredis.Redis.from_url(c.redis_url)
    ctrl = forger.pubsub()
    await ctrl.subscribe("rpcbus:ctrl")
    try:
        async with rpcbus.connect(n2.url) as prov:
            await prov.provide("work", lambda d: runs.append(d) or d)
            n1_inc = (await first_batch_from(ctrl, "n1")).incarnation   # heartbeats say it
            n2_inc = (await first_batch_from(ctrl, "n2")).incarnation
            now = time.monotonic()
            await forger.publish("rpcbus:node:n2", m.encode_batch("n1", n1_inc, n2_inc, now, [
                [m.INVOKE, 10**9, "work", "pwned", 5000, 5000, "forger"]]))
            await forger.publish("rpcbus:ctrl", m.encode_batch("fake", 1, 0, now, [
                [m.STATE, m.READY, "ws://127.0.0.1:9", time.time(), {}],
                [m.PROVIDER_UPDATE, "work", 1000]]))
            async with asyncio.timeout(wait(10)):
                while "pwned" not in runs or "fake" not in stats(n1)["cluster"]["members"]:
                    await asyncio.sleep(0.05)
            assert stats(n2)["cluster"]["bus"]["rejected"] == 0
    finally:
        await ctrl.aclose()
        await forger.aclose()


async def test_a_restarted_node_refuses_control_batches_sealed_before_it_started(make_cluster):
    key = new_key()
    c = make_cluster(nodes=2, RPCBUS_CLUSTER_SEAL="sign", RPCBUS_CLUSTER_KEY_ID="k1",
                     RPCBUS_CLUSTER_KEYS=json.dumps({"k1": key}))
    n1, n2 = c.nodes
    spy = aioredis.Redis.from_url(c.redis_url)
    ctrl = spy.pubsub()
    await ctrl.subscribe("rpcbus:ctrl")
    captured = []

    async def capture():
        async for msg in ctrl.listen():
            if msg["type"] == "message":
                captured.append(msg["data"])

    listener = asyncio.create_task(capture())
    try:
        async with rpcbus.connect(n2.url) as prov:          # n2 says: "work", 1 provider
            await prov.provide("work", lambda d: d)
            async with rpcbus.connect(n1.url) as caller:
                assert await caller.call("work", 1, timeout=5) == 1
        await asyncio.sleep(0.5)                            # n2 says: "work", 0 providers
        listener.cancel()
        assert captured
        # what is tested is age: the batches must be older than the slack a restarted node
        # gives clocks that disagree (START_SLACK), so this waits for time itself to pass
        await asyncio.sleep(START_SLACK + 0.5)
        n1 = await asyncio.to_thread(c.restart, 0)
        before = stats(n1)["cluster"]["bus_rejected"].get("before_start", 0)
        for batch in captured:                              # within max_skew: not "skew"
            await spy.publish("rpcbus:ctrl", batch)
        async with asyncio.timeout(wait(10)):
            while stats(n1)["cluster"]["bus_rejected"].get("before_start", 0) \
                    < before + len(captured):
                await asyncio.sleep(0.05)
        assert "n2" not in json.dumps(stats(n1)["cluster"]["cache"])
        async with rpcbus.connect(n1.url) as caller:        # nobody provides it: said at once
            try:
                await caller.call("work", 2, timeout=5)
                raise AssertionError("a call to a name nobody provides was answered")
            except rpcbus.NoProviderError:
                pass
    finally:
        listener.cancel()
        await ctrl.aclose()
        await spy.aclose()
