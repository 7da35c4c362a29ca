"""The cluster bus's security and reach: a process with Redis access but without the key
cannot get a node to run an RPC, divert calls, or change what the nodes think of each
other; keys rotate; Redis ACL credentials and Sentinel work through the URL."""

import asyncio
import json
import subprocess
import sys
import time
from collections import Counter

import pytest
import redis.asyncio as aioredis

import rpcbus
from rpcbus.broker.local import LocalCluster, RedisSentinel, RedisServer
from rpcbus.broker.process import NodeProcess
from rpcbus.cluster import messages as m
from rpcbus.cluster.seal import Sealer, new_key

from ..timing import wait
from .conftest import FAST, stats

KEY = new_key()


def sealed(mode, keys=None, key_id="k1"):
    return {"RPCBUS_CLUSTER_SEAL": mode, "RPCBUS_CLUSTER_KEY_ID": key_id,
            "RPCBUS_CLUSTER_KEYS": json.dumps(keys or {"k1": KEY})}


async def wait_rejected(node, at_least, timeout=10.0):
    async with asyncio.timeout(timeout):
        while (got := stats(node)["cluster"]["bus"]["rejected"]) < at_least:
            await asyncio.sleep(0.05)
    return got


@pytest.mark.parametrize("mode", ["sign", "encrypt"])
async def test_redis_access_without_the_key_cannot_run_divert_or_fake_members(
        make_cluster, mode):
    c = make_cluster(nodes=2, **sealed(mode))
    n1, n2 = c.nodes
    runs = Counter()

    def work(d):
        runs[d] += 1
        return d

    forger = aioredis.Redis.from_url(c.redis_url)
    spy = forger.pubsub()
    await spy.subscribe("rpcbus:node:n2")                  # what n1 sends n2: INVOKEs
    try:
        async with rpcbus.connect(n2.url) as prov, rpcbus.connect(n1.url) as caller:
            await prov.provide("work", work)
            assert await asyncio.gather(*(caller.call("work", i, timeout=5)
                                          for i in range(50))) == list(range(50))
            captured = []
            quiet_until = time.monotonic() + 0.3
            while time.monotonic() < quiet_until:            # until 0.3 s without a batch
                msg = await spy.get_message(timeout=0.1)
                if msg is not None and msg["type"] == "message":
                    captured.append(msg["data"])
                    quiet_until = time.monotonic() + 0.3
            assert captured

            now = time.monotonic()
            invoke = [m.INVOKE, 10**9, "work", "pwned", 5000, 5000, "forger"]
            plain = m.encode_batch("n1", 1, 0, now, [invoke])
            wrong_key = Sealer(mode, {"k1": new_key()}, "k1", 30.0)
            other_id = Sealer(mode, {"k9": new_key()}, "k9", 30.0)
            attacks = [
                ("rpcbus:node:n2", plain),                                   # unsealed
                ("rpcbus:node:n2", wrong_key.seal("rpcbus:node:n2", plain)),  # bad seal
                ("rpcbus:node:n2", other_id.seal("rpcbus:node:n2", plain)),   # unknown key
                *[("rpcbus:node:n2", batch) for batch in captured],           # replays
                ("rpcbus:ctrl", m.encode_batch("fake", 1, 0, now, [                 # divert calls
                    [m.STATE, m.READY, "ws://127.0.0.1:9", time.time(), {}],
                    [m.PROVIDER_UPDATE, "work", 1000]])),
                ("rpcbus:ctrl", wrong_key.seal("rpcbus:ctrl", m.encode_batch("n2", 1, 0, now, [
                    [m.STATE, m.TERMINATING, n2.url, time.time(), {}]]))),   # fake membership
                ("rpcbus:ctrl", m.encode_batch("n1", 1, 0, now, [[m.ANNOUNCE]])),  # (unsealed)
                ("rpcbus:ctrl", wrong_key.seal("rpcbus:ctrl", m.encode_batch(
                    "n2", 1, 0, now, [[m.RPC_QUERY, "work"]]))),
                ("rpcbus:ctrl", wrong_key.seal("rpcbus:ctrl", m.encode_batch(  # "n2 restarted"
                    "n2", 2**62, 0, now, [[m.STATE, m.READY, "ws://127.0.0.1:9", time.time(),
                                           {}], [m.PROVIDER_UPDATE, "work", 0]]))),
            ]
            before1 = stats(n1)["cluster"]["bus"]["rejected"]
            before2 = stats(n2)["cluster"]["bus"]["rejected"]
            for topic, payload in attacks:
                await forger.publish(topic, payload)
            await wait_rejected(n2, before2 + len(attacks))
            await wait_rejected(n1, before1 + 5)             # the five on the control topic

            assert await asyncio.gather(*(caller.call("work", i, timeout=5)
                                          for i in range(50, 100))) == list(range(50, 100))
            assert runs == Counter(range(100))               # each once; "pwned" never
            reasons = stats(n2)["cluster"]["bus_rejected"]
            assert reasons["replay"] == len(captured)
            assert reasons["unknown_key"] == 1 and reasons["bad_seal"] == 4
            assert reasons["unsealed"] == 3
            view = stats(n1)["cluster"]
            assert set(view["members"]) == {"n2"} and view["members"]["n2"] == \
                {"state": "ready", "url": n2.url}
            assert "fake" not in json.dumps(view["cache"])
            assert not n1.events("node_rejoined") and not n1.events("node_left")
    finally:
        await spy.aclose()
        await forger.aclose()


async def test_keys_rotate_without_downtime(make_cluster):
    """n1 already seals with the new key k2, n2 still with k1; both accept both."""
    k2 = new_key()
    both = {"k1": KEY, "k2": k2}
    c = make_cluster(nodes=2, node_env=[sealed("sign", both, "k2"), sealed("sign", both, "k1")])
    n1, n2 = c.nodes
    async with rpcbus.connect(n2.url) as prov, rpcbus.connect(n1.url) as caller:
        await prov.provide("work", lambda d: d)
        assert await asyncio.gather(*(caller.call("work", i, timeout=5)
                                      for i in range(20))) == list(range(20))
    assert stats(n1)["cluster"]["bus"]["rejected"] == 0
    assert stats(n2)["cluster"]["bus"]["rejected"] == 0


async def started_and_routing(url, text):
    """Two nodes on the Redis behind ``url``; one call crosses them. Returns the cluster."""
    cluster = LocalCluster(nodes=2, redis_url=url, env=FAST).start()
    n1, n2 = cluster.nodes
    try:
        async with rpcbus.connect(n2.url) as prov, rpcbus.connect(n1.url) as caller:
            await prov.provide("work", lambda d: d)
            assert await caller.call("work", text, timeout=5) == text
    except BaseException:
        cluster.stop()
        raise
    return cluster


async def test_redis_acl_credentials_pass_through_from_the_url():
    """Redis with ACL users only (no default user): nodes given user:password in the URL
    join and route; a node with a wrong password stays out, saying why."""
    redis = RedisServer(args=["--user", "default", "off", "--user", "rpcbus", "on",
                              ">s3cret", "~*", "&rpcbus:*", "+@all"]).start()
    url = f"redis://rpcbus:s3cret@127.0.0.1:{redis.port}/0"
    cluster = None
    try:
        cluster = await started_and_routing(url, "via ACL user")
        bad = NodeProcess("--port", "0", "--redis", url.replace("s3cret", "guess"),
                          env=FAST).start()
        try:
            down = await asyncio.to_thread(bad.wait_event, "bus_down", 10.0)
            assert "WRONGPASS" in down["reason"] or "invalid" in down["reason"], down
            assert "guess" not in json.dumps(list(bad.lines))          # no password in logs
        finally:
            bad.stop()
    finally:
        if cluster is not None:
            cluster.stop()
        redis.stop()


async def test_nodes_find_the_master_through_sentinel(tmp_path):
    """redis+sentinel://: the nodes ask a Sentinel for the master and route through it;
    when the master dies, the Sentinel promotes the replica and the nodes follow."""
    master = RedisServer().start()
    # its own folder: a replica writes the master's snapshot where it runs
    replica = RedisServer(args=["--replicaof", "127.0.0.1", str(master.port),
                                "--dir", str(tmp_path)]).start()
    sentinel = RedisSentinel(master.port, directory=str(tmp_path)).start()
    url = f"redis+sentinel://127.0.0.1:{sentinel.port}/rpcbus"
    cluster = None
    try:
        cluster = await started_and_routing(url, "via sentinel")
        n1, n2 = cluster.nodes
        status = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "rpcbus.broker", "status", "--redis", url,
                             "--json", "--listen", "1.0"], capture_output=True, text=True,
            timeout=30)
        assert set(json.loads(status.stdout)) == {"n1", "n2"}, status.stderr

        master.kill()                                   # failover: the replica takes over
        await asyncio.to_thread(n1.wait_event, "cluster_unavailable", 10.0)
        async with rpcbus.connect(n2.url) as prov, rpcbus.connect(n1.url) as caller:
            await prov.provide("work", lambda d: d)
            async with asyncio.timeout(wait(30)):             # detection 0.5 s, promotion, backoff
                while True:
                    try:
                        if await caller.call("work", "after", timeout=2) == "after":
                            break
                    except (rpcbus.ClusterUnavailableError, rpcbus.NoProviderError,
                            rpcbus.ResponseTimeoutError):
                        await asyncio.sleep(0.2)
        assert n1.events("bus_up")[-1]["url"].startswith("redis+sentinel://")
    finally:
        if cluster is not None:
            cluster.stop()
        sentinel.stop()
        replica.stop()
        master.stop()
