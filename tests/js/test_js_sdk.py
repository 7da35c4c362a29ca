"""The JavaScript SDK against real nodes, with Python on the other side of each call:
one node and across two, errors, deadlines and AbortSignal reaching the provider,
reconnecting and handing over, auth and permissions."""

import asyncio
import signal
import time

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

import rpcbus
from rpcbus.broker.auth import hash_password, token_digest
from rpcbus.broker.local import LocalCluster
from rpcbus.broker.process import NodeProcess

from ..cluster.conftest import FAST, stats
from ..timing import wait


@pytest.fixture(scope="module")
def two():
    c = LocalCluster(nodes=2, env=FAST).start()
    yield c
    codes = c.stop()
    assert all(code == 0 for code in codes.values()), codes


@pytest.mark.parametrize("across", [False, True], ids=["one-node", "two-nodes"])
async def test_js_and_python_call_each_other_with_the_same_outcomes(two, js, across):
    py_url, js_url = two.nodes[0].url, two.nodes[1 if across else 0].url
    suffix = "x" if across else "1"
    agent = await js()
    joined = await agent.ok("connect", urls=[js_url], options={"name": "web"})
    assert joined["url"] == js_url
    async with rpcbus.connect(py_url, name="py") as py:
        await py.provide(f"py.add{suffix}", lambda d: d["a"] + d["b"])

        def fails(d):
            raise ValueError("py handler failed")
        await py.provide(f"py.fail{suffix}", fails)

        async def says_no(d):
            raise rpcbus.AppError("OUT_OF_STOCK", "none left", {"sku": d, "left": [0, 1.5]})
        await py.provide(f"py.no{suffix}", says_no)
        for kind in ("echo", "throw", "reject", "apperror"):
            await agent.ok("provide", name=f"js.{kind}{suffix}", kind=kind)
        if across:  # the other node hears of the names with the providers' next news
            await wait_routable(py, f"js.echo{suffix}")

        # JS calls Python
        assert await agent.ok("call", name=f"py.add{suffix}", data={"a": 1, "b": 2}) == 3
        many = await asyncio.gather(*(agent.ok("call", name=f"py.add{suffix}",
                                               data={"a": i, "b": 1}) for i in range(50)))
        assert many == [i + 1 for i in range(50)]
        err = await agent.error("call", name=f"py.fail{suffix}", timeout=3000)
        assert (err["code"], err["name"]) == ("PROVIDER_ERROR", "ProviderError")
        assert err["message"] == "ValueError: py handler failed"
        err = await agent.error("call", name=f"py.no{suffix}", data="a-1", timeout=3000)
        assert (err["code"], err["name"], err["message"]) == ("OUT_OF_STOCK", "AppError",
                                                              "none left")
        assert err["data"] == {"sku": "a-1", "left": [0, 1.5]}
        err = await agent.error("call", name=f"nobody.{suffix}", timeout=3000)
        assert (err["code"], err["name"]) == ("NO_PROVIDER", "NoProviderError")

        # Python calls JS
        got = await py.call(f"js.echo{suffix}", {"x": [1, "two", None, 2.5]}, timeout=3,
                            traceparent="00-" + "1" * 32 + "-" + "2" * 16 + "-01")
        assert got["data"] == {"x": [1, "two", None, 2.5]}
        assert got["rpc"] == f"js.echo{suffix}" and got["caller"].startswith("py@")
        assert 0 < got["timeLeft"] <= 3000 and got["traceparent"].startswith("00-111")
        with pytest.raises(rpcbus.ProviderError, match="^PROVIDER_ERROR: Error: js handler "
                                                       "failed$"):
            await py.call(f"js.throw{suffix}", timeout=3)
        with pytest.raises(rpcbus.AppError) as app:
            await py.call(f"js.apperror{suffix}", "b-2", timeout=3)
        assert (app.value.code, app.value.message, app.value.data) == (
            "OUT_OF_STOCK", "none left", {"sku": "b-2", "left": 0})
        with pytest.raises(rpcbus.NoProviderError):   # the only provider handed it on
            await py.call(f"js.reject{suffix}", timeout=3)
        results = await asyncio.gather(*(py.call(f"js.echo{suffix}", i, timeout=5)
                                         for i in range(200)))
        assert [r["data"] for r in results] == list(range(200))
    assert await agent.ok("close") == "closed"


async def wait_routable(client, name, timeout=5.0):
    """Until a call to ``name`` from ``client`` finds a provider."""
    async with asyncio.timeout(timeout):
        while True:
            try:
                return await client.call(name, None, timeout=2)
            except rpcbus.NoProviderError:
                await asyncio.sleep(0.05)


async def test_deadlines_and_abort_signals_reach_the_provider_across_nodes(two, js):
    agent = await js()
    await agent.ok("connect", urls=[two.nodes[1].url])
    cancelled = asyncio.Queue()

    async def hang(d):
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.put_nowait(d)
            raise

    async with rpcbus.connect(two.nodes[0].url) as py:
        await py.provide("py.hang", hang)
        await agent.ok("provide", name="js.hang", kind="hang")
        err = await agent.error("call", name="py.hang", data="timed", timeout=300)
        assert err["code"] == "RESPONSE_TIMEOUT"
        async with asyncio.timeout(wait(5)):
            assert await cancelled.get() == "timed"          # the provider's handler stopped
        err = await agent.error("call", name="py.hang", data="aborted", timeout=5000,
                                abortAfter=200)
        assert err["name"] == "AbortError"                   # the signal's reason
        async with asyncio.timeout(wait(5)):
            assert await cancelled.get() == "aborted"
        # a deadline over the node's longest (rpc.max_timeout, 300 s) is refused, not cut
        err = await agent.error("call", name="py.hang", data="long", timeout=400_000)
        assert err["name"] == "RangeError" and "rpc.max_timeout" in err["message"], err
        with pytest.raises(ValueError, match=r"timeout=1000 s is over the node's longest, 300"):
            await py.call("py.hang", "long", timeout=1000)
        # and the other way: a Python caller's deadline aborts the JS handler's ctx.signal
        async with asyncio.timeout(wait(5)):
            while True:
                try:
                    await py.call("js.hang", None, timeout=0.3)
                except rpcbus.NoProviderError:
                    await asyncio.sleep(0.05)                # not heard of on n1 yet
                    continue
                except rpcbus.ResponseTimeoutError:
                    break
        await agent.event(lambda e: e.get("event") == "aborted" and e["rpc"] == "js.hang")


async def test_clients_with_one_url_wait_out_a_draining_node_without_a_loop(js):
    """Each SDK with one URL whose node drains leaves it once and backs off (issue 42 saw
    12 sessions in a second): the draining node answers new handshakes 503."""
    node = NodeProcess(env={**FAST, "RPCBUS_SERVER_DRAIN_TIMEOUT": "4"}).start()
    try:
        agent = await js()
        await agent.ok("connect", urls=[node.url])
        async with rpcbus.connect(node.url) as keeper, rpcbus.connect(node.url) as one:
            running = asyncio.Event()

            async def slow(d):
                running.set()
                await asyncio.sleep(2.5)   # keeps the node draining
                return d
            await keeper.provide("slow", slow)
            call = asyncio.ensure_future(keeper.call("slow", 1, timeout=10))
            async with asyncio.timeout(wait(5)):
                await running.wait()
            node.signal(signal.SIGTERM)
            await agent.event(lambda e: e.get("state") == "reconnecting")
            await asyncio.sleep(wait(1.5))                     # a loop would show by now
            closed = node.events("session_closed")
            assert len(closed) <= 3, closed                    # js, one, keeper: once each
            assert one.state != "connected"
            assert await call == 1                             # what was under way finished
        assert node.wait_exit() == 0
    finally:
        node.kill()


async def test_the_client_moves_to_the_next_url_when_its_node_dies_or_drains(js):
    c = LocalCluster(nodes=3, env=FAST).start()
    try:
        n1, n2, n3 = c.nodes
        agent = await js()
        await agent.ok("connect", urls=[n1.url, n2.url, n3.url], options={"name": "web"})
        await agent.ok("provide", name="js.echo", kind="echo")
        async with rpcbus.connect(n3.url) as py:
            await py.provide("py.add", lambda d: d["a"] + d["b"])
            assert (await wait_routable(py, "js.echo"))["data"] is None
            n1.kill()                                         # SIGKILL: no goodbye
            await agent.event(lambda e: e.get("state") == "reconnecting")
            moved = await agent.event(lambda e: e.get("state") == "connected"
                                      and e["url"] == n2.url)
            assert moved
            # provided again on n2: a Python caller on n3 reaches it; and it calls on
            assert (await wait_routable(py, "js.echo"))["rpc"] == "js.echo"
            assert await agent.ok("call", name="py.add", data={"a": 2, "b": 3}) == 5

            # n2 drains (SIGTERM): the client hands over to n3 at once, calls go on
            calls = [asyncio.ensure_future(agent.send("call", name="py.add",
                                                      data={"a": i, "b": 0}, timeout=20000))
                     for i in range(100)]
            n2.signal(signal.SIGTERM)
            await agent.event(lambda e: e.get("state") == "connected" and e["url"] == n3.url)
            answers = await asyncio.gather(*calls)
            assert [a.get("ok") for a in answers] == list(range(100)), answers
            assert n2.wait_exit() == 0
            assert (await py.call("js.echo", 7, timeout=5))["data"] == 7
    finally:
        c.stop()


CONFIG = """
[auth]
mode = "users"

[auth.token_keys]
ops = "{token_key}"

[auth.users.worker]
password = "{worker_hash}"
provide = ["billing.*"]
call = ["billing.*"]

[auth.users.frontend]
token_sha256 = "{frontend_digest}"
call = ["billing.*"]
"""


async def test_password_and_token_logins_and_permissions(js, tmp_path):
    signer = ed25519.Ed25519PrivateKey.generate()
    (tmp_path / "ops.pub").write_bytes(signer.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    conf = tmp_path / "node.toml"
    conf.write_text(CONFIG.format(worker_hash=hash_password("w0rker", n=1 << 12),
                                  frontend_digest=token_digest("front-token"),
                                  token_key=tmp_path / "ops.pub"))
    node = NodeProcess("--config", str(conf), env=FAST).start()
    try:
        worker, front, wrong, bearer = await js(), await js(), await js(), await js()
        jwt_token = jwt.encode({"sub": "dashboard", "call": ["billing.*"], "iss": "rpcbus",
                                "aud": "rpcbus", "exp": time.time() + 600}, signer,
                               algorithm="EdDSA")
        assert (await bearer.ok("connect", urls=[node.url], options={"token": jwt_token})
                )["user"] == "dashboard"
        assert (await worker.ok("connect", urls=[node.url],
                                options={"user": "worker", "password": "w0rker"}))["user"] \
            == "worker"
        assert (await front.ok("connect", urls=[node.url], options={"token": "front-token"})
                )["user"] == "frontend"
        err = await wrong.error("connect", urls=[node.url],
                                options={"user": "worker", "password": "nope"})
        assert (err["code"], err["name"]) == ("NOT_AUTHENTICATED", "NotAuthenticatedError")

        await worker.ok("provide", name="billing.echo", kind="echo")
        err = await worker.error("provide", name="users.delete", kind="echo")
        assert err["code"] == "PERMISSION_DENIED" and "users.delete" in err["message"]
        got = await front.ok("call", name="billing.echo", data=1)
        assert got["user"] == "frontend"                     # set by the node, not claimed
        err = await front.error("call", name="admin.reset")
        assert err["code"] == "PERMISSION_DENIED"
        assert (await bearer.ok("call", name="billing.echo", data=2))["user"] == "dashboard"
        err = await bearer.error("provide", name="billing.mine", kind="echo")
        assert err["code"] == "PERMISSION_DENIED"

        # a token function: the JWT is renewed before it expires, on the same connection
        def short(exp):
            return jwt.encode({"sub": "relay", "call": ["billing.*"], "iss": "rpcbus",
                               "aud": "rpcbus", "iat": int(time.time()), "exp": exp},
                              signer, algorithm="EdDSA")
        relay = await js()
        await relay.ok("connect", urls=[node.url],
                       tokens=[short(time.time() + 3), short(time.time() + 600)])
        renewed = await asyncio.to_thread(node.wait_event, "session_token_renewed", 20)
        assert renewed["user"] == "relay" and renewed["after_expiry"] is False
        assert (await relay.ok("call", name="billing.echo", data=3))["data"] == 3
    finally:
        assert node.stop() == 0


async def test_wss_with_the_node_certificate_and_not_without(js, tmp_path):
    from ..integration.test_security import self_signed

    cert, key = self_signed(tmp_path)
    with NodeProcess(env={**FAST, "RPCBUS_SERVER_TLS_CERT": str(cert),
                          "RPCBUS_SERVER_TLS_KEY": str(key)}) as node:
        assert node.url.startswith("wss://")
        trusting, default = await js(), await js()
        await trusting.ok("connect", urls=[node.url],
                          options={"wsOptions": {"ca": cert.read_text()}})
        await trusting.ok("provide", name="js.echo", kind="echo")
        assert (await trusting.ok("call", name="js.echo", data="over tls"))["data"] == "over tls"
        err = await default.error("connect", urls=[node.url], options={"reconnect": False})
        assert err["code"] == "CONNECT_FAILED" and "certificate" in err["message"], err
        await trusting.ok("close")


async def test_streams_between_js_and_python_across_nodes(two, js):
    """Parts in order, an AppError after parts, and leaving early (break, abort, the
    deadline) closing the other side's generator, both ways; a JS provider whose Python
    reader stops runs at most a window ahead."""
    agent = await js()
    await agent.ok("connect", urls=[two.nodes[1].url])
    closed = asyncio.Queue()

    async def count(n):
        for i in range(n):
            yield {"i": i}

    async def fails(_):
        yield 1
        yield 2
        raise rpcbus.AppError("RAN_DRY", "no more", {"after": 2})

    async def endless(tag):
        try:
            i = 0
            while True:
                i += 1
                yield i
                await asyncio.sleep(0)
        finally:
            closed.put_nowait(tag)

    async with rpcbus.connect(two.nodes[0].url) as py:
        for name, handler in (("py.count", count), ("py.fails", fails), ("py.endless", endless)):
            await py.provide(name, handler)
        for kind in ("count", "fails", "endless"):
            await agent.ok("provide", name=f"js.{kind}", kind=kind)
        with pytest.raises(rpcbus.ProviderError, match="answers in parts: call it with stream"):
            await wait_routable(py, "js.count")  # a generator called plainly says so
        # JS reads Python's generators
        got = await agent.ok("stream", name="py.count", data=300, window=8, timeout=5000)
        assert got == {"parts": [{"i": i} for i in range(300)], "error": None}
        got = await agent.ok("stream", name="py.fails", timeout=5000)
        assert got["parts"] == [1, 2] and got["error"] == {
            "code": "RAN_DRY", "name": "AppError", "message": "no more", "data": {"after": 2}}
        got = await agent.ok("stream", name="py.endless", data="break", take=5, timeout=5000)
        assert got == {"parts": [1, 2, 3, 4, 5], "error": None}
        got = await agent.ok("stream", name="py.endless", data="abort", abortAfter=200,
                             every=10, timeout=5000)
        assert got["error"]["name"] == "AbortError" and got["parts"][:3] == [1, 2, 3]
        got = await agent.ok("stream", name="py.endless", data="deadline", every=10,
                             timeout=300)
        assert got["error"]["code"] == "RESPONSE_TIMEOUT"
        async with asyncio.timeout(wait(5)):
            assert {await closed.get() for _ in range(3)} == {"break", "abort", "deadline"}
        # Python reads JS's generators
        assert [p["i"] async for p in py.stream("js.count", 300, window=8, timeout=5)] == \
            list(range(300))
        seen = []
        with pytest.raises(rpcbus.AppError) as app:
            async for part in py.stream("js.fails", timeout=5):
                seen.append(part)
        assert seen == [1, 2] and (app.value.code, app.value.data) == ("RAN_DRY", {"after": 2})
        stream = py.stream("js.endless", timeout=30, window=8)
        assert [await stream.__anext__() for _ in range(3)] == [1, 2, 3]
        await asyncio.sleep(wait(0.5))                   # the reader stops for a while
        assert await agent.ok("yielded") <= 3 + 8 + 1
        await stream.aclose()
        e = await agent.event(lambda e: e.get("event") == "closed")
        assert e["rpc"] == "js.endless" and e["aborted"]
    assert await agent.ok("close") == "closed"


async def test_call_all_between_js_and_python_across_nodes(two, js):
    """JS asks every provider (Python on n1: one answers, one fails, one too slow; JS on
    n2) and gets a reply from each, named by provider and node; Python asks and gets
    the JS provider's reply too."""
    agent = await js()
    await agent.ok("connect", urls=[two.nodes[1].url], options={"name": "web"})

    async def fails(_):
        raise rpcbus.AppError("OUT_OF_STOCK", "none left", {"left": 0})

    async def slow(_):
        await asyncio.sleep(30)

    clients = [await rpcbus.connect(two.nodes[0].url, name=n) for n in ("ok", "no", "slow")]
    try:
        await clients[0].provide("stock", lambda d: {"n": d})
        await clients[1].provide("stock", fails)
        await clients[2].provide("stock", slow)
        await agent.ok("provide", name="stock", kind="echo")
        replies = await agent.ok("callAll", name="stock", data=7, timeout=1500)
        by = {r["provider"].split("@")[0]: r for r in replies}
        assert sorted(by) == ["no", "ok", "slow", "web"], replies
        assert by["ok"]["value"] == {"n": 7} and by["ok"]["node"] == two.nodes[0].name
        assert [by[n]["ok"] for n in ("ok", "no", "slow", "web")] == [True, False, False, True]
        assert by["no"]["error"] == {"code": "OUT_OF_STOCK", "name": "AppError",
                                     "message": "none left", "data": {"left": 0}}
        assert by["slow"]["error"]["code"] == "RESPONSE_TIMEOUT"
        assert by["web"]["value"]["data"] == 7 and by["web"]["node"] == two.nodes[1].name
        got = await clients[0].call_all("stock", 8, timeout=1.5)
        assert {r.provider.split("@")[0] for r in got} == {"ok", "no", "slow", "web"}
        # discovery from JS: the name on both nodes, its four providers by node
        [stock] = [r for r in await agent.ok("rpcs") if r["rpc"] == "stock"]
        assert stock["nodes"] == {two.nodes[0].name: 3, two.nodes[1].name: 1}
        found = {(r["provider"].split("@")[0], r["node"])
                 for r in await agent.ok("providers", name="stock")}
        assert found == {("ok", two.nodes[0].name), ("no", two.nodes[0].name),
                         ("slow", two.nodes[0].name), ("web", two.nodes[1].name)}
    finally:
        await asyncio.gather(*(c.close() for c in clients))
    assert await agent.ok("close") == "closed"


async def test_js_and_python_clients_share_events_across_nodes(two, js):
    """subscribe / emit / unsubscribe of the JS SDK beside the Python SDK's, on two nodes:
    each publisher's events reach every subscriber, in order, once. A node that falls
    behind sheds events by design (broker/events.py): each one shed is told to its
    subscriber in a GAP, so an event either arrives or is counted, never lost silently."""
    n1, n2 = two.nodes
    js_sub, js_pub = await js(), await js()
    await js_sub.ok("connect", urls=[n2.url])
    await js_pub.ok("connect", urls=[n1.url])
    got: list[list] = []
    py_gaps: list[int] = []
    async with rpcbus.connect(n1.url) as py:
        await js_sub.ok("subscribe", topic="feed")
        await py.subscribe("feed", got.append, on_gap=lambda topic, n: py_gaps.append(n))
        for i in range(200):
            await js_pub.ok("emit", topic="feed", data=["js", i])
            await py.emit("feed", ["py", i])
        emitted = lambda: [e["data"] for e in js_sub.events if e["event"] == "emitted"]  # noqa: E731
        js_gaps = lambda: [e["count"] for e in js_sub.events if e["event"] == "gap"]  # noqa: E731
        await js_sub.event(lambda e: len(emitted()) + sum(js_gaps()) >= 400)
        async with asyncio.timeout(wait(10)):
            while len(got) + sum(py_gaps) < 400:
                await asyncio.sleep(0.01)
        for seen, gaps in ((emitted(), js_gaps()), (got, py_gaps)):
            assert len(seen) + sum(gaps) == 400, (len(seen), gaps)
            for who in ("js", "py"):
                numbers = [i for w, i in seen if w == who]
                assert numbers == sorted(set(numbers)) and set(numbers) <= set(range(200))
        told = sum(js_gaps()) + sum(py_gaps)
        counted = sum(stats(n)["events"].get(kind, 0) for n in (n1, n2)
                      for kind in ("shed", "lost"))
        assert told <= counted, f"{told} events told lost, {counted} counted by the nodes"
        await js_sub.ok("unsubscribe", topic="feed")
        await py.emit("feed", ["py", "after"])
        async with asyncio.timeout(wait(10)):
            while not got or got[-1] != ["py", "after"]:
                await asyncio.sleep(0.01)
        assert stats(n2)["events"]["topics"] == 0   # n2 sends js_sub nothing more
    assert ["py", "after"] not in emitted()


async def test_js_presence_across_nodes_beside_python(two, js):
    """presence / watchPresence / unwatchPresence of the JS SDK: logins and logouts of
    Python and JS clients on either node."""
    n1, n2 = two.nodes
    watcher = await js()
    await watcher.ok("connect", urls=[n1.url], options={"name": "jwatch"})
    await watcher.ok("watchPresence", users=["pyjo"])
    async with rpcbus.connect(n2.url, name="pyjo"):
        event = await watcher.event(lambda e: e["event"] == "presence")
        assert (event["user"], event["online"]) == ("pyjo", True)
        assert await watcher.ok("presence", users=["pyjo", "nobody"]) == {"pyjo": True,
                                                                           "nobody": False}
        assert {"pyjo", "jwatch"} <= set(await watcher.ok("presence"))
    await watcher.event(lambda e: e["event"] == "presence" and e["online"] is False)
    await watcher.ok("unwatchPresence")
    assert [(e["user"], e["online"]) for e in watcher.events if e["event"] == "presence"] == [
        ("pyjo", True), ("pyjo", False)]


async def test_js_calls_held_on_their_way_to_the_node_start_no_handler_late(two, js):
    """The JS SDK stamps its frames of calls (SENT): held 1.5 s by a proxy on the way to
    the node, its calls of 1 s end RESPONSE_TIMEOUT there, unrun; no handler starts
    after its caller stopped waiting (tests/integration/test_handlers.py: Python's)."""
    from ..faults.proxy import Proxy

    node = two.nodes[0]
    started: list[float] = []

    async def job(data):
        started.append(time.monotonic() - data["deadline"])
        return data["i"]

    proxy = Proxy(int(node.url.rsplit(":", 1)[1])).start()
    try:
        async with rpcbus.connect(node.url) as provider:
            await provider.provide("js.held.job", job)
            agent = await js()
            await agent.ok("connect", urls=[f"ws://127.0.0.1:{proxy.port}"])
            for i in range(20):                       # the connection's usual delay, learnt
                assert await agent.ok("call", name="js.held.job",
                                      data={"i": i, "deadline": 1e12}) == i
            before = stats(node)["router"]["response_timeouts"]
            started.clear()
            proxy.delay(wait(1.5))
            errs = await asyncio.gather(*(agent.error(
                "call", name="js.held.job", data={"i": i, "deadline": time.monotonic() + 1.0},
                timeout=1000) for i in range(20)))
            assert {e["code"] for e in errs} == {"RESPONSE_TIMEOUT"}, errs
            async with asyncio.timeout(wait(10)):       # the held frames reach the node
                while stats(node)["router"]["response_timeouts"] + len(started) < before + 20:
                    await asyncio.sleep(0.05)
            assert started == [], f"{len(started)} started, up to {max(started):.2f} s late"
            proxy.delay(0)
            assert await agent.ok("call", name="js.held.job", data={"i": 7, "deadline": 1e12}) == 7
            await agent.ok("close")
    finally:
        proxy.stop()
