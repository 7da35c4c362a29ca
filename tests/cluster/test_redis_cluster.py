"""The bus on a Redis Cluster (real cluster-mode redis-servers): sharded pub/sub spreads
the nodes' topics over the shards, calls cross between them, on a sealed bus through an
ACL user allowed only what a node needs."""

import asyncio

import pytest

import rpcbus
from rpcbus.broker.local import LocalCluster, RedisCluster
from rpcbus.cluster.shards import ClusterUnavailable, open_links

from ..timing import wait
from .conftest import FAST, stats
from .test_sealed_bus import sealed


@pytest.fixture
def sharded():
    # the least an rpcbus node needs of a Redis Cluster (docs/operations.md)
    redis = RedisCluster(shards=3, user=(
        "bus", "s3cret",
        "resetchannels &rpcbus:* +cluster|slots +spublish +ssubscribe +sunsubscribe +ping")
    ).start()
    nodes = None
    try:
        nodes = LocalCluster(nodes=3, redis_url=redis.url, env={**FAST, **sealed("sign")})
        yield redis, nodes.start()
    finally:
        codes = nodes.stop() if nodes is not None else {}
        redis.stop()
    assert all(code == 0 for code in codes.values()), codes


async def test_calls_cross_between_nodes_whose_topics_live_on_different_shards(sharded):
    redis, nodes = sharded
    topics = ["rpcbus:ctrl"] + [f"rpcbus:node:{n.name}" for n in nodes.nodes]
    where = {}
    for server in redis.servers:  # who is subscribed where: each topic on its owner only
        counts = redis.command(server, "PUBSUB", "SHARDNUMSUB", *topics)
        for topic, n in zip(counts[::2], counts[1::2], strict=True):
            if n:
                assert topic.decode() not in where, f"{topic} subscribed on two shards"
                where[topic.decode()] = (server.port, n)
    assert {t: port for t, (port, _) in where.items()} == {
        t: redis.master_of(t).port for t in topics}
    assert where["rpcbus:ctrl"][1] == 3 and all(where[t][1] == 1 for t in topics[1:])
    assert len({where[t][0] for t in topics[1:]}) >= 2, where   # the nodes' on 2+ shards
    spublished_before = {s.port: _spublishes(redis, s) for s in redis.servers}

    urls = [n.url for n in nodes.nodes]
    async with rpcbus.connect(urls[0]) as p1, rpcbus.connect(urls[2]) as p3, \
            rpcbus.connect(urls[1]) as c2, rpcbus.connect(urls[0]) as c1:
        await p1.provide("where", lambda d: ["n1", d])
        await p3.provide("other", lambda d: ["n3", d])
        got = await asyncio.gather(*(c2.call("where", i, timeout=5) for i in range(300)),
                                   *(c1.call("other", i, timeout=5) for i in range(300)))
    assert got == [["n1", i] for i in range(300)] + [["n3", i] for i in range(300)]
    assert stats(nodes.nodes[1])["cluster"]["bus"]["rejected"] == 0   # all sealed right
    spublished = {s.port: _spublishes(redis, s) - spublished_before[s.port]
                  for s in redis.servers}
    # the calls' INVOKEs, ACKs and answers went to n1's, n2's, n3's and n1's shards
    assert sum(1 for n in spublished.values() if n) >= 2, spublished


def _spublishes(redis, server):
    """SPUBLISH commands ``server`` has served."""
    return redis.command(server, "INFO", "commandstats").get("cmdstat_spublish", {}).get(
        "calls", 0)


async def test_a_tls_redis_cluster_carries_the_bus(tmp_path):
    """``rediss+cluster://``: every shard connection verified against the given CA."""
    from ..integration.test_security import self_signed

    cert, key = self_signed(tmp_path)
    redis = RedisCluster(shards=3, tls=(str(cert), str(key))).start()
    nodes = None
    try:
        assert redis.url.startswith("rediss+cluster://")
        nodes = LocalCluster(nodes=2, redis_url=redis.url,
                             env={**FAST, "RPCBUS_CLUSTER_REDIS_TLS_CA": str(cert)}).start()
        async with rpcbus.connect(nodes.nodes[0].url) as p1, \
                rpcbus.connect(nodes.nodes[1].url) as c2:
            await p1.provide("where", lambda d: ["n1", d])
            got = await asyncio.gather(*(c2.call("where", i, timeout=5) for i in range(100)))
        assert got == [["n1", i] for i in range(100)]
        # without the CA the shards' certificate is refused: the bus would not come up
        with pytest.raises(ClusterUnavailable, match="CERTIFICATE_VERIFY_FAILED"):
            await open_links(redis.url, ["rpcbus:ctrl"], lambda channel, data: None)
    finally:
        codes = nodes.stop() if nodes is not None else {}
        redis.stop()
    assert all(code == 0 for code in codes.values()), codes


async def test_events_cross_shards_and_topics_are_left_without_ending_the_bus(sharded):
    """Event channels are sharded channels too: a node subscribes (SSUBSCRIBE) to those of
    its clients' topics wherever their slots live, and leaves them (SUNSUBSCRIBE) when
    the last subscriber goes, while its bus session goes on."""
    _, nodes = sharded
    n1, n2, _ = nodes.nodes
    topics = [f"t{i}" for i in range(12)]   # their channels hash over the three shards
    got = asyncio.Queue()
    async with rpcbus.connect(n2.url) as pub, rpcbus.connect(n1.url) as sub:
        for topic in topics:
            await sub.subscribe(topic, got.put_nowait)
        for topic in topics:
            await pub.emit(topic, topic)
        async with asyncio.timeout(wait(10)):
            assert sorted([await got.get() for _ in topics]) == sorted(topics)
        for topic in topics:
            await sub.unsubscribe(topic)
    figures = stats(n1)
    assert figures["events"]["channels"] == 0
    assert figures["cluster"]["bus"]["reconnects"] == 0   # no SUNSUBSCRIBE taken as a move
