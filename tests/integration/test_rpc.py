"""RPC semantics that need the node in a process of its own (a stalled worker process,
HTTP asked from this thread, real load on two processes); the rest of the RPC semantics
run against an in-process node in tests/inproc/test_calls.py.

The node runs with ack_timeout 0.3 s and response_timeout 2 s (conftest.FAST).
"""

import asyncio
import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter

import pytest

import rpcbus
from rpcbus import protocol as p

from ..quiet import no_gc_pauses
from ..timing import wait
from .conftest import stats
from .raw import RawPeer


async def test_a_stalled_provider_refuses_the_requests_the_node_moved_on_meanwhile(
        node, tmp_path):
    """A provider process stopped for longer than the ack timeout (0.3 s here): its calls
    move to another provider; when it wakes it reads them, too late, and REJECTs them
    instead of running them a second time."""
    record = tmp_path / "runs"
    proc = subprocess.Popen([sys.executable, "-m", "rpcbus.benchmarks.workers", "provider",
                             "--url", node.url, "--rpc", "stall.echo", "--record", str(record)],
                            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    here = Counter()

    def backup(d):
        here[d] += 1
        return d

    def recorded():
        return Counter(json.loads(x) for x in record.read_text().split()) \
            if record.exists() else Counter()

    try:
        assert json.loads(proc.stdout.readline()) == {"ready": True}
        async with rpcbus.connect(node.url) as prov, rpcbus.connect(node.url) as caller:
            await prov.provide("stall.echo", backup)
            assert await asyncio.gather(*(caller.call("stall.echo", i, timeout=5)
                                          for i in range(20))) == list(range(20))
            assert recorded()                                # it served some: it is warm
            proc.send_signal(signal.SIGSTOP)
            stalled = list(range(100, 140))
            assert await asyncio.gather(*(caller.call("stall.echo", i, timeout=5)
                                          for i in stalled)) == stalled
            assert sum(here[i] for i in stalled) == len(stalled)   # all moved to backup
            proc.send_signal(signal.SIGCONT)
            async with asyncio.timeout(wait(10)):                  # until it serves a new call
                i = 1000
                while i not in recorded():
                    i += 1
                    await caller.call("stall.echo", i, timeout=5)
        assert not set(recorded()) & set(stalled), "ran again by the provider that woke"
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()


async def test_provider_lost_before_accepting_the_call_moves_at_once(start_node):
    node = start_node(RPCBUS_RPC_ACK_TIMEOUT="30")   # so only the disconnect can move it
    doomed = await RawPeer.open(node.url)
    await doomed.provide("work")
    async with rpcbus.connect(node.url) as good, rpcbus.connect(node.url) as c:
        call = asyncio.create_task(c.call("work", 1, timeout=20))
        await doomed.expect(p.REQUEST)
        await good.provide("work", lambda d: d + 1)
        t0 = time.monotonic()
        doomed.abort()
        assert await call == 2
        assert time.monotonic() - t0 < 10             # far below the 30 s ack timeout


async def test_caller_gone_its_call_is_cancelled_at_the_provider(node):
    started = asyncio.Event()
    cancelled = asyncio.Event()

    async def wait_forever(data):
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async with rpcbus.connect(node.url) as prov:
        await prov.provide("later", wait_forever)
        caller = await RawPeer.open(node.url)
        await caller.send([p.REQUEST, 1, "later", None, 5000])
        await started.wait()
        before = stats(node)["router"]
        caller.abort()
        async with asyncio.timeout(wait(5)):  # the node cancels it once the caller is gone
            await cancelled.wait()
        async with rpcbus.connect(node.url) as c:   # the node still serves
            await prov.provide("ping", lambda d: "pong")
            assert await c.call("ping") == "pong"
        after = stats(node)["router"]
        assert after["cancelled"] == before["cancelled"] + 1
        assert after["discarded"] == before["discarded"]


async def test_thousands_of_concurrent_calls_all_answered_correctly(node):
    before = stats(node)["router"]
    async with rpcbus.connect(node.url) as p1, rpcbus.connect(node.url) as p2, \
            rpcbus.connect(node.url) as p3, rpcbus.connect(node.url) as c1, \
            rpcbus.connect(node.url) as c2:
        async def square_later(x):
            await asyncio.sleep(0)
            return x * x

        async def square(x):  # (plain functions would run in threads: tests/integration/
            return x * x      # test_handlers.py; here the node's routing is under test)

        await p1.provide("sq", square)
        await p2.provide("sq", square_later)
        await p3.provide("sq", square)
        with no_gc_pauses():  # this process is the providers: no full GC stall inside
            calls = [c.call("sq", i, timeout=30) for i in range(4000) for c in (c1, c2)]
            results = await asyncio.gather(*calls)
        assert results == [i * i for i in range(4000) for _ in (c1, c2)]
    s = stats(node)
    assert s["pending"] == 0                # every finished call left the call table
    for key in ("response_timeouts", "ack_timeouts", "late", "foreign", "discarded"):
        assert s["router"][key] == before[key], key


async def test_connection_lost_fails_pending_calls_at_once(start_node):
    node = start_node()
    async with rpcbus.connect(node.url) as prov:
        async def hold(data):
            await asyncio.Event().wait()

        await prov.provide("hold", hold)
        c = await rpcbus.connect(node.url, reconnect=False)
        calls = [asyncio.create_task(c.call("hold", i, timeout=60)) for i in range(5)]
        await asyncio.sleep(0)
        node.kill()
        for call in calls:
            with pytest.raises(rpcbus.ConnectionLostError):
                async with asyncio.timeout(wait(10)):
                    await call
        with pytest.raises(rpcbus.ConnectionLostError):
            await c.call("hold", 1)


def test_http_on_the_websocket_port_healthz_404_and_the_dashboard(node):
    """HTTP and WebSocket share the port: /healthz answers, a path the node does not serve
    is 404 (not websockets' 426 for a browser), / leads to the dashboard."""
    http = node.url.replace("ws://", "http://")
    with urllib.request.urlopen(f"{http}/healthz", timeout=5) as r:
        assert r.status == 200 and r.read() == b"ok\n"
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(f"{http}/nope", timeout=5)
    assert missing.value.code == 404
    missing.value.close()
    with urllib.request.urlopen(f"{http}/", timeout=5) as r:   # the redirect, followed
        assert r.status == 200 and r.url.endswith("/dashboard") and b"<html" in r.read()
