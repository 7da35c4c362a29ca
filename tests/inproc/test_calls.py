"""RPC semantics on one node: an in-process node (sessions, router, WebSocket server on
this test's loop) and real WebSocket clients. The node runs with ack_timeout 0.3 s and
response_timeout 2 s (tests/inproc/conftest.FAST). What needs a node process of its own
(a stalled worker, signals, HTTP from this thread, load) is in tests/integration/test_rpc.py.
"""

import asyncio
import contextvars
import logging
import time
from collections import Counter

import pytest

import rpcbus
from rpcbus import protocol as p

from ..hang import Hang
from ..integration.raw import RawPeer
from ..timing import wait
from .conftest import stats


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


async def test_async_handlers_answering_at_once_or_after_suspending_keep_their_own_context(
        node):
    """A coroutine handler's first step runs as its REQUEST is read, the rest in a Task
    only if it suspends: either way each call runs in a context of its own, and what it
    raises in its first step is answered as from a Task."""
    seen = contextvars.ContextVar("seen", default=None)

    async def mark(data):
        before = seen.get()
        seen.set(data)                     # a call's own: never seen by the next call
        if data % 2:
            await asyncio.sleep(0)         # suspends: the rest runs in a Task
            assert seen.get() == data
        if data == 4:
            raise rpcbus.AppError("E_FOUR", "four", {"n": 4})
        return before

    async with rpcbus.connect(node.url) as prov, rpcbus.connect(node.url) as caller:
        await prov.provide("mark", mark)
        got = await asyncio.gather(*(caller.call("mark", i) for i in range(40)),
                                   return_exceptions=True)
        assert [g for i, g in enumerate(got) if i != 4] == [None] * 39
        assert isinstance(got[4], rpcbus.AppError) and got[4].data == {"n": 4}
        assert seen.get() is None


async def test_unknown_rpc_is_no_provider_and_errors_carry_stable_codes(node):
    async with rpcbus.connect(node.url) as c:
        with pytest.raises(rpcbus.NoProviderError) as err:
            await c.call("nobody.home", 1)
        assert err.value.code == "NO_PROVIDER"
        with pytest.raises(rpcbus.InvalidMessageError):
            await c.call("bad name", 1)


async def test_app_errors_arrive_whole_and_other_exceptions_name_their_type(node, caplog):
    """AppError keeps its code, message and data (async and sync callers, async and
    thread handlers, an RpcError from a nested call re-raised); any other exception is
    PROVIDER_ERROR "Type: text", its traceback logged with the rpc and the call id."""
    def lookup(data):
        return {"a": 1}[data]

    async def out_of_stock(data):
        raise rpcbus.AppError("OUT_OF_STOCK", "none left", {"sku": data, "left": [0, None]})

    def in_thread(data):
        raise rpcbus.AppError("LOCKED", data=b"\x00raw")

    async with rpcbus.connect(node.url) as prov, rpcbus.connect(node.url) as c:
        async def nested(data):
            return await c.call("nobody.here", data)  # NO_PROVIDER here: the outer call ran

        await prov.provide("lookup", lookup)
        await prov.provide("stock", out_of_stock)
        await prov.provide("thread", in_thread)
        await prov.provide("nested", nested)
        with caplog.at_level(logging.ERROR, logger="rpcbus"):
            with pytest.raises(rpcbus.ProviderError) as err:
                await c.call("lookup", "b")
        assert err.value.message == "KeyError: 'b'"
        failed = [r for r in caplog.records if r.getMessage().startswith("handler_failed")]
        assert len(failed) == 1 and "rpc=lookup call_id=" in failed[0].getMessage()
        assert failed[0].exc_info and failed[0].exc_info[0] is KeyError
        with pytest.raises(rpcbus.AppError) as app:
            await c.call("stock", "sku-9")
        assert (app.value.code, app.value.message, app.value.data) == (
            "OUT_OF_STOCK", "none left", {"sku": "sku-9", "left": [0, None]})
        assert str(app.value) == "OUT_OF_STOCK: none left"
        assert isinstance(app.value, rpcbus.RpcError)
        with pytest.raises(rpcbus.AppError) as app:
            await c.call("thread", None)
        assert (app.value.code, app.value.message, app.value.data) == ("LOCKED", "", b"\x00raw")
        with pytest.raises(rpcbus.ProviderError, match="NoProviderError: NO_PROVIDER"):
            await c.call("nested", 1)
        sync = await asyncio.to_thread(rpcbus.connect_sync, node.url)
        try:
            with pytest.raises(rpcbus.AppError) as app:
                await asyncio.to_thread(sync.call, "stock", "s")
            assert app.value.data == {"sku": "s", "left": [0, None]}
        finally:
            await asyncio.to_thread(sync.close)
    for taken in ("NO_PROVIDER", "APP_ERROR", "", "x" * 129):
        with pytest.raises(ValueError):
            rpcbus.AppError(taken)


async def test_a_provider_cannot_pass_off_its_error_as_one_of_rpcbus(node):
    """Application codes live beside the wire code APP_ERROR: a provider answering
    "NO_PROVIDER" itself is a PROVIDER_ERROR (not "did not run"), an application code
    that reads NO_PROVIDER is an AppError, and a malformed one is refused (the provider
    is told, the caller's call times out)."""
    raw = await RawPeer.open(node.url)
    await raw.provide("liar")
    answers = {"plain": ["NO_PROVIDER", "nobody, honest"],
               "app": ["APP_ERROR", "said no", ["NO_PROVIDER", [1, 2]]],
               "bad": ["APP_ERROR", "said no", ["", 1]]}
    results = {}
    async with rpcbus.connect(node.url) as c:
        for case, answer in answers.items():
            call = asyncio.ensure_future(c.call("liar", case, timeout=0.8))
            req = await raw.expect(p.REQUEST)
            await raw.send([p.ACCEPT, req[1]], [p.ERROR, req[1], *answer])
            results[case] = (await asyncio.gather(call, return_exceptions=True))[0]
    await raw.ws.close()
    assert type(results["plain"]) is rpcbus.ProviderError
    app = results["app"]
    assert type(app) is rpcbus.AppError and app.code == "NO_PROVIDER" and app.data == [1, 2]
    assert type(results["bad"]) is rpcbus.ResponseTimeoutError
    refused = await raw.expect(p.ERROR)
    assert refused[2] == "INVALID_MESSAGE" and "app_code" in refused[3]


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


async def test_errors_are_caught_the_usual_way():
    """A node nobody can reach is CONNECT_FAILED (a ConnectionError, its URL said once), a
    URL of another scheme a ValueError, a call that times out a TimeoutError."""
    with pytest.raises(ConnectionError) as failed:
        await rpcbus.connect("ws://127.0.0.1:9", open_timeout=2)
    assert failed.value.code == "CONNECT_FAILED"
    assert str(failed.value).count("ws://127.0.0.1:9") == 1
    for bad in ("http://127.0.0.1:9", "127.0.0.1:9"):
        with pytest.raises(ValueError, match="WebSocket URL"):
            await rpcbus.connect(bad)
    assert issubclass(rpcbus.ResponseTimeoutError, TimeoutError)
    assert issubclass(rpcbus.ConnectionLostError, ConnectionError)


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
        async with asyncio.timeout(wait(5)):
            await cancelled.wait()                  # CANCEL reached the provider's task


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
            async with asyncio.timeout(wait(10)):            # not the 30 s response timeout
                await call


async def test_a_cancelled_call_cancels_the_providers_handler(node):
    """task.cancel(), asyncio.timeout or wait_for on a call reach the provider: its
    handler is cancelled (not left running until the call's own deadline)."""
    slow = Hang()
    started, cancelled = slow.started, slow.cancelled

    async with rpcbus.connect(node.url) as prov, rpcbus.connect(node.url) as caller:
        await prov.provide("slow", slow)
        for how in ("cancel", "timeout"):
            started.clear(), cancelled.clear()
            if how == "cancel":
                call = asyncio.create_task(caller.call("slow", 1, timeout=30))
                await started.wait()
                call.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await call
            else:
                with pytest.raises(TimeoutError):
                    async with asyncio.timeout(wait(0.2)):
                        await caller.call("slow", 2, timeout=30)
            async with asyncio.timeout(wait(5)):
                await cancelled.wait()                     # the handler, not just the caller
        assert stats(node)["router"]["cancelled"] == 2 and stats(node)["pending"] == 0


async def test_closing_a_client_cancels_its_calls_at_their_providers(node):
    """Nobody waits for the answers of a closed client's calls: their handlers stop."""
    slow = Hang()
    async with rpcbus.connect(node.url) as prov:
        await prov.provide("slow", slow)
        caller = await rpcbus.connect(node.url)
        call = asyncio.create_task(caller.call("slow", 1, timeout=30))
        async with asyncio.timeout(wait(5)):
            await slow.started.wait()
        await caller.close()
        with pytest.raises(rpcbus.ConnectionLostError):
            await call
        async with asyncio.timeout(wait(5)):
            await slow.cancelled.wait()


async def test_drain_finishes_the_calls_in_flight_and_sends_new_ones_elsewhere(node):
    """close() with calls in flight gives their callers PROVIDER_GONE; drain() lets them
    finish, while calls made meanwhile go to the other provider."""
    release = asyncio.Event()
    started = 0

    async def held(data):
        nonlocal started
        started += 1
        await release.wait()
        return ["draining", data]

    leaving = await rpcbus.connect(node.url)
    async with rpcbus.connect(node.url) as staying, rpcbus.connect(node.url) as caller:
        await leaving.provide("svc", held)
        first = [asyncio.create_task(caller.call("svc", i, timeout=10)) for i in range(3)]
        async with asyncio.timeout(wait(5)):
            while started < 3:
                await asyncio.sleep(0.01)
        await staying.provide("svc", lambda d: ["staying", d])
        drain = asyncio.create_task(leaving.drain(timeout=10))
        async with asyncio.timeout(wait(5)):                 # until its name is withdrawn
            while stats(node)["providers"].get("svc") != 1:
                await asyncio.sleep(0.01)
        later = [await caller.call("svc", i, timeout=5) for i in range(10, 15)]
        assert later == [["staying", i] for i in range(10, 15)]   # nothing new for it
        assert not drain.done()                        # still waiting for its 3 calls
        release.set()
        assert await asyncio.gather(*first) == [["draining", i] for i in range(3)]
        await drain
        assert leaving.state == "closed"


async def test_the_clients_state_logs_name_its_node(node, caplog):
    """client_connected and client_closed (what a reconnect loop prints) say which node."""
    caplog.set_level(logging.INFO, logger="rpcbus.client")
    async with rpcbus.connect(node.url, name="logged"):
        pass
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("client_")]
    assert said == [f"client_connected url={node.url}", f"client_closed url={node.url}"]
