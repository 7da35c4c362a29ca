"""Node and Redis failures under load: one outcome per call, fast failure, recovery.

Heartbeats every 0.25 s, dead after 3 misses (conftest.FAST).
"""

import asyncio
import signal
import time

import rpcbus
from rpcbus.errors import CODES

from ..timing import wait


async def steady_load(caller, rpc, stop, concurrency=100, timeout=3.0):
    """Calls ``rpc`` until ``stop`` is set; returns [(started, ended, result or error code)]."""
    ledger = []

    async def worker(w):
        i = 0
        while not stop.is_set():
            i += 1
            t0 = time.monotonic()
            try:
                result = await caller.call(rpc, [w, i], timeout=timeout)
            except rpcbus.RpcError as exc:
                result = exc.code
            ledger.append((t0, time.monotonic(), result, [w, i]))

    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    return ledger


def check_ledger(ledger, timeout, grace=1.0):
    """Every call ended once, with its own answer or a documented code, by its deadline + grace."""
    for started, ended, result, data in ledger:
        assert result == data or result in CODES, result
        assert ended - started <= timeout + grace, (ended - started, result)


async def test_sigkill_of_a_node_under_load(make_cluster):
    c = make_cluster(nodes=3)
    n1, n2, n3 = c.nodes
    async with rpcbus.connect(n1.url) as p1, rpcbus.connect(n2.url) as p2, \
            rpcbus.connect(n3.url) as caller:
        await p1.provide("echo", lambda d: d)
        await p2.provide("echo", lambda d: d)
        stop = asyncio.Event()
        load = asyncio.create_task(steady_load(caller, "echo", stop))
        await asyncio.sleep(0.5)
        killed_at = time.monotonic()
        n1.kill()
        await asyncio.sleep(3.0)                      # the load runs on through the fault
        stop.set()
        ledger = await load
    check_ledger(ledger, timeout=3.0)
    # Within 3 heartbeats (0.75 s) plus a margin, every call succeeds again.
    after = [r for s, e, r, d in ledger if s > killed_at + 1.5]
    assert after and all(r != "PROVIDER_GONE" and not isinstance(r, str) for r in after), \
        sorted({r for r in after if isinstance(r, str)})
    assert any(isinstance(r, list) for s, e, r, d in ledger if s < killed_at)


async def test_sigterm_drains_and_loses_no_call(make_cluster):
    c = make_cluster(nodes=2)
    n1, n2 = c.nodes
    started = asyncio.Event()

    async def slow(d):
        started.set()
        await asyncio.sleep(0.3)
        return d

    async with rpcbus.connect(n1.url) as p1, rpcbus.connect(n2.url) as p2, \
            rpcbus.connect(n2.url) as caller:
        await p1.provide("slow", slow)
        calls = [asyncio.create_task(caller.call("slow", i, timeout=10)) for i in range(50)]
        await started.wait()
        n1.signal(signal.SIGTERM)
        await asyncio.to_thread(n2.wait_event, "node_terminating", 10.0)
        await p2.provide("slow", slow)                 # new calls now go to n2
        more = [asyncio.create_task(caller.call("slow", 100 + i, timeout=10)) for i in range(20)]
        assert await asyncio.gather(*calls) == list(range(50))
        assert await asyncio.gather(*more) == [100 + i for i in range(20)]
        assert await asyncio.to_thread(n1.wait_exit, 20) == 0


async def test_redis_down_local_calls_work_cross_node_calls_fail_fast(make_cluster):
    c = make_cluster(nodes=2)
    n1, n2 = c.nodes
    async with rpcbus.connect(n1.url) as local_prov, rpcbus.connect(n2.url) as remote_prov, \
            rpcbus.connect(n1.url) as caller:
        await local_prov.provide("here", lambda d: d)
        await remote_prov.provide("there", lambda d: d)
        assert await caller.call("there", 1, timeout=5) == 1
        c.redis.kill()
        await asyncio.to_thread(n1.wait_event, "cluster_unavailable", 10.0)
        for i in range(20):
            assert await caller.call("here", i, timeout=5) == i       # local: never fails
            t0 = time.monotonic()
            try:
                await caller.call("there", i, timeout=5)
                raise AssertionError("a cross-node call succeeded with Redis down")
            except rpcbus.ClusterUnavailableError:
                assert time.monotonic() - t0 < 0.5                     # fast, not the timeout
        c.redis.start()                                                 # same port
        async with asyncio.timeout(wait(15)):                           # backoff: 5 s at most
            while True:
                try:
                    if await caller.call("there", 7, timeout=5) == 7:
                        break
                except rpcbus.RpcError:
                    await asyncio.sleep(0.1)
        assert await caller.call("here", 8, timeout=5) == 8
