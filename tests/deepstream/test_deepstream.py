"""deepstream's own client, unchanged, against rpcbus nodes: login, provide and make on
one node and across two, data of every JSON type both ways with the Python SDK, every
deepstream error the client understands, records refused, a provider that rejects or
leaves after accepting, a caller that leaves, hostile frames, a node restarted under
its clients."""

import asyncio
import signal
import time
import urllib.error
import urllib.request

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

import rpcbus
from rpcbus.broker import ds_wire
from rpcbus.broker.auth import hash_password, token_digest
from rpcbus.broker.gate import HOLD_AFTER
from rpcbus.broker.local import LocalCluster
from rpcbus.broker.process import NodeProcess

from ..cluster.conftest import FAST, stats
from ..integration.test_operations import samples
from ..timing import wait

DS = {**FAST, "RPCBUS_DEEPSTREAM_ENABLED": "true", "RPCBUS_DEEPSTREAM_RESPONSE_TIMEOUT": "2.0"}
# reconnect every 0.2 s, not after 4 s, 8 s, ...; calls made meanwhile wait for it. The
# client gives up after maxReconnectAttempts (5 by default: 2 s at this pace, less than a
# node takes from start to ready on a slow machine): 150 tries cover a minute
QUICK = {"reconnectIntervalIncrement": 200, "maxReconnectInterval": 400,
         "maxReconnectAttempts": 150, "offlineBufferTimeout": 10000}

# every kind of JSON value, as the client writes it and Python reads it
VALUES = [None, True, False, 0, -7, 2 ** 53, 1.5, -0.25, 1e300, "", "héllo ✓ \u0000",
          [], {}, [1, [2, [3, None]]], {"a": {"b": [None, {"c": "d"}], "e": 2.5}}]


@pytest.fixture(scope="module")
def two():
    c = LocalCluster(nodes=2, env=DS).start()
    yield c
    codes = c.stop()
    assert all(code == 0 for code in codes.values()), codes


def ds_url(node):
    return node.url + "/deepstream"


async def connected(ds, node, login=None, options=None):
    agent = await ds()
    answer = await agent.ok("connect", url=ds_url(node), login=login or {},
                            options=options or {})
    assert answer["ok"] is True, answer
    return agent


async def wait_routable(client, name, data=None, timeout=5.0):
    """Until a call to ``name`` from the Python ``client`` finds a provider: its answer."""
    async with asyncio.timeout(timeout):
        while True:
            try:
                return await client.call(name, data, timeout=2)
            except rpcbus.NoProviderError:
                await asyncio.sleep(0.05)


@pytest.mark.parametrize("across", [False, True], ids=["one-node", "two-nodes"])
async def test_deepstream_and_python_call_each_other_with_every_json_type(two, ds, across):
    py_node, ds_node = two.nodes[0], two.nodes[1 if across else 0]
    s = "x" if across else "1"
    client = await connected(ds, ds_node)
    other = await connected(ds, two.nodes[0])
    for kind in ("echo", "add", "error"):
        await client.ok("provide", name=f"ds.{kind}{s}", kind=kind)
    async with rpcbus.connect(py_node.url, name="py") as py:
        await py.provide(f"py.echo{s}", lambda d: d)
        await py.provide(f"py.bytes{s}", lambda d: b"\x00\x01")

        def fails(d):
            raise ValueError("py handler failed")
        await py.provide(f"py.fail{s}", fails)

        async def says_no(d):
            raise rpcbus.AppError("OUT_OF_STOCK", "none left", {"sku": d, "left": [0, 1.5]})
        await py.provide(f"py.no{s}", says_no)
        await wait_routable(py, f"ds.echo{s}")

        # deepstream calls Python, and Python deepstream: every JSON type, unchanged
        for value in VALUES:
            assert await client.ok("make", name=f"py.echo{s}", data=value) == value
            assert await py.call(f"ds.echo{s}", value, timeout=3) == value
        many = await asyncio.gather(*(client.ok("make", name=f"py.echo{s}", data=i)
                                      for i in range(100)))
        assert many == list(range(100))
        assert await py.call(f"ds.add{s}", {"a": 2, "b": 3}, timeout=3) == 5
        # and a deepstream client calls another, through the nodes
        assert await other.ok("make", name=f"ds.add{s}", data={"a": 1, "b": 1}) == 2

        # errors: each call's one answer, in the words the client knows
        assert await client.error("make", name=f"py.fail{s}", data=1) == {
            "code": "PROVIDER_ERROR", "message": "ValueError: py handler failed"}
        assert await client.error("make", name=f"py.no{s}", data="a-1") == {
            "code": "OUT_OF_STOCK", "message": "none left",
            "data": {"sku": "a-1", "left": [0, 1.5]}}
        assert await client.error("make", name=f"nobody{s}", data=1) == "NO_RPC_PROVIDER"
        # a deepstream provider's response.error(value): its value, to either kind of caller
        assert await other.error("make", name=f"ds.error{s}", data={"why": [1]}) == {
            "why": [1]}
        assert await other.error("make", name=f"ds.error{s}", data="out of stock") == \
            "out of stock"
        with pytest.raises(rpcbus.AppError) as app:
            await py.call(f"ds.error{s}", "out of stock", timeout=3)
        assert (app.value.code, app.value.message, app.value.data) == (
            "REQUEST_ERROR", "out of stock", "out of stock")
        # what JSON cannot carry fails the call, saying so
        err = await client.error("make", name=f"py.bytes{s}", data=1)
        assert err["code"] == "PROVIDER_ERROR" and "JSON" in err["message"], err
        with pytest.raises(rpcbus.InvalidMessageError, match="JSON"):
            await py.call(f"ds.echo{s}", b"raw", timeout=3)
    ran = await client.ok("ran")
    assert ran[f"ds.echo{s}"] == len(VALUES) + 1 and ran[f"ds.add{s}"] == 2, ran


async def test_every_deepstream_error_and_no_call_runs_twice(two, ds):
    node = two.nodes[0]
    caller = await connected(ds, node)
    provider = await connected(ds, node)
    spare = await connected(ds, node)
    for kind in ("noaccept", "late", "slow", "reject"):
        await provider.ok("provide", name=f"e.{kind}", kind=kind)
    await spare.ok("provide", name="e.reject", kind="echo")   # takes what the other rejects
    await provider.ok("provide", name="e.alone", kind="reject")
    async with rpcbus.connect(node.url) as py:
        await wait_routable(py, "e.reject", 1)
        await wait_routable(py, "e.slow", {"ms": 1, "value": 1})

        # a provider that never accepts: ACCEPT_TIMEOUT after rpc.ack_timeout (0.5 s), and
        # the call is not moved (the client runs a call before it accepts it)
        started = time.monotonic()
        assert await caller.error("make", name="e.noaccept", data=1) == "ACCEPT_TIMEOUT"
        assert 0.4 < time.monotonic() - started < 1.9
        with pytest.raises(rpcbus.AcceptTimeoutError):
            await py.call("e.noaccept", 2, timeout=3)
        async with rpcbus.connect(two.nodes[1].url) as far:  # from another node alike
            with pytest.raises(rpcbus.AcceptTimeoutError, match="may have run"):
                await far.call("e.noaccept", 3, timeout=3)
        # no answer within [deepstream] response_timeout (2 s): RESPONSE_TIMEOUT
        assert await caller.error("make", name="e.slow", data={"ms": 4000, "value": 1}) == \
            "RESPONSE_TIMEOUT"
        assert await caller.ok("make", name="e.slow", data={"ms": 10, "value": 7}) == 7
        # an answer for a call the node gave up: INVALID_RPC_CORRELATION_ID to its provider
        # (whose client reports it as an unknown correlation id)
        assert await caller.error("make", name="e.late", data={"ms": 900}) == "ACCEPT_TIMEOUT"
        await provider.event(lambda e: e["event"] == "error" and e["topic"] == "RPC"
                             and e["kind"] == "UNKNOWN_CORRELATION_ID", timeout=5)
        assert stats(node)["io"]["deepstream_late_answers"] >= 2   # its ACCEPT and its RESPONSE
        # REJECT: the next provider; nobody left: NO_RPC_PROVIDER, as deepstream does
        for i in range(6):
            assert await caller.ok("make", name="e.reject", data=i) == i
        assert await caller.error("make", name="e.alone", data=1) == "NO_RPC_PROVIDER"
        # a name with characters rpcbus's names do not take travels as %XX: served to
        # deepstream's clients under its own name, to ours under the escaped one
        await spare.ok("provide", name="user/get profile", kind="echo")
        await wait_routable(py, "user/get%20profile", 5)
        assert await caller.ok("make", name="user/get profile", data=6) == 6
        assert await py.call("user/get%20profile", 8, timeout=3) == 8
        await py.provide("sure%3F", lambda d: -d)
        assert await caller.ok("make", name="sure?", data=2) == -2
        # records are not served: the client's promise fails at once
        for op in ("snapshot", "has"):
            assert await caller.error(op, name="some/record") == "MESSAGE_DENIED"
        ran = await provider.ok("ran")   # each call ran once, none twice
        assert ran == {"e.noaccept": 3, "e.slow": 3, "e.late": 1}, ran
        assert (await spare.ok("ran"))["e.reject"] == 7
        assert (await spare.ok("ran"))["user/get profile"] == 3   # wait_routable's too
        # counted in the metrics as any call (each node counts its own callers' calls)
        metrics = await asyncio.to_thread(samples, node)
        assert metrics[("rpcbus_calls_total", frozenset(
            {"rpc": "e.reject", "outcome": "ok"}.items()))] == 7
        assert metrics[("rpcbus_calls_total", frozenset(
            {"rpc": "e.noaccept", "outcome": "ACCEPT_TIMEOUT"}.items()))] == 2
        # what it no longer provides is no longer called
        await provider.ok("unprovide", name="e.slow")
        async with asyncio.timeout(wait(5)):
            while (await caller.send("make", name="e.slow", data={"ms": 1, "value": 1})
                   ).get("error") != "NO_RPC_PROVIDER":
                await asyncio.sleep(0.05)


async def test_deepstream_and_python_clients_share_events_across_nodes(two, ds):
    """event.subscribe / emit / unsubscribe of deepstream's client, on two nodes, beside
    the Python SDK's: every JSON type, in order, each event once (the emitting
    deepstream client hands its own to itself: the node does not send them back)."""
    n1, n2 = two.nodes
    far = await connected(ds, n1)
    near = await connected(ds, n2)
    topic = "chat/room 1"                          # as rpcbus sees it: chat/room%201
    await far.ok("subscribe", name=topic)
    await near.ok("subscribe", name=topic)
    got = asyncio.Queue()
    emitted = lambda agent: [e["data"] for e in agent.events if e["event"] == "emitted"]  # noqa: E731
    async with rpcbus.connect(n2.url) as py:
        await py.subscribe("chat/room%201", got.put_nowait)
        # deepstream's client sends its subscriptions in batches and gives no promise:
        # until an event from Python reaches the far one, it may not be subscribed yet
        async with asyncio.timeout(wait(10)):
            while "probe" not in emitted(far) or "probe" not in emitted(near):
                await py.emit("chat/room%201", "probe")
                await asyncio.sleep(0.05)
        while not got.empty():
            got.get_nowait()
        far.events.clear()
        near.events.clear()
        for value in VALUES:
            await near.ok("emit", name=topic, data=value)
        assert [await got.get() for _ in VALUES] == VALUES      # in order, JSON types kept
        await py.emit("chat/room%201", "done")
        await far.event(lambda e: e.get("data") == "done")
        await near.event(lambda e: e.get("data") == "done")
        assert emitted(far) == [*VALUES, "done"]
        assert emitted(near) == [*VALUES, "done"]   # its own once (its client's), not twice
        await far.ok("unsubscribe", name=topic)
        await far.ok("state")   # the UNSUBSCRIBE leaves with the client's next batch
        async with asyncio.timeout(wait(10)):
            while stats(n1)["events"]["topics"]:
                await asyncio.sleep(0.05)
        await py.emit("chat/room%201", "after")
        await near.event(lambda e: e.get("data") == "after")
    assert "after" not in emitted(far)
    for agent in (far, near):
        assert not [e for e in agent.events if e["event"] == "error"], agent.events


async def test_deepstream_presence_across_nodes_with_python_clients(two, ds):
    """presence.getAll / subscribe / unsubscribe of deepstream's client, on two nodes,
    beside the Python SDK's: who logs in or out anywhere is seen everywhere, a client
    never of its own user (as with deepstream)."""
    n1, n2 = two.nodes
    # its subscriptions leave at once (not batched for 100 ms), so a query sent after
    # them is answered after the node took them: bob logs in only then
    wendy = await connected(ds, n1, {"username": "wendy"}, {"subscriptionInterval": 0})
    await wendy.ok("watch")                   # everyone
    await wendy.ok("watch", user="bob")       # and bob by name
    await wendy.ok("presence")
    changes = []
    async with rpcbus.connect(n1.url, name="pia") as pia:
        await pia.watch_presence(lambda user, online: changes.append((user, online)),
                                 ["bob"])
        bob = await connected(ds, n2, {"username": "bob"})
        joined = [await wendy.event(lambda e, of=of: e["event"] == "presence"
                                    and e["user"] == "bob" and e["of"] == of)
                  for of in (None, "bob")]
        assert all(e["online"] is True for e in joined)
        everyone = await wendy.ok("presence")
        assert {"bob", "pia"} <= set(everyone) and "wendy" not in everyone
        assert await wendy.ok("presence", users=["bob", "zed"]) == {"bob": True,
                                                                    "zed": False}
        assert "wendy" in await pia.presence()   # the Python client sees her
        await bob.ok("close")
        left = [await wendy.event(lambda e, of=of: e["event"] == "presence"
                                  and e["user"] == "bob" and e["online"] is False
                                  and e["of"] == of) for of in (None, "bob")]
        assert len(left) == 2
        async with asyncio.timeout(wait(5)):
            while changes != [("bob", True), ("bob", False)]:
                await asyncio.sleep(0.02)
    assert not [e for e in wendy.events if e["event"] == "error"], wendy.events
    assert not [e for e in wendy.events if e["event"] == "presence"
                and e["user"] == "wendy"]


async def test_a_provider_that_leaves_after_accepting_and_a_caller_that_leaves(two, ds):
    node = two.nodes[1]
    caller = await connected(ds, node)
    leaver = await connected(ds, node)
    await leaver.ok("provide", name="gone.soon", kind="leave")
    async with rpcbus.connect(node.url) as py:
        async with asyncio.timeout(wait(5)):
            while "gone.soon" not in [r["rpc"] for r in await py.rpcs()]:
                await asyncio.sleep(0.05)
        # accepted, then its client left: the caller hears at once (not after 2 s), in the
        # only words it has for "it may have run"
        started = time.monotonic()
        assert await caller.error("make", name="gone.soon", data=1) == "RESPONSE_TIMEOUT"
        assert time.monotonic() - started < 1.5
        assert await leaver.proc.wait() == 0

        # a caller that leaves mid-call: its provider's handler is cancelled
        cancelled = asyncio.Event()

        async def hang(d):
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                cancelled.set()
                raise
        await py.provide("py.hang", hang)
        quitter = await connected(ds, node)
        call = asyncio.get_running_loop().create_task(
            quitter.send("make", name="py.hang", data=1, wait=30))
        async with asyncio.timeout(wait(5)):
            while not (await py.providers("py.hang"))[0]["outstanding"]:
                await asyncio.sleep(0.05)
        await quitter.proc.stdin.drain()
        quitter.proc.stdin.close()   # the agent closes its client and exits
        async with asyncio.timeout(wait(5)):
            await cancelled.wait()
        call.cancel()


async def test_logins_permissions_and_limits(ds, tmp_path):
    conf = tmp_path / "node.toml"
    conf.write_text(f"""
[auth]
max_failures = 2
[auth.users.worker]
password = "{hash_password("w0rker", n=1 << 12)}"
provide = ["billing.*"]
call = ["billing.*"]
[auth.users.frontend]
token_sha256 = "{token_digest("front-token")}"
call = ["billing.*"]
rate_messages = 20
[deepstream]
enabled = true
""")
    node = NodeProcess("--config", str(conf), env=FAST).start()
    try:
        worker = await connected(ds, node, {"username": "worker", "password": "w0rker"})
        front = await connected(ds, node, {"token": "front-token"})
        await worker.ok("provide", name="billing.echo", kind="echo")
        await worker.ok("provide", name="users.delete", kind="echo")  # not allowed
        denied = await worker.event(lambda e: e["event"] == "error"
                                    and e["kind"] == "MESSAGE_DENIED", timeout=5)
        assert denied["topic"] == "RPC" and denied["error"]["name"] == "users.delete", denied
        async with asyncio.timeout(wait(5)):
            while "error" in await front.send("make", name="billing.echo", data=1):
                await asyncio.sleep(0.05)
        assert await front.ok("make", name="billing.echo", data={"x": 1}) == {"x": 1}
        assert await front.error("make", name="admin.reset", data=1) == "MESSAGE_DENIED"
        # over the user's rate limit (20 a second): RATE_LIMITED, the connection stays
        answers = await asyncio.gather(*(front.send("make", name="billing.echo", data=i)
                                         for i in range(40)))
        limited = [a["error"] for a in answers if "error" in a]
        assert limited and all(e["code"] == "RATE_LIMITED" for e in limited), answers

        # refused logins: the reason, and after auth.max_failures the client is told so
        # and closed
        wrong = await ds()
        answer = await wrong.ok("connect", url=ds_url(node),
                                login={"username": "worker", "password": "nope"})
        assert answer == {"ok": False, "data": {"reason": "authentication failed"}}
        answer = await wrong.ok("login", login={"username": "worker", "password": "again"})
        assert answer["ok"] is False
        await wrong.event(lambda e: e.get("state") == "TOO_MANY_AUTH_ATTEMPTS")
        stranger = await ds()
        answer = await stranger.ok("connect", url=ds_url(node), login={"token": "nope"})
        assert answer["ok"] is False
        assert answer["data"]["reason"].startswith("authentication failed"), answer
        assert (await stranger.ok("login", login={"username": "worker", "password": "w0rker"})
                )["ok"] is True   # a refusal leaves the connection to try again
    finally:
        assert node.stop() == 0


async def test_hostile_frames_cost_their_sender_only(two, ds):
    node = two.nodes[0]
    # its heartbeat: PING every 0.1 s, reconnecting after 0.2 s without a message; each
    # PING is answered, so an idle client stays
    client = await connected(ds, node, options={"heartbeatInterval": 100})
    await client.ok("provide", name="calm.echo", kind="echo")
    async with rpcbus.connect(node.url) as py:
        await wait_routable(py, "calm.echo", 1)
        before = stats(node)["io"]
        async with ws_connect(ds_url(node), compression=None) as raw:
            for junk in (b"\xff" * 40, b"\x05\x10\x02\x1a\x09", b"\x02\x08"):  # not protobuf
                await raw.send(junk)
            await raw.send(b"\x06\x10\x06\x1a\x02\x08\x02")  # an RPC REQUEST before login
            with pytest.raises(ConnectionClosed) as closed:
                for _ in range(20):
                    await raw.send(b"\x01")
                    await asyncio.sleep(0.01)
                await raw.recv()
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
        assert await py.call("calm.echo", "still here", timeout=3) == "still here"
        assert await client.ok("make", name="calm.echo", data="me too") == "me too"
        assert [e for e in client.events if e["event"] == "state"][-1]["state"] == "OPEN"
        after = stats(node)["io"]
        assert after["deepstream_bad_frames"] - before.get("deepstream_bad_frames", 0) >= 3
        assert after["closed_for_garbage"] > before.get("closed_for_garbage", 0)


async def test_pings_before_login_are_budgeted_as_websocket_pings(two, ds):
    """deepstream's CONNECTION PING before login costs what a WebSocket ping does: the
    21st in a window closes the connection (before: one 63 kB frame of PINGs got 9,216
    PONG frames back, no strike, and other clients' calls waited seconds). A frame
    before login with more messages than that budget is closed unread (before: all
    9,000 decoded first, ~30 ms of the node's loop each), and the flooding address's
    next connection waits before the node reads it (before: 32 such clients
    reconnecting at once took a core of the node)."""
    node = two.nodes[0]
    client = await connected(ds, node)
    await client.ok("provide", name="pinged.echo", kind="echo")
    ping = ds_wire.encode(ds_wire.DsMessage(ds_wire.T_CONNECTION, ds_wire.C_PING))
    flooder = ("127.0.0.9", 0)
    async with rpcbus.connect(node.url) as py:
        await wait_routable(py, "pinged.echo", 1)
        pongs = 0
        async with ws_connect(ds_url(node), compression=None, local_addr=flooder) as raw:
            await raw.send(ping * 5)                 # a client's heartbeat: answered
            with pytest.raises(ConnectionClosed) as closed:
                for _ in range(5):
                    await raw.recv()
                    pongs += 1
                await raw.send(ping * 9000)          # a flood in one frame: closed
                while True:
                    await raw.recv()
                    pongs += 1
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
        assert "before login" in closed.value.rcvd.reason  # refused whole, unread
        assert pongs <= 20, pongs
        for _ in range(HOLD_AFTER):                  # a few more: past a few typos' worth
            async with ws_connect(ds_url(node), compression=None, local_addr=flooder) as raw:
                await raw.send(ping * 9000)
                with pytest.raises(ConnectionClosed):
                    await raw.recv()
        held = stats(node)["io"].get("connections_held", 0)
        t0 = time.monotonic()
        async with ws_connect(ds_url(node), compression=None, local_addr=flooder):
            assert time.monotonic() - t0 >= 0.09     # held 0.1 s (Gate.hold_for)
        assert stats(node)["auth"]["floods_closed"] == HOLD_AFTER + 1
        assert stats(node)["io"]["connections_held"] == held + 1
        assert await py.call("pinged.echo", "still here", timeout=3) == "still here"
        assert await client.ok("make", name="pinged.echo", data="me too") == "me too"


async def test_a_client_that_does_not_log_in_in_time_is_told_so_then_closed():
    """A deepstream connection with no AUTH by ``limits.auth_timeout`` hears deepstream's
    CONNECTION AUTHENTICATION_TIMEOUT, then is closed 1008, as deepstream does (before,
    the login timer, armed before the upgrade named the path, closed it without a word)."""
    with NodeProcess(env={**DS, "RPCBUS_LIMITS_AUTH_TIMEOUT": "0.5"}) as node:
        async with ws_connect(ds_url(node), compression=None) as raw:
            told = []
            with pytest.raises(ConnectionClosed) as closed:
                async with asyncio.timeout(wait(10)):
                    while True:
                        told += ds_wire.decode(await raw.recv(), 10)
        assert [(m.topic, m.action) for m in told] == [
            (ds_wire.T_CONNECTION, ds_wire.C_AUTHENTICATION_TIMEOUT)]
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008


async def test_a_jwt_that_expires_closes_its_client_which_cannot_log_in_again(ds, tmp_path):
    """A deepstream client cannot renew a token in place: at its JWT's expiry the node
    closes it (1008), its names are withdrawn, and its reconnect's login with the same
    token is refused, which the client reports (docs/deepstream.md)."""
    signer = ed25519.Ed25519PrivateKey.generate()
    (tmp_path / "ops.pub").write_bytes(signer.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    conf = tmp_path / "node.toml"
    conf.write_text(f"""
[auth]
token_leeway = 0.0
[auth.token_keys]
ops = "{tmp_path / 'ops.pub'}"
[deepstream]
enabled = true
""")
    def token(user, ttl):
        return jwt.encode({"sub": user, "call": ["*"], "provide": ["*"], "iss": "rpcbus",
                           "aud": "rpcbus", "exp": time.time() + ttl}, signer,
                          algorithm="EdDSA")
    with NodeProcess("--config", str(conf), env=FAST) as node:
        client = await connected(ds, node, {"token": token("relay", 3)}, options=QUICK)
        await client.ok("provide", name="relay.echo", kind="echo")
        async with asyncio.timeout(wait(5)):  # its PROVIDE leaves within 0.1 s (it batches them)
            while "error" in await client.send("make", name="relay.echo", data=1):
                await asyncio.sleep(0.05)
        failed = await client.event(lambda e: e["event"] == "reauthenticationFailure",
                                    timeout=15)
        assert "expired" in failed["reason"]["reason"], failed
        expired = await asyncio.to_thread(node.wait_event, "session_token_expired")
        assert expired["user"] == "relay"
        async with rpcbus.connect(node.url, token=token("ops", 600)) as py:
            with pytest.raises(rpcbus.NoProviderError):   # its names went with it
                await py.call("relay.echo", 1, timeout=2)


async def test_the_path_says_how_to_turn_it_on_and_refuses_while_draining(ds):
    with NodeProcess(env=FAST) as node:
        with pytest.raises(urllib.error.HTTPError) as answer:
            await asyncio.to_thread(urllib.request.urlopen,
                                    node.url.replace("ws://", "http://") + "/deepstream",
                                    timeout=5)
    assert answer.value.code == 404
    assert b"[deepstream] enabled = true" in answer.value.read()

    # a draining node takes no new deepstream client: it would close it once idle, and
    # the client would come back, in a loop
    node = NodeProcess(env={**DS, "RPCBUS_SERVER_DRAIN_TIMEOUT": "3"}).start()
    try:
        client = await connected(ds, node)
        async with rpcbus.connect(node.url) as py:
            await py.provide("py.slow", _slow)
            call = asyncio.ensure_future(client.send("make", name="py.slow", data=1.0))
            async with asyncio.timeout(wait(5)):
                while not (await py.providers("py.slow"))[0]["outstanding"]:
                    await asyncio.sleep(0.02)
            node.signal(signal.SIGTERM)
            await asyncio.to_thread(node.wait_event, "node_draining")
            with pytest.raises(InvalidStatus) as refused:
                async with ws_connect(ds_url(node)):
                    pass
            assert refused.value.response.status_code == 503
            assert (await call)["ok"] == 1.0      # what it had under way is answered
            await client.event(lambda e: e.get("state") == "RECONNECTING")
        assert await asyncio.to_thread(node.wait_exit) == 0
    finally:
        node.kill()


async def test_clients_reconnect_to_a_restarted_node_and_provide_again(ds):
    cluster = LocalCluster(nodes=2, env=DS).start()
    try:
        provider = await connected(ds, cluster.nodes[0], options=QUICK)
        caller = await connected(ds, cluster.nodes[0], options=QUICK)
        await provider.ok("provide", name="back.echo", kind="echo")
        async with rpcbus.connect(cluster.nodes[1].url) as py:
            assert await wait_routable(py, "back.echo", "before") == "before"
            # a call under way when its node drains still gets its answer
            await py.provide("py.slow", _slow)
            slow = asyncio.get_running_loop().create_task(
                caller.send("make", name="py.slow", data=0.8, wait=20))
            async with asyncio.timeout(wait(5)):
                while not (await py.providers("py.slow"))[0]["outstanding"]:
                    await asyncio.sleep(0.02)
            await asyncio.to_thread(cluster.restart, 0, True)
            assert (await slow)["ok"] == 0.8
            await provider.event(lambda e: e.get("state") == "RECONNECTING")
            async with asyncio.timeout(wait(10)):  # it logs in again and provides again
                assert await wait_routable(py, "back.echo", "after", timeout=10) == "after"
            assert await caller.ok("make", name="back.echo", data="again") == "again"
    finally:
        codes = cluster.stop()
        assert all(code == 0 for code in codes.values()), codes


async def _slow(seconds):
    await asyncio.sleep(seconds)
    return seconds
