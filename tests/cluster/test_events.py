"""Events across the cluster (docs/events.md), with real node processes on a real Redis and
the Python SDK: fan-out to every node, order per publisher, topics kept apart, a slow
subscriber's gap notice, subscriptions that outlive a node's restart."""

import asyncio
import itertools

import rpcbus
from rpcbus import protocol as p

from ..integration.raw import RawPeer
from ..timing import wait
from .conftest import stats

WAIT = 10.0  # s for what a healthy cluster does in well under one


class Inbox:
    """An event handler that keeps what it got and can be awaited for a count."""

    def __init__(self):
        self.got = []
        self.gaps = []
        self._more = asyncio.Event()

    def __call__(self, data):
        self.got.append(data)
        self._more.set()

    def gap(self, topic, count):
        self.gaps.append((topic, count))
        self._more.set()

    async def until(self, done, timeout=WAIT):
        async with asyncio.timeout(timeout):
            while not done(self):
                self._more.clear()
                await self._more.wait()


async def test_every_subscriber_on_every_node_gets_each_publishers_events_in_order(cluster3):
    urls = [n.url for n in cluster3.nodes]
    count = 3000
    async with rpcbus.connect(urls[0]) as p1, rpcbus.connect(urls[1]) as p2, \
            rpcbus.connect(urls[0]) as s1, rpcbus.connect(urls[1]) as s2, \
            rpcbus.connect(urls[2]) as s3, rpcbus.connect(urls[2]) as other:
        inboxes = [Inbox() for _ in range(4)]
        await s1.subscribe("chat.room1", inboxes[0])
        await s2.subscribe("chat.room1", inboxes[1])
        await s3.subscribe("chat.room1", inboxes[2])
        await s3.subscribe("chat.room1", inboxes[3])   # a second handler, same client
        elsewhere = Inbox()
        await other.subscribe("chat.room2", elsewhere)
        for i in range(count):        # two publishers on two nodes, interleaved
            await p1.emit("chat.room1", ["p1", i])
            await p2.emit("chat.room1", ["p2", i])
            if i % 500 == 0:
                await asyncio.sleep(0)
        await other.emit("chat.room2", "apart")
        for inbox in inboxes:
            await inbox.until(lambda b: len(b.got) >= 2 * count)
        await elsewhere.until(lambda b: b.got)
        for inbox in inboxes:
            assert len(inbox.got) == 2 * count, len(inbox.got)      # nothing twice
            for who in ("p1", "p2"):
                assert [i for w, i in inbox.got if w == who] == list(range(count))
            assert not inbox.gaps
        assert elsewhere.got == ["apart"]   # a topic's events only to its subscribers
    # each emit crossed the bus once per emitting node, not once per subscriber
    figures = [stats(n)["events"] for n in cluster3.nodes]
    assert figures[0]["emitted"] >= count and figures[1]["emitted"] >= count


async def test_an_unsubscribed_topic_stops_and_a_subscription_outlives_a_node_restart(
        make_cluster):
    c = make_cluster(nodes=2)
    n1, n2 = c.nodes
    async with rpcbus.connect(n2.url) as pub, rpcbus.connect(n1.url) as sub:
        inbox = Inbox()
        await sub.subscribe("news", inbox, on_gap=inbox.gap)
        await pub.emit("news", 1)
        await inbox.until(lambda b: b.got == [1])
        await sub.unsubscribe("news")
        assert stats(n1)["events"]["channels"] == 0   # n1 no longer hears the channel
        await sub.subscribe("news", inbox, on_gap=inbox.gap)
        await pub.emit("news", 3)
        await inbox.until(lambda b: len(b.got) == 2)
        assert inbox.got == [1, 3]

        await asyncio.to_thread(c.restart, 0)         # the subscriber's node, SIGKILLed
        await inbox.until(lambda b: b.gaps)           # it is told events may be lost
        assert inbox.gaps == [("news", None)]
        # once the client is back on the new n1, it hears the topic again, unasked: the
        # events emitted before that are lost (it was told), none comes twice
        async with asyncio.timeout(WAIT):
            for i in itertools.count(100):
                await pub.emit("news", i)
                try:
                    await inbox.until(lambda b, i=i: b.got[-1] == i, timeout=0.2)
                    break
                except TimeoutError:
                    continue
        assert inbox.got[:2] == [1, 3] and inbox.got[2:] == sorted(set(inbox.got[2:]))


async def test_a_subscriber_that_reads_too_slowly_loses_events_it_is_told_of_and_nobody_waits(
        make_cluster):
    """A subscriber that stops reading: past limits.max_event_buffer_bytes buffered for it,
    its events are dropped, and once it reads again a GAP says how many; everything else
    (another subscriber, the publisher) goes on at full pace."""
    c = make_cluster(nodes=2, RPCBUS_LIMITS_MAX_EVENT_BUFFER_BYTES="262144")
    n1, n2 = c.nodes
    count, blob = 30000, "x" * 1000
    slow = await RawPeer.open(n2.url)
    try:
        await slow.send([p.SUBSCRIBE, 1, ["feed"]])
        assert await slow.expect(p.OK) == [p.OK, 1]
        async with rpcbus.connect(n1.url) as pub, rpcbus.connect(n2.url) as sub:
            healthy = Inbox()
            await sub.subscribe("feed", healthy, on_gap=healthy.gap)
            for i in range(count):   # slow reads nothing meanwhile
                await pub.emit("feed", [i, blob])
                if i % 100 == 99:    # at the pace the healthy one reads (on this loop)
                    await healthy.until(lambda b, i=i: len(b.got) > i, timeout=60)
            assert [i for i, _ in healthy.got] == list(range(count)) and not healthy.gaps
        got, lost = [], 0
        async with asyncio.timeout(wait(60)):
            while len(got) + lost < count:
                msg = await slow.recv(timeout=30)
                if msg[0] == p.EVENT:
                    got.append(msg[2][0])
                elif msg[0] == p.GAP:
                    assert msg[1] == "feed" and msg[2] > 0, msg
                    lost += msg[2]
        assert lost > 0 and got == sorted(got) and len(got) + lost == count
        assert stats(n2)["events"]["lost"] == lost   # counted where it happened
    finally:
        await slow.close()


async def test_a_node_cut_off_from_redis_tells_its_subscribers_and_hears_again_after(
        make_cluster):
    c = make_cluster(nodes=2)
    n1, n2 = c.nodes
    async with rpcbus.connect(n1.url) as local_pub, rpcbus.connect(n2.url) as far_pub, \
            rpcbus.connect(n1.url) as sub:
        inbox = Inbox()
        await sub.subscribe("ops", inbox, on_gap=inbox.gap)
        await far_pub.emit("ops", "far 1")
        await inbox.until(lambda b: b.got == ["far 1"])
        c.redis.kill()
        await inbox.until(lambda b: b.gaps)
        assert inbox.gaps == [("ops", None)]     # on_gap per topic; count unknown
        await local_pub.emit("ops", "near")      # on its own node events still flow
        await inbox.until(lambda b: "near" in b.got)
        c.redis.start()                           # same port: the bus reconnects (backoff)
        async with asyncio.timeout(wait(15)):           # and listens on the channel again
            for i in itertools.count():
                await far_pub.emit("ops", f"far {i + 2}")
                try:
                    await inbox.until(lambda b, i=i: b.got[-1] == f"far {i + 2}", timeout=0.2)
                    break
                except TimeoutError:
                    continue
    assert stats(n1)["io"]["events_cut_off_notices"] == 1
