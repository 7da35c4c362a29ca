"""Hostile clients and a hostile Redis user against a 2-node cluster with users, rate
limits and a sealed bus (issue 14's seven findings). Each attack runs against real node
processes while a healthy caller on n1 calls a healthy provider on n2 all the time; its
answers and its worst latency are checked after every attack, not only liveness."""

import asyncio
import glob
import json
import time
from pathlib import Path

import msgpack
import pytest
import redis.asyncio as aioredis

import rpcbus
from rpcbus import protocol as p
from rpcbus.broker.auth import hash_password, token_digest
from rpcbus.cluster.seal import new_key
from tests.integration.raw import RawPeer
from tests.integration.test_operations import get

from ..timing import wait
from .conftest import stats

KEY = new_key()
TOKENS = {u: f"{u}-token" for u in ("worker", "caller", "mallory")}
USERS = {
    "worker": {"token_sha256": token_digest(TOKENS["worker"]), "provide": ["*"],
               "call": ["*"]},
    "caller": {"token_sha256": token_digest(TOKENS["caller"]), "call": ["*"]},
    "mallory": {"token_sha256": token_digest(TOKENS["mallory"]), "call": ["pub.*", "echo"],
                "provide": ["pub.*"], "rate_messages": 2000, "max_provided": 1500},
    "pw": {"password": hash_password("right", n=1 << 12), "call": ["echo"]},
}
ENV = {"RPCBUS_AUTH_MODE": "users", "RPCBUS_AUTH_USERS": json.dumps(USERS),
       "RPCBUS_CLUSTER_SEAL": "sign", "RPCBUS_CLUSTER_KEY_ID": "k1",
       "RPCBUS_CLUSTER_KEYS": json.dumps({"k1": KEY})}
WORST_LATENCY_S = 1.0


def deep(levels, leaf=b"\xc0"):
    """msgpack bytes of ``levels`` nested one-element arrays around nil (a node decodes
    frames up to 1,024 levels; the bus packs up to 1,024 with its own 3 around data)."""
    return b"\x91" * levels + leaf


@pytest.fixture
def guarded(make_cluster):
    def make(**env):
        return make_cluster(nodes=2, **{**ENV, **env})
    return make


class Healthy:
    """A provider of ``echo`` on n2 and a caller on n1, calling one call after another."""

    def __init__(self, c):
        self.c = c
        self.results, self.latencies = [], []
        self.stop = asyncio.Event()
        self.progress = asyncio.Event()

    async def __aenter__(self):
        n1, n2 = self.c.nodes
        self.prov = await rpcbus.connect(n2.url, token=TOKENS["worker"])
        await self.prov.provide("echo", lambda d: d)
        self.caller = await rpcbus.connect(n1.url, token=TOKENS["caller"])
        self.task = asyncio.create_task(self._keep_calling())
        await self.more(5)
        return self

    async def _keep_calling(self):
        i = 0
        while not self.stop.is_set():
            i += 1
            t0 = time.monotonic()
            self.results.append((i, await self.caller.call("echo", i, timeout=5)))
            self.latencies.append(time.monotonic() - t0)
            self.progress.set()

    async def more(self, n):
        mark = len(self.results)
        async with asyncio.timeout(wait(10)):
            while len(self.results) < mark + n:
                self.progress.clear()
                await self.progress.wait()

    async def check(self):
        """20 more right answers; none wrong or slow at any time; n1 ready, never cut off."""
        await self.more(20)
        assert all(i == r for i, r in self.results)
        assert max(self.latencies) < WORST_LATENCY_S, max(self.latencies)
        n1, n2 = self.c.nodes
        assert get(n1, "/readyz") == (200, "ready\n")
        assert stats(n1)["cluster"]["bus"]["reconnects"] == 0
        assert stats(n2)["cluster"]["nodes_dead"] == 0

    async def __aexit__(self, *exc):
        self.stop.set()
        try:
            await self.task
        finally:
            await self.caller.close()
            await self.prov.close()


async def test_data_nested_too_deeply_for_the_bus_is_refused_to_its_sender(guarded):
    c = guarded()
    n1, n2 = c.nodes
    async with Healthy(c) as healthy:
        mallory = await RawPeer.open(n1.url, token=TOKENS["mallory"])
        for levels in (1022, 1023):       # the bus wraps call data 3 levels deeper
            frame = (b"\x95" + msgpack.packb(p.REQUEST) + msgpack.packb(levels)
                     + msgpack.packb("echo") + deep(levels) + msgpack.packb(5000))
            await mallory.send_raw(frame)
            err = await mallory.expect(p.ERROR, timeout=2.0)   # at once, not at its deadline
            assert err[1:3] == [levels, "INVALID_MESSAGE"] and "nested" in err[3]
        # a provider on n2 answering a call from n1 with such data
        rogue = await RawPeer.open(n2.url, token=TOKENS["worker"])
        await rogue.provide("pub.deep")
        async with rpcbus.connect(n1.url, token=TOKENS["caller"]) as caller:
            call = asyncio.create_task(caller.call("pub.deep", 1, timeout=5))
            req = await rogue.expect(p.REQUEST)
            await rogue.send_raw(b"\x93" + msgpack.packb(p.RESPONSE)
                                 + msgpack.packb(req[1]) + deep(1023))
            with pytest.raises(rpcbus.ProviderError, match="nested"):
                await asyncio.wait_for(call, wait(2.0))
        assert stats(n2)["cluster"]["bus"]["unencodable"] >= 1
        await healthy.check()


async def test_the_bus_carries_batches_up_to_its_size_and_refuses_larger_unread(guarded):
    """Calls whose data add up to more than one batch cross in several; data too large to
    cross alone is refused to its caller at once; a PUBLISH of junk larger than any batch
    a node sends is refused before any crypto, and the bus stays up."""
    c = guarded(RPCBUS_LIMITS_MAX_FRAME_BYTES=str(16 << 20))
    n1, n2 = c.nodes
    async with Healthy(c) as healthy:
        async with rpcbus.connect(n2.url, token=TOKENS["worker"]) as prov, \
                rpcbus.connect(n1.url, token=TOKENS["caller"]) as caller:
            await prov.provide("pub.big", lambda d: d)
            data = [bytes([i]) * (3 << 19) for i in range(4)]   # 1.5 MiB each: 6 MiB
            assert await asyncio.gather(*(caller.call("pub.big", d, timeout=10)
                                          for d in data)) == data
            with pytest.raises(rpcbus.InvalidMessageError, match="too large to cross"):
                await asyncio.wait_for(caller.call("pub.big", b"x" * (5 << 20),
                                                   timeout=10), 3.0)   # at once
        r = aioredis.from_url(c.redis_url)
        try:
            await r.publish("rpcbus:node:n2", b"\x00" * (6 << 20))
        finally:
            await r.aclose()
        async with asyncio.timeout(wait(5)):
            while not stats(n2)["cluster"]["bus_rejected"].get("too_large"):
                await asyncio.sleep(0.05)
        assert stats(n2)["cluster"]["bus"]["batches_out"] > 0
        await healthy.check()


async def test_a_subscriber_redis_drops_fails_no_call_that_could_wait(guarded):
    """Anyone who may PUBLISH can make Redis drop a node's subscriber: one PUBLISH larger
    than Redis's pubsub output limit (32 MB by default). The node resubscribes, and its
    calls running on n2 meanwhile wait and are answered: none fails CLUSTER_UNAVAILABLE
    (before: every one did)."""
    c = guarded()
    n1, n2 = c.nodes
    calls_n, running = 20, []
    started, release = asyncio.Event(), asyncio.Event()

    async def slow(data):
        running.append(data)
        if len(running) == calls_n:
            started.set()
        await release.wait()
        return data

    async with rpcbus.connect(n2.url, token=TOKENS["worker"]) as prov, \
            rpcbus.connect(n1.url, token=TOKENS["caller"]) as caller:
        await prov.provide("pub.slow", slow)
        calls = [asyncio.create_task(caller.call("pub.slow", i, timeout=wait(30)))
                 for i in range(calls_n)]
        async with asyncio.timeout(wait(10)):
            await started.wait()
        r = aioredis.from_url(c.redis_url)
        try:
            assert await r.publish("rpcbus:node:n1", b"\x00" * (48 << 20)) == 1
        finally:
            await r.aclose()
        async with asyncio.timeout(wait(10)):      # dropped, and subscribed again
            while not ((bus := stats(n1)["cluster"])["bus"]["reconnects"]
                       and bus["available"]):
                await asyncio.sleep(0.05)
        release.set()
        assert await asyncio.gather(*calls) == list(range(calls_n))
        assert sorted(running) == list(range(calls_n))   # each ran once
        assert stats(n1)["router"]["bus_waits"] == calls_n


async def test_junk_names_neither_reach_the_globs_nor_blow_up_metrics(guarded):
    c = guarded()
    n1, n2 = c.nodes
    async with Healthy(c) as healthy:
        mallory = await RawPeer.open(n1.url, token=TOKENS["mallory"])
        for i in range(24):                          # pub.* matches them: checked first
            await mallory.send([p.REQUEST, i, "pub." + "x" * (256 << 10), None, 5000])
            err = await mallory.expect(p.ERROR)
            assert err[1:3] == [i, "INVALID_MESSAGE"]
        junk = [[p.REQUEST, 100 + i, f"pub.junk{i}", None, 5000] for i in range(1200)]
        await mallory.send(*junk)                     # valid names nobody provides
        codes = [(await mallory.expect(p.ERROR))[2] for _ in junk]
        assert set(codes) == {"NO_PROVIDER"}
        async with rpcbus.connect(n2.url, token=TOKENS["worker"]) as prov, \
                rpcbus.connect(n1.url, token=TOKENS["caller"]) as caller:
            await prov.provide("pub.real", lambda d: d)
            assert await caller.call("pub.real", 1, timeout=5) == 1
        status, text = get(n1, "/metrics")
        assert status == 200 and len(text) < 200_000
        assert 'rpc="pub.real"' in text and 'rpc="echo"' in text   # junk took no row
        assert "pub.junk" not in text and "xxxx" not in text
        await healthy.check()


async def test_a_flood_over_the_rate_limit_costs_the_node_little(guarded):
    c = guarded(RPCBUS_LIMITS_RATE_WINDOW="1.0")
    n1 = c.nodes[0]
    async with Healthy(c) as healthy:
        mallory = await RawPeer.open(n1.url, token=TOKENS["mallory"])
        await mallory.send_raw(msgpack.packb([[p.PING]] * 300_000))   # 600 kB
        err = await mallory.expect(p.ERROR)           # refused from its header: one error
        assert err[2] == "INVALID_MESSAGE" and "at most 10000 messages" in err[3]
        pings = msgpack.packb([[p.PING]] * 10_000)
        for _ in range(60):                           # 600k PINGs in ~3 s: 100 times the limit
            await mallory.send_raw(pings)
            await asyncio.sleep(0.05)
        errors = pongs = 0
        try:
            while True:
                msg = await mallory.recv(timeout=1.0)
                errors += msg[0] == p.ERROR
                pongs += msg[0] == p.PONG
        except TimeoutError:
            pass
        assert pongs <= 2000 * 5                      # within the limit, over ~4 windows
        assert 1 <= errors <= 60                      # one RATE_LIMITED per refused frame
        assert stats(n1)["io"]["rate_limited"] > 500_000
        await healthy.check()


async def test_provided_names_are_bounded_and_heartbeats_stay_small(guarded):
    c = guarded()
    n1, n2 = c.nodes
    async with Healthy(c) as healthy:
        first = await RawPeer.open(n1.url, token=TOKENS["mallory"])
        await first.send([p.PROVIDE, 1, [f"pub.a{i}" for i in range(1000)]])
        assert (await first.expect(p.OK))[1] == 1
        await first.send([p.PROVIDE, 2, ["pub.one.more"]])      # the connection's 1,000
        err = await first.expect(p.ERROR)
        assert err[1:3] == [2, "LIMIT_EXCEEDED"] and "connection" in err[3]
        second = await RawPeer.open(n1.url, token=TOKENS["mallory"])
        await second.send([p.PROVIDE, 3, [f"pub.b{i}" for i in range(600)]])  # user: 1,500
        err = await second.expect(p.ERROR)
        assert err[1:3] == [3, "LIMIT_EXCEEDED"] and "mallory" in err[3]
        await second.send([p.PROVIDE, 4, [f"pub.b{i}" for i in range(500)]])
        assert (await second.expect(p.OK))[1] == 4
        async with asyncio.timeout(wait(10)):                          # n2 hears n1's heartbeat
            while (seen := json.loads(get(n2, "/cluster")[1])["nodes"]["n1"]).get(
                    "rpcs", 0) < 1500:
                await asyncio.sleep(0.1)
        assert len(seen["providers"]) == 100 and seen["providers_total"] == 1500
        sessions = stats(n1)["sessions"]
        await first.close()                                      # its 1,000 are freed
        async with asyncio.timeout(wait(5)):
            while stats(n1)["sessions"] >= sessions:
                await asyncio.sleep(0.02)
        await second.send([p.PROVIDE, 5, [f"pub.c{i}" for i in range(500)]])
        assert (await second.expect(p.OK))[1] == 5
        await healthy.check()


def refused(node):
    """Batches a restarted node refused as meant for the process before it: sealed before
    it started, or (sealed in the 2 s before) addressed to the old incarnation."""
    cluster = stats(node)["cluster"]
    return cluster["misaddressed"] + cluster["bus_rejected"].get("before_start", 0)


async def test_replayed_batches_never_reach_a_restarted_node(guarded):
    c = guarded()
    r = aioredis.from_url(c.redis_url)
    pubsub = r.pubsub()
    await pubsub.psubscribe("rpcbus:node:*")
    captured = []
    runs = []

    async def capture():
        async for msg in pubsub.listen():
            if msg["type"] == "pmessage":
                captured.append((msg["channel"].decode(), msg["data"]))

    listener = asyncio.create_task(capture())
    release = asyncio.Event()

    async def transfer(d):
        runs.append(d)
        if d == "second":
            await release.wait()
        return f"receipt of {d}"

    try:
        n1, n2 = c.nodes
        async with rpcbus.connect(n2.url, token=TOKENS["worker"]) as prov:
            await prov.provide("transfer", transfer)
            async with rpcbus.connect(n1.url, token=TOKENS["caller"]) as caller:
                assert await caller.call("transfer", "first", timeout=5) == "receipt of first"
            await asyncio.sleep(0.2)                 # the last batches reach the listener
            to_n2 = [b for ch, b in captured if ch == "rpcbus:node:n2"]
            to_n1 = [b for ch, b in captured if ch == "rpcbus:node:n1"]
            assert to_n2 and to_n1
            n2 = await asyncio.to_thread(c.restart, 1)       # the provider's node
            await prov.provide("transfer", transfer)       # (again: it has reconnected)
            for batch in to_n2:                              # the INVOKE, replayed
                await r.publish("rpcbus:node:n2", batch)
            async with asyncio.timeout(wait(5)):
                while refused(n2) < len(to_n2):
                    await asyncio.sleep(0.05)
            assert runs == ["first"]
            n1 = await asyncio.to_thread(c.restart, 0)       # the origin
            async with rpcbus.connect(n1.url, token=TOKENS["caller"]) as caller:
                call = asyncio.create_task(caller.call("transfer", "second", timeout=8))
                async with asyncio.timeout(wait(5)):
                    while "second" not in runs:
                        await asyncio.sleep(0.02)
                for batch in to_n1:                          # the old RESPONSE, replayed
                    await r.publish("rpcbus:node:n1", batch)
                async with asyncio.timeout(wait(5)):
                    while refused(n1) < len(to_n1):
                        await asyncio.sleep(0.05)
                release.set()
                assert await call == "receipt of second"
    finally:
        listener.cancel()
        await pubsub.aclose()
        await r.aclose()


async def test_a_login_flood_does_not_lock_out_password_users(guarded):
    c = guarded()
    n1 = c.nodes[0]
    stop = asyncio.Event()

    async def attacker():
        while not stop.is_set():
            try:
                peer = await RawPeer.open(n1.url, auth=False)
                for _ in range(3):                   # then the node closes it
                    await peer.send([p.AUTH, {"protocol": 1, "user": "nobody",
                                              "password": "guess"}])
                    await peer.expect(p.AUTH_FAIL, timeout=20)
                await peer.close()
            except Exception:  # closed by the node, or the test is ending
                await asyncio.sleep(0.01)

    attackers = [asyncio.create_task(attacker()) for _ in range(40)]
    try:
        await asyncio.sleep(0.5)                     # the checks queue up

        async def login():
            async with rpcbus.connect(n1.url, user="pw", password="right",
                                      open_timeout=wait(10)) as client:
                return client.session["user"]

        async with asyncio.timeout(wait(30)):
            assert await asyncio.gather(*(login() for _ in range(10))) == ["pw"] * 10
    finally:
        stop.set()
        for task in attackers:
            task.cancel()
        await asyncio.gather(*attackers, return_exceptions=True)


async def test_a_login_flood_from_a_few_addresses_leaves_room_for_everyone_else(guarded):
    """320 connections from 5 addresses keep sending wrong passwords, turned away BUSY
    (the queue of 256 full, or their failing checks' budget spent, whichever the timing
    makes first); a real user from another address is checked on its first try all the
    same. Who makes room in a full queue is proved in tests/unit/test_gate.py."""
    c = guarded()
    n1 = c.nodes[0]
    stop = asyncio.Event()

    async def attacker(address):
        while not stop.is_set():
            try:
                peer = await RawPeer.open(n1.url, auth=False, local_addr=(address, 0))
                while not stop.is_set():
                    await peer.send([p.AUTH, {"protocol": 1, "user": "nobody",
                                              "password": "guess"}])
                    if (await peer.expect(p.AUTH_FAIL, timeout=30))[1] == "BUSY":
                        await asyncio.sleep(0.2)
            except Exception:  # closed after 3 failures: come back
                await asyncio.sleep(0.05)

    attackers = [asyncio.create_task(attacker(f"127.0.0.{2 + i % 5}")) for i in range(320)]
    try:
        async with asyncio.timeout(wait(30)):              # the queue is full: logins turned away
            while stats(n1)["auth"].get("logins_busy", 0) < 50:
                await asyncio.sleep(0.1)
        for _ in range(3):
            real = await RawPeer.open(n1.url, auth=False)
            await real.send([p.AUTH, {"protocol": 1, "user": "pw", "password": "right"}])
            answer = await real.recv(timeout=10)
            assert answer[0] == p.AUTH_OK, answer    # first try: never BUSY
            await real.close()
        busy = stats(n1)["auth"]["logins_busy"]
        async with asyncio.timeout(wait(30)):              # and the flood still goes on
            while stats(n1)["auth"]["logins_busy"] == busy:
                await asyncio.sleep(0.1)
    finally:
        stop.set()
        for task in attackers:
            task.cancel()
        await asyncio.gather(*attackers, return_exceptions=True)


async def test_a_client_cannot_pass_for_another_user(guarded, tmp_path):
    c = guarded(RPCBUS_HISTORY_DIR=str(tmp_path), RPCBUS_HISTORY_WINDOW="0.5")
    n1, n2 = c.nodes
    seen = []

    def who(d, ctx):
        seen.append((ctx.user, ctx.caller))
        return d

    async with rpcbus.connect(n2.url, token=TOKENS["mallory"], name="worker") as fake, \
            rpcbus.connect(n2.url, token=TOKENS["worker"], name="worker") as real, \
            rpcbus.connect(n1.url, token=TOKENS["mallory"], name="admin") as caller:
        await fake.provide("pub.who", who)
        await real.provide("pub.who", who)
        for i in range(40):
            assert await caller.call("pub.who", i, timeout=5) == i
    assert {u for u, _ in seen} == {"mallory"}               # across nodes, set by n1
    # the label it chose, behind the user it is: a name cannot pass for another user's
    assert all(label.startswith("mallory/admin@") for _, label in seen)
    for node in (n1, n2):
        assert node.stop() == 0
    rows = [json.loads(line) for path in glob.glob(f"{tmp_path}/*/*/node=*/*.jsonl")
            for line in Path(path).read_text().splitlines()]
    assert {r["provider"] for r in rows if r["rpc"] == "pub.who"} == \
        {"mallory/worker", "worker"}
