"""A healthy caller's latency while one client attacks the node, each attack in one run.

    python -m rpcbus.benchmarks.attacks                      # every attack, ~2.5 min
    python -m rpcbus.benchmarks.attacks --only ping_flood,logins
    python -m rpcbus.benchmarks.attacks --only logins,bad_jwts --rounds 5

A 2-node cluster (auth mode users, a rate limit for ``mallory``, a sealed
bus). A healthy caller on n1 calls ``echo`` on n2 one call after another
from this process the whole time; each attack runs in a child process of its
own, so its client-side work does not slow the caller down. For every phase
(a quiet baseline before each attack, then the attack) it prints the caller's
p50, p99 and worst latency and p99 against the baseline measured just
before, the CPU n1 and the attacker used (cores) and n1's memory growth;
``logins`` also times a real user's password logins (each a user not logged
in before, so the check is never a cached one). The attacks (issue
38's table, each bounded in bytes and time):

- ``cancel``     9,000 calls pending for ``mallory``, then 2 frames of 9,999
                 CANCELs with made-up ids
- ``ping_flood`` 3 MB of 6-byte WebSocket pings from a connection that never logs in
- ``pong_hoard`` 125-byte pings whose pongs are never read, for 8 s (node RSS
                 growth and how long the connection stayed open are printed)
- ``logins``     320 connections from 5 source addresses (127.0.0.2-6) sending
                 wrong passwords while a real user logs in
- ``bad_jwts``   48 connections from one address (127.0.0.8) sending 7.2 kB JWTs
                 signed by a stranger, with no ``kid`` (the node holds 2 keys), each
                 new (a signature character changed), for 10 s
- ``bad_tokens`` the same with wrong static tokens
- ``ds_pings``   32 connections from one address (127.0.0.9) to ``/deepstream``,
                 each sending one 63 kB frame of deepstream PINGs before login and
                 coming back as soon as the node closes it, for 10 s
- ``conns``      connections from one address until the node refuses them, half
                 of them stuck mid-handshake
- ``headers``    handshakes with 64 kB of headers
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import multiprocessing
import os
import shutil
import statistics
import tempfile
import time
from collections import Counter
from typing import Any, Callable

import jwt
import msgpack
import psutil
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from websockets.asyncio.client import connect as ws_connect

import rpcbus
from rpcbus import protocol as p
from rpcbus.broker import ds_wire
from rpcbus.broker.auth import hash_password, token_digest
from rpcbus.broker.local import LocalCluster
from rpcbus.cluster.seal import new_key

MAX_ROUNDS = 10  # --rounds: at most this many quiet and attack windows per attack
TOKENS = {u: f"{u}-token" for u in ("worker", "caller", "mallory")}
USERS: dict[str, Any] = {
    "worker": {"token_sha256": token_digest(TOKENS["worker"]), "provide": ["*"], "call": ["*"]},
    "caller": {"token_sha256": token_digest(TOKENS["caller"]), "call": ["*"]},
    "mallory": {"token_sha256": token_digest(TOKENS["mallory"]), "call": ["pub.*"],
                "provide": ["pub.*"], "rate_messages": 1000},
}
USERS.update({f"pw{i}": {"password": hash_password("right"), "call": ["echo"]}
              for i in range(6 * MAX_ROUNDS)})


# -- raw WebSocket pieces (what an attacker sends; no library in the way) ---------------

async def handshake(url: str, local: str | None = None, extra: bytes = b"",
                    finish: bool = True) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = url.rsplit("/", 1)[-1].rsplit(":", 1)
    reader, writer = await asyncio.open_connection(
        host, int(port), local_addr=(local, 0) if local else None)
    key = base64.b64encode(os.urandom(16))
    writer.write(b"GET / HTTP/1.1\r\nHost: " + host.encode() + b"\r\nUpgrade: websocket\r\n"
                 b"Connection: Upgrade\r\nSec-WebSocket-Key: " + key +
                 b"\r\nSec-WebSocket-Version: 13\r\n" + extra + (b"\r\n" if finish else b""))
    if finish:
        try:
            status = (await reader.readuntil(b"\r\n\r\n")).split(b"\r\n", 1)[0]
        except BaseException:
            writer.transport.abort()
            raise
        if b" 101 " not in status:
            writer.transport.abort()
            raise ConnectionError(status.decode())
    return reader, writer


def masked(opcode: int, payload: bytes) -> bytes:
    """One client frame (masked with zeros: the bytes go out as they are)."""
    assert len(payload) < 126
    return bytes((0x80 | opcode, 0x80 | len(payload))) + b"\0\0\0\0" + payload


# -- the attacks (each runs in a child process; returns what it saw) --------------------

async def _cancel(url: str) -> dict[str, Any]:
    async def logged_in(*then: list[Any]) -> Any:
        ws = await ws_connect(url, compression=None, max_size=None)
        await ws.send(p.encode([[p.AUTH, {"protocol": 1, "token": TOKENS["mallory"]}]]))
        assert p.decode(await ws.recv())[0][0] == p.AUTH_OK
        for msg in then:
            await ws.send(p.encode([msg]))
            assert p.decode(await ws.recv())[0][0] == p.OK
        return ws

    holder = await logged_in([p.PROVIDE, 1, ["pub.hold"]])
    caller = await logged_in()

    taken = 0

    async def accept_all() -> None:   # takes every REQUEST and never answers
        nonlocal taken
        while True:
            msgs = p.decode(await holder.recv())
            ids = [m[1] for m in msgs if m[0] == p.REQUEST]
            if ids:
                taken += len(ids)
                await holder.send(p.encode([[p.ACCEPT_UPTO, max(ids)]]))

    taker = asyncio.create_task(accept_all())
    for start in range(0, 9000, 900):  # 900 a second keeps within the rate limit
        await caller.send(p.encode([[p.REQUEST, i, "pub.hold", None, 60_000]
                                    for i in range(start, start + 900)]))
        await asyncio.sleep(1.0)
    for base in (1_000_000, 2_000_000):
        await caller.send(msgpack.packb([[p.CANCEL, base + i] for i in range(9999)]))
    await asyncio.sleep(3.0)              # the healthy caller is measured meanwhile
    taker.cancel()
    return {"calls_pending": taken, "cancels": 2 * 9999}


async def _ping_flood(url: str) -> dict[str, Any]:
    reader, writer = await handshake(url)
    ping = masked(0x9, b"")
    sent = 0
    try:
        for _ in range(48):                       # 3 MB in 64 kB writes
            writer.write(ping * (65536 // len(ping)))
            sent += 65536
            await asyncio.wait_for(writer.drain(), 5)
    except (ConnectionError, TimeoutError):
        pass
    return {"sent_bytes": sent}


async def _pong_hoard(url: str) -> dict[str, Any]:
    reader, writer = await handshake(url)
    ping = masked(0x9, b"x" * 125)
    t0 = time.monotonic()
    open_for = None
    while time.monotonic() - t0 < 14:
        writer.write(ping * 64)
        try:
            await asyncio.wait_for(writer.drain(), 0.05)
        except TimeoutError:
            pass
        except ConnectionError:
            open_for = time.monotonic() - t0
            break
        if writer.transport.is_closing() or reader.at_eof():
            open_for = time.monotonic() - t0
            break
        await asyncio.sleep(0)
    writer.transport.abort()
    return {"open_s": None if open_for is None else round(open_for, 2)}


async def _logins(url: str) -> dict[str, Any]:
    stop = time.monotonic() + 10

    async def one(address: str) -> None:
        while time.monotonic() < stop:
            try:
                async with ws_connect(url, compression=None, max_size=None,
                                      local_addr=(address, 0), open_timeout=5) as ws:
                    for _ in range(3):
                        await ws.send(p.encode([[p.AUTH, {"protocol": 1, "user": "nobody",
                                                          "password": "guess"}]]))
                        await asyncio.wait_for(ws.recv(), 20)
            except Exception:  # refused, closed by the node: come back
                await asyncio.sleep(0.05)

    await asyncio.gather(*(one(f"127.0.0.{2 + i % 5}") for i in range(320)))
    return {}


def _stranger_jwts() -> Callable[[], str]:
    """JWTs the node cannot verify: 7.2 kB, signed by a key it does not hold, no kid;
    each a new one (one character of the signature changed), so none is refused from
    memory."""
    key = ed25519.Ed25519PrivateKey.generate()
    token = jwt.encode({"sub": "mallory", "iss": "rpcbus", "aud": "rpcbus",
                        "exp": time.time() + 3600, "call": ["x" * 5200]}, key,
                       algorithm="EdDSA")
    head, sig = token.rsplit(".", 1)
    count = iter(range(1 << 30))

    def one() -> str:
        n = next(count)
        return f"{head}.{sig[:-4]}{'ABCDEFGHIJKLMNOP'[n % 16]}{sig[-3:]}"
    return one


async def _bad_logins(url: str, token: Callable[[], str]) -> dict[str, Any]:
    """48 connections from 127.0.0.8 sending AUTH with ``token()`` for 10 s, each coming
    back as soon as the node closes it."""
    stop = time.monotonic() + 10
    answers: Counter[str] = Counter()

    async def one() -> None:
        while time.monotonic() < stop:
            try:
                async with ws_connect(url, compression=None, max_size=None,
                                      local_addr=("127.0.0.8", 0), open_timeout=5) as ws:
                    while time.monotonic() < stop:
                        await ws.send(p.encode([[p.AUTH, {"protocol": 1,
                                                          "token": token()}]]))
                        msg = p.decode(await asyncio.wait_for(ws.recv(), 20))[0]
                        answers[str(msg[1]) if msg[0] == p.AUTH_FAIL else "other"] += 1
            except Exception:  # refused, closed by the node: come back
                answers["closed"] += 1

    await asyncio.gather(*(one() for _ in range(48)))
    return dict(answers)


async def _bad_jwts(url: str) -> dict[str, Any]:
    return await _bad_logins(url, _stranger_jwts())


async def _bad_tokens(url: str) -> dict[str, Any]:
    return await _bad_logins(url, lambda: "not-a-token-" + "x" * 40)


async def _ds_pings(url: str) -> dict[str, Any]:
    """32 connections from 127.0.0.9 to /deepstream, each sending 9,000 CONNECTION PINGs
    in one frame before any login, back as soon as the node closes it, for 10 s."""
    pings = ds_wire.encode(ds_wire.DsMessage(ds_wire.T_CONNECTION, ds_wire.C_PING)) * 9000
    stop = time.monotonic() + 10
    seen: Counter[str] = Counter()

    async def one() -> None:
        while time.monotonic() < stop:
            try:
                async with ws_connect(url + "/deepstream", compression=None, max_size=None,
                                      local_addr=("127.0.0.9", 0), open_timeout=5) as ws:
                    await ws.send(pings)
                    while time.monotonic() < stop:
                        await asyncio.wait_for(ws.recv(), 20)
                        seen["answers"] += 1
            except Exception:  # refused, closed by the node: come back
                seen["closed"] += 1

    await asyncio.gather(*(one() for _ in range(32)))
    return dict(seen)


async def _conns(url: str) -> dict[str, Any]:
    held: list[Any] = []
    refused = 0
    for i in range(1500):   # every other one stops mid-handshake
        try:
            held.append(await asyncio.wait_for(
                handshake(url, local="127.0.0.7", finish=i % 2 == 0), 2))
        except (OSError, ConnectionError, TimeoutError, asyncio.IncompleteReadError):
            refused += 1
    await asyncio.sleep(2)
    for _, writer in held:
        writer.transport.abort()
    return {"upgrades_refused": refused, "of": 750}


async def _headers(url: str) -> dict[str, Any]:
    refused = 0
    for _ in range(200):
        try:
            _, writer = await asyncio.wait_for(
                handshake(url, extra=b"".join(b"X-Pad-%d: %s\r\n" % (i, b"a" * 1000)
                                              for i in range(64))), 5)
            writer.transport.abort()
        except (OSError, ConnectionError, TimeoutError, asyncio.IncompleteReadError):
            refused += 1
    return {"refused": refused}


ATTACKS: dict[str, Callable[[str], Any]] = {
    "cancel": _cancel, "ping_flood": _ping_flood, "pong_hoard": _pong_hoard,
    "logins": _logins, "bad_jwts": _bad_jwts, "bad_tokens": _bad_tokens,
    "ds_pings": _ds_pings, "conns": _conns, "headers": _headers,
}


def _attack_main(name: str, url: str, pipe: Any) -> None:
    pipe.send("ready")     # imported and started: the baseline runs with this process idle
    pipe.recv()
    t0, cpu0 = time.monotonic(), time.process_time()
    seen = asyncio.run(ATTACKS[name](url))
    seen["attacker_cpu"] = round((time.process_time() - cpu0) / (time.monotonic() - t0), 2)
    pipe.send(seen)


# -- the healthy side -------------------------------------------------------------------

class Caller:
    """Calls ``echo`` one call after another; latencies per phase."""

    def __init__(self, caller: Any) -> None:
        self.caller = caller
        self.latencies: list[float] = []
        self.wrong = 0

    async def run_for(self, seconds: float) -> list[float]:
        self.latencies = []
        end = time.monotonic() + seconds
        i = 0
        while time.monotonic() < end:
            i += 1
            t0 = time.perf_counter()
            try:
                if await self.caller.call("echo", i, timeout=30) != i:
                    self.wrong += 1
            except rpcbus.RpcError:
                self.wrong += 1
            self.latencies.append(time.perf_counter() - t0)
        return self.latencies


def _summary(lat: list[float]) -> tuple[float, float, float]:
    lat = sorted(lat)
    return (statistics.median(lat) * 1e3, lat[int(len(lat) * 0.99)] * 1e3, lat[-1] * 1e3)


async def _password_logins(url: str, users: range) -> float:
    """The median time of password logins, each by a user not logged in before (no
    cached check)."""
    times = []
    for i in users:
        t0 = time.perf_counter()
        async with rpcbus.connect(url, user=f"pw{i}", password="right", open_timeout=30):
            times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


async def _until(recv: Any) -> Any:
    return await asyncio.to_thread(recv.recv)


async def _run(cluster: LocalCluster, names: list[str], quiet_s: float,
               rounds: int) -> None:
    n1, n2 = cluster.nodes
    node1 = psutil.Process(n1.proc.pid)  # type: ignore[union-attr]
    async with rpcbus.connect(n2.url, token=TOKENS["worker"]) as prov, \
            rpcbus.connect(n1.url, token=TOKENS["caller"]) as conn:
        await prov.provide("echo", lambda d: d)
        caller = Caller(conn)
        await caller.run_for(1.0)  # warm
        print(f"{'phase':<22}{'calls':>7}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}"
              f"{'p99 / quiet':>13}  notes")
        for name in names:
            ratios = [await _window(caller, n1.url, node1, name, quiet_s, r)
                      for r in range(rounds)]
            if rounds > 1:
                print(f"{name}: p99 / quiet over {rounds} alternating windows: median "
                      f"{statistics.median(ratios):.2f}x (min {min(ratios):.2f}x, "
                      f"max {max(ratios):.2f}x)")
        print(f"wrong or failed answers: {caller.wrong}")


async def _window(caller: Caller, url: str, node1: psutil.Process, name: str,
                  quiet_s: float, round_: int) -> float:
    """One quiet window, then one of attack ``name``; prints both; returns the healthy
    caller's p99 during the attack over its p99 in the quiet window just before."""
    pipe, child_end = multiprocessing.Pipe()
    child = multiprocessing.get_context("spawn").Process(
        target=_attack_main, args=(name, url, child_end), daemon=True)
    child.start()
    await _until(pipe)
    notes, fresh = "", 6 * round_  # users not logged in before: no cached check
    if name == "logins":
        notes = f"login alone {await _password_logins(url, range(fresh, fresh + 3)):.0f} ms"
    quiet = _summary(await caller.run_for(quiet_s))
    rss0 = node1.memory_info().rss
    cpu0 = sum(node1.cpu_times()[:2])
    pipe.send("go")
    t0 = time.monotonic()
    if name == "logins":
        await asyncio.sleep(1.0)
        alone = await _password_logins(url, range(fresh + 3, fresh + 6))
        notes += f", under the flood {alone:.0f} ms"
    lat: list[float] = []
    while (not pipe.poll() and child.is_alive()) or time.monotonic() - t0 < quiet_s:
        lat += await caller.run_for(0.25)
    seen = pipe.recv() if pipe.poll() else {"attack": "failed: see its traceback"}
    child.join()
    rss = (node1.memory_info().rss - rss0) / 2**20
    node_cpu = (sum(node1.cpu_times()[:2]) - cpu0) / (time.monotonic() - t0)
    during = _summary(lat)
    print(f"{name + ' (quiet)':<22}{'':>7}{quiet[0]:9.2f}{quiet[1]:9.2f}{quiet[2]:9.2f}")
    print(f"{name:<22}{len(lat):7d}{during[0]:9.2f}{during[1]:9.2f}{during[2]:9.2f}"
          f"{during[1] / quiet[1]:12.2f}x  {notes} n1 CPU {node_cpu:.2f}, "
          f"RSS {rss:+.0f} MB {json.dumps(seen)}")
    return during[1] / quiet[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default=",".join(ATTACKS), help="attacks, comma-separated")
    ap.add_argument("--quiet", type=float, default=3.0, help="seconds of baseline per attack")
    ap.add_argument("--rounds", type=int, default=1,
                    help="quiet and attack windows in turn, this many of each per attack")
    args = ap.parse_args()
    names = [n for n in args.only.split(",") if n]
    unknown = set(names) - set(ATTACKS)
    if unknown:
        raise SystemExit(f"unknown attacks {sorted(unknown)}; choose from {sorted(ATTACKS)}")
    key = new_key()
    folder = tempfile.mkdtemp(prefix="rpcbus-attacks-")
    keys = {}
    for label in ("current", "next"):  # two token keys, as while rotating
        keys[label] = os.path.join(folder, f"{label}.pub")
        with open(keys[label], "wb") as f:
            f.write(ed25519.Ed25519PrivateKey.generate().public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    cluster = LocalCluster(nodes=2, env={
        "RPCBUS_AUTH_MODE": "users", "RPCBUS_AUTH_USERS": json.dumps(USERS),
        "RPCBUS_AUTH_TOKEN_KEYS": json.dumps(keys), "RPCBUS_DEEPSTREAM_ENABLED": "true",
        "RPCBUS_CLUSTER_SEAL": "sign", "RPCBUS_CLUSTER_KEY_ID": "k1",
        "RPCBUS_CLUSTER_KEYS": json.dumps({"k1": key})}).start()
    try:
        asyncio.run(_run(cluster, names, args.quiet, min(max(1, args.rounds), MAX_ROUNDS)))
    finally:
        cluster.stop()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
