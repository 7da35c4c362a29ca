"""RPC semantics on one node, through a real node process and real WebSocket clients.

The node runs with ack_timeout 0.3 s and response_timeout 2 s (conftest.FAST).
"""

import asyncio
import json
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter

import pytest

import rpcbus
from rpcbus import protocol as p

from ..quiet import no_gc_pauses
from .conftest import stats
from .raw import RawPeer


async def test_provide_and_call_with_sync_async_and_context_handlers(node):
    def add(data):
        return data["a"] + data["b"]

    async def slow_upper(data):
        await asyncio.sleep(0.01)
        return data.upper()

    def whoami(data, ctx):
        return {"rpc": ctx.rpc, "caller": ctx.caller, "left": ctx.time_left, "id": ctx.call_id}

    async with rpcbus.connect(node.url, name="prov") as prov, \
            rpcbus.connect(node.url, name="alice") as caller:
        await prov.provide("math.add", add)
        await prov.provide("text.upper", slow_upper)
        await prov.provide("who", whoami)
        assert await caller.call("math.add", {"a": 1, "b": 2}, timeout=5.0) == 3
        assert await caller.call("text.upper", "abc") == "ABC"
        ctx = await caller.call("who", None, timeout=3.0)
        assert ctx["rpc"] == "who" and ctx["caller"].startswith("alice@")
        assert 2.0 < ctx["left"] <= 3.0 and isinstance(ctx["id"], int)
        assert caller.session["node"] == node.name


async def test_unknown_rpc_is_no_provider_and_errors_carry_stable_codes(node):
    async with rpcbus.connect(node.url) as c:
        with pytest.raises(rpcbus.NoProviderError) as err:
            await c.call("nobody.home", 1)
        assert err.value.code == "NO_PROVIDER"
        with pytest.raises(rpcbus.InvalidMessageError):
            await c.call("bad name", 1)


async def test_handler_exception_answers_provider_error_with_the_message_only(node):
    def broken(data):
        raise KeyError("missing field 'x'")

    async def broken_later(data):
        await asyncio.sleep(0)
        raise RuntimeError("database down")

    async with rpcbus.connect(node.url) as prov, rpcbus.connect(node.url) as c:
        await prov.provide("broken", broken)
        await prov.provide("broken.later", broken_later)
        with pytest.raises(rpcbus.ProviderError) as err:
            await c.call("broken")
        assert err.value.message == "\"missing field 'x'\"" and "Traceback" not in str(err.value)
        with pytest.raises(rpcbus.ProviderError, match="database down"):
            await c.call("broken.later")


async def test_values_msgpack_cannot_carry_fail_that_call_only(node):
    async with rpcbus.connect(node.url) as prov, rpcbus.connect(node.url) as c:
        await prov.provide("odd", lambda d: object() if d == "object" else d)
        results = await asyncio.gather(c.call("odd", "object"), c.call("odd", "fine"),
                                       return_exceptions=True)
        assert isinstance(results[0], rpcbus.ProviderError)
        assert "not serializable" in results[0].message and results[1] == "fine"
        with pytest.raises(TypeError, match="not serializable"):
            await c.call("odd", {1, 2})
        assert await c.call("odd", "still fine") == "still fine"


async def test_unreachable_node_is_connection_lost():
    with pytest.raises(rpcbus.ConnectionLostError, match="cannot connect"):
        await rpcbus.connect("ws://127.0.0.1:9", open_timeout=2)


async def test_reject_hands_the_call_to_another_provider(node):
    seen = Counter()

    def refuse(data):
        seen["refuse"] += 1
        raise rpcbus.Reject()

    def serve(data):
        seen["serve"] += 1
        return data * 2

    async with rpcbus.connect(node.url) as a, rpcbus.connect(node.url) as b, \
            rpcbus.connect(node.url) as c:
        await a.provide("double", refuse)
        await b.provide("double", serve)
        results = await asyncio.gather(*(c.call("double", i) for i in range(60)))
        assert results == [i * 2 for i in range(60)]
        assert seen["serve"] == 60
        assert seen["refuse"] > 0  # uniform first choice: all 60 avoiding it has chance 2**-60
        with pytest.raises(rpcbus.NoProviderError):
            await b.unprovide("double")
            await c.call("double", 1)


async def test_ack_timeout_moves_the_call_and_the_silent_providers_late_answer_is_dropped(node):
    silent = await RawPeer.open(node.url)
    await silent.provide("work")
    async with rpcbus.connect(node.url) as good, rpcbus.connect(node.url) as c:
        call = asyncio.create_task(c.call("work", 21, timeout=5))
        req = await silent.expect(p.REQUEST)         # the only provider so far: it gets it
        await good.provide("work", lambda d: d * 2)
        cancel = await silent.expect(p.CANCEL)        # after ack_timeout (0.3 s)
        assert cancel[1] == req[1]
        assert await call == 42                       # served by the good provider
        late_before = stats(node)["router"]["late"]
        await silent.send([p.RESPONSE, req[1], "too late"])
        await silent.send([p.PING, 1])
        await silent.expect(p.PONG)                   # the node has read the late answer
        assert stats(node)["router"]["late"] == late_before + 1
    await silent.close()


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
            async with asyncio.timeout(10):                  # until it serves a new call
                i = 1000
                while i not in recorded():
                    i += 1
                    await caller.call("stall.echo", i, timeout=5)
        assert not set(recorded()) & set(stalled), "ran again by the provider that woke"
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()


async def test_response_timeout_fails_the_call_and_cancels_the_handler(node):
    cancelled = asyncio.Event()

    async def forever(data):
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async with rpcbus.connect(node.url) as prov, rpcbus.connect(node.url) as c:
        await prov.provide("forever", forever)
        t0 = time.monotonic()
        with pytest.raises(rpcbus.ResponseTimeoutError):
            await c.call("forever", None, timeout=0.5)
        elapsed = time.monotonic() - t0
        assert 0.5 <= elapsed < 1.5, elapsed       # the node's deadline, not the client's guard
        async with asyncio.timeout(5):
            await cancelled.wait()                  # CANCEL reached the provider's task


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


async def test_provider_lost_after_accepting_fails_the_call_with_provider_gone(node):
    doomed = await RawPeer.open(node.url)
    await doomed.provide("work")
    async with rpcbus.connect(node.url) as c:
        call = asyncio.create_task(c.call("work", 1, timeout=30))
        req = await doomed.expect(p.REQUEST)
        await doomed.send([p.ACCEPT, req[1]])
        await doomed.send([p.PING, 1])
        await doomed.expect(p.PONG)
        doomed.abort()
        with pytest.raises(rpcbus.ProviderGoneError):
            async with asyncio.timeout(10):            # not the 30 s response timeout
                await call


async def test_caller_gone_its_answer_is_discarded_quietly(node):
    release = asyncio.Event()
    started = asyncio.Event()

    async def wait_then_answer(data):
        started.set()
        await release.wait()
        return "answer for nobody"

    async with rpcbus.connect(node.url) as prov:
        await prov.provide("later", wait_then_answer)
        caller = await RawPeer.open(node.url)
        await caller.send([p.REQUEST, 1, "later", None, 5000])
        await started.wait()
        before = stats(node)["router"]["discarded"]
        caller.abort()
        await asyncio.to_thread(node.wait_event, "session_closed", session=caller.session)
        release.set()
        async with rpcbus.connect(node.url) as c:   # the node still serves
            await prov.provide("ping", lambda d: "pong")
            assert await c.call("ping") == "pong"
        assert stats(node)["router"]["discarded"] == before + 1


async def test_thousands_of_concurrent_calls_all_answered_correctly(node):
    before = stats(node)["router"]
    async with rpcbus.connect(node.url) as p1, rpcbus.connect(node.url) as p2, \
            rpcbus.connect(node.url) as p3, rpcbus.connect(node.url) as c1, \
            rpcbus.connect(node.url) as c2:
        async def square_later(x):
            await asyncio.sleep(0)
            return x * x

        await p1.provide("sq", lambda x: x * x)
        await p2.provide("sq", square_later)
        await p3.provide("sq", lambda x: x * x)
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
                async with asyncio.timeout(10):
                    await call
        with pytest.raises(rpcbus.ConnectionLostError):
            await c.call("hold", 1)


def test_healthz_answers_on_the_websocket_port(node):
    http = node.url.replace("ws://", "http://")
    with urllib.request.urlopen(f"{http}/healthz", timeout=5) as r:
        assert r.status == 200 and r.read() == b"ok\n"
