"""The bus's lean Redis connection (cluster/resp.py) against a real redis-server: rounds
of pipelined PUBLISHes answered in order, pushes parsed however the bytes are split, and
an error reply or a refused login ending the connection with the reason."""

from __future__ import annotations

import asyncio

import pytest

from rpcbus.broker.local import RedisServer
from rpcbus.cluster import resp

from ..timing import wait


@pytest.fixture(scope="module")
def redis():
    server = RedisServer().start()
    yield server
    server.stop()


async def test_rounds_are_answered_in_order_and_pushes_arrive_whole(redis):
    got: list[tuple[bytes, bytes]] = []
    sub = await resp.connect(redis.url, on_message=lambda ch, data: got.append((ch, data)))
    pub = await resp.connect(redis.url)
    try:
        await sub.request(b"SUBSCRIBE", b"t:a", b"t:b", replies=2)
        head_a, head_b = resp.publish_head("t:a"), resp.publish_head("t:b")
        answered: list[tuple[int, object]] = []
        big = bytes(range(256)) * 400  # 100 kB: read in several chunks
        for n in range(20):
            payloads = [resp.publish(head_a, b"%d" % n), resp.publish(head_b, big + b"%d" % n)]
            pub.send(b"".join(payloads), 2, lambda err, n=n: answered.append((n, err)))
        async with asyncio.timeout(wait(5)):
            while len(got) < 40:
                await asyncio.sleep(0.01)
        assert answered == [(n, None) for n in range(20)]
        assert [d for ch, d in got if ch == b"t:a"] == [b"%d" % n for n in range(20)]
        assert [d for ch, d in got if ch == b"t:b"] == [big + b"%d" % n for n in range(20)]
    finally:
        sub.abort(ConnectionError("done"))
        pub.abort(ConnectionError("done"))


async def test_an_error_reply_ends_the_connection_and_fails_what_waits(redis):
    conn = await resp.connect(redis.url)
    outcomes: list[object] = []
    conn.send(resp.encode(b"NOSUCHCOMMAND"), 1, outcomes.append)
    conn.send(resp.encode(b"PING"), 1, outcomes.append)
    reason = await asyncio.wait_for(conn.closed, wait(5))
    assert isinstance(reason, resp.RedisReplyError) and "NOSUCHCOMMAND" in str(reason).upper()
    assert outcomes == [reason, reason]
    late: list[object] = []
    conn.send(resp.encode(b"PING"), 1, late.append)  # after the close: told at once
    assert late == [reason]


async def test_a_refused_login_fails_connect(tmp_path):
    server = RedisServer(args=["--requirepass", "right"]).start()
    try:
        with pytest.raises(resp.RedisReplyError):
            await resp.connect(server.url.replace("redis://", "redis://:wrong@"))
        conn = await resp.connect(server.url.replace("redis://", "redis://:right@"))
        await conn.request(b"PING")
        conn.abort(ConnectionError("done"))
    finally:
        server.stop()


async def test_a_redis_cluster_slot_moving_away_ends_the_subscription_and_the_publish():
    """Sharded pub/sub (cluster/shards.py): a topic's pushes arrive from its slot's master;
    when a reshard moves the slot, Redis unsubscribes the channel (``SlotMoved``) and a
    SPUBLISH to the old master is answered MOVED: both end the connection, with the reason."""
    from rpcbus.broker.local import RedisCluster
    from rpcbus.cluster.shards import open_links

    cluster = await asyncio.to_thread(RedisCluster(shards=3).start)
    got: list[tuple[bytes, bytes]] = []
    links = await open_links(cluster.url, ["t:moving"], lambda ch, d: got.append((ch, d)))
    try:
        pub, head = links.route("t:moving")
        assert head.startswith(b"*3\r\n$8\r\nSPUBLISH")
        await pub.request(b"SPUBLISH", b"t:moving", b"before")
        async with asyncio.timeout(wait(5)):
            while not got:
                await asyncio.sleep(0.01)
        assert got == [(b"t:moving", b"before")]
        owner = cluster.master_of("t:moving")
        await asyncio.to_thread(cluster.move_slot, "t:moving",
                                next(s for s in cluster.servers if s is not owner))
        reason = await asyncio.wait_for(links.listener("t:moving").closed, wait(5))
        assert isinstance(reason, resp.SlotMoved) and "t:moving" in str(reason)
        with pytest.raises(resp.RedisReplyError, match="MOVED"):
            await pub.request(b"SPUBLISH", b"t:moving", b"after")
    finally:
        links.close()
        await asyncio.to_thread(cluster.stop)
