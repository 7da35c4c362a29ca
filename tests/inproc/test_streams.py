"""Streams across two nodes (in process, over a real redis-server): parts in order, the
end, an error after parts, flow control, cancel and deadline reaching the generator."""

import asyncio
import threading

import pytest

import rpcbus

from ..timing import wait
from .conftest import stats


class Counting:
    """An endless async generator handler that counts what it yielded and notes when
    it was closed."""

    def __init__(self):
        self.yielded = 0
        self.closed = asyncio.Event()
        self.moved = asyncio.Event()

    async def __call__(self, data):
        try:
            while True:
                self.yielded += 1
                self.moved.set()
                yield self.yielded
                await asyncio.sleep(0)
        finally:
            self.closed.set()


async def clients(cluster2):
    provider = await rpcbus.connect(cluster2.nodes[1].url, name="prov")
    caller = await rpcbus.connect(cluster2.nodes[0].url, name="caller")
    return provider, caller


async def test_parts_arrive_in_order_and_the_stream_ends(cluster2):
    async def count(n):
        for i in range(n):
            yield {"i": i}
    provider, caller = await clients(cluster2)
    try:
        await provider.provide("count", count)
        got = [part["i"] async for part in caller.stream("count", 500, timeout=10, window=16)]
        assert got == list(range(500))
        # the error a handler raises after some parts comes after those parts
        async def fails(n):
            yield 1
            yield 2
            raise rpcbus.AppError("RAN_DRY", "no more", {"after": 2})
        await provider.provide("fails", fails)
        seen = []
        with pytest.raises(rpcbus.AppError) as err:
            async for part in caller.stream("fails", None, timeout=5):
                seen.append(part)
        assert seen == [1, 2]
        assert (err.value.code, err.value.message, err.value.data) == (
            "RAN_DRY", "no more", {"after": 2})
        # a plain handler is a stream of one part; a generator called plainly says why
        await provider.provide("plain", lambda d: d * 2)
        assert [p async for p in caller.stream("plain", 21, timeout=5)] == [42]
        with pytest.raises(rpcbus.ProviderError, match="stream"):
            await caller.call("count", 3, timeout=5)
    finally:
        await caller.close()
        await provider.close()
    router = stats(cluster2.nodes[0])["router"]
    assert router["parts"] >= 503 and router["stream_overruns"] == 0


async def test_a_consumer_that_stops_reading_stops_the_provider(cluster2):
    handler = Counting()
    provider, caller = await clients(cluster2)
    try:
        await provider.provide("endless", handler)
        stream = caller.stream("endless", None, timeout=30, window=8)
        first = [await stream.__anext__() for _ in range(3)]
        assert first == [1, 2, 3]
        await asyncio.sleep(wait(0.5))       # the consumer stops reading for a while
        # the provider ran at most a window ahead of what was read (and the one more
        # part its generator made before it waited for credit)
        assert handler.yielded <= 3 + 8 + 1, handler.yielded
        stopped_at = handler.yielded
        await asyncio.sleep(wait(0.3))       # and it stays stopped
        assert handler.yielded == stopped_at
        assert [await stream.__anext__() for _ in range(20)] == list(range(4, 24))
        await stream.aclose()                # the provider's generator is closed
        await asyncio.wait_for(handler.closed.wait(), 5)
        with pytest.raises(StopAsyncIteration):  # closed: as a finished generator
            await stream.__anext__()
    finally:
        await caller.close()
        await provider.close()


async def test_break_cancel_and_deadline_close_the_generator(cluster2):
    provider, caller = await clients(cluster2)
    try:
        handlers = [Counting() for _ in range(3)]
        for i, h in enumerate(handlers):
            await provider.provide(f"endless{i}", h)
        async for part in caller.stream("endless0", None, timeout=30):   # break
            if part == 5:
                break
        await asyncio.wait_for(handlers[0].closed.wait(), 5)

        async def read_forever():
            async for _ in caller.stream("endless1", None, timeout=30, window=2):
                await asyncio.sleep(0.01)
        task = asyncio.create_task(read_forever())                      # cancel
        await asyncio.wait_for(handlers[1].moved.wait(), 5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.wait_for(handlers[1].closed.wait(), 5)

        with pytest.raises(rpcbus.ResponseTimeoutError):                   # deadline
            async for _ in caller.stream("endless2", None, timeout=0.5, window=2):
                await asyncio.sleep(0.05)
        await asyncio.wait_for(handlers[2].closed.wait(), 5)
    finally:
        await caller.close()
        await provider.close()


async def test_a_provider_lost_mid_stream_ends_it_provider_gone_after_its_parts(cluster2):
    provider, caller = await clients(cluster2)
    handler = Counting()
    try:
        await provider.provide("endless", handler)
        got = []
        with pytest.raises(rpcbus.ProviderGoneError):
            async for part in caller.stream("endless", None, timeout=10, window=4):
                got.append(part)
                if part == 10:
                    provider._wire.transport.abort()   # its process died: the socket closes
        assert got == list(range(1, len(got) + 1)) and len(got) >= 10
    finally:
        await caller.close()
        await provider.close()


def sync_side(provider_url, caller_url):
    """Blocking clients: a plain generator serves (in a worker thread); the caller reads
    one stream whole and breaks out of another, which closes that generator."""
    closed = threading.Event()

    def squares(n):
        try:
            for i in range(n):
                yield i * i
        finally:
            if n == 1000:
                closed.set()
    with rpcbus.connect_sync(provider_url) as p, rpcbus.connect_sync(caller_url) as c:
        p.provide("squares", squares)
        whole = list(c.stream("squares", 50, timeout=10, window=4))
        for part in c.stream("squares", 1000, timeout=10, window=4):
            if part >= 100:
                break
        return whole, closed.wait(5)


async def test_the_sync_client_reads_streams_and_generators_serve_them(cluster2):
    whole, closed = await asyncio.to_thread(sync_side, cluster2.nodes[1].url, cluster2.nodes[0].url)
    assert whole == [i * i for i in range(50)]
    assert closed, "breaking out did not close the generator"
