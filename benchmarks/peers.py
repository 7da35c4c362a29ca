"""What users would pick instead, measured with the same callers' shape: ``--compare``.

Two peers, each a responder process and caller processes that behave like
benchmarks/workers.py's caller (same in-flight count, payload, measured window,
cap and JSON line at the end), so load.run_callers aggregates them alike:

- ``redis``: raw Redis pub/sub request/reply between Python processes through
  redis-py (hiredis), batched like rpcbus's bus: a caller publishes the
  requests it has ready as one msgpack batch to ``bench:req``; the responder
  answers everything it read in one pass with one PUBLISH per caller. The floor
  cost of the Redis hop rpcbus's cross-node path pays twice.
- ``nats``: NATS request/reply through nats-py (``nc.request`` per call, a
  queue-group responder with ``msg.respond``), against a ``nats-server`` this
  harness starts on a free loopback port.

Roles: ``python -m rpcbus.benchmarks.peers
{redis-responder,redis-caller,nats-responder,nats-caller}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from typing import Any

import msgpack

REQ = "bench:req"
BIN = 0.5  # s: the callers count answers per BIN of the window (throughput series)


class _Tally:
    """The caller's counts over [start, end), in workers.py's caller output format."""

    def __init__(self, args: argparse.Namespace, t0: float) -> None:
        self.start, self.end = t0 + args.warmup, t0 + args.warmup + args.duration
        self.cap, self.sample_every = args.max_calls, args.sample_every
        self.measured = self.total = 0
        self.last_measured = self.start
        self.errors: dict[str, int] = {}
        self.latencies_us: list[int] = []
        # answers per half-second of the window (the peers' throughput series: they have
        # no /stats to read it from)
        self.bins = [0] * max(1, int(args.duration / BIN + 0.999))

    def ended(self, sent: float, now: float, error: str | None = None) -> None:
        self.total += 1
        if error is not None:
            self.errors[error] = self.errors.get(error, 0) + 1
        elif self.start <= now < self.end:
            self.measured += 1
            self.last_measured = now
            self.bins[min(len(self.bins) - 1, int((now - self.start) / BIN))] += 1
            if self.measured % self.sample_every == 0:
                self.latencies_us.append(int((now - sent) * 1e6))

    def more(self, now: float) -> bool:
        return now < self.end and self.total < self.cap

    def report(self, duration: float, unanswered: int) -> None:
        capped = self.total >= self.cap
        print(json.dumps({"measured": self.measured, "capped": capped,
                          "span": (self.last_measured - self.start) if capped else duration,
                          "total": self.total, "errors": self.errors,
                          "unanswered": unanswered, "latencies_us": self.latencies_us,
                          "sample_every": self.sample_every, "bins": self.bins}), flush=True)


async def _start_at(args: argparse.Namespace) -> float:
    await asyncio.sleep(max(0.0, args.start_at - time.time()))
    return time.perf_counter()


# -- raw Redis ------------------------------------------------------------------------

async def redis_responder(args: argparse.Namespace) -> None:
    import redis.asyncio as aioredis

    sub = aioredis.Redis.from_url(args.url)
    pub = aioredis.Redis.from_url(args.url)
    pubsub = sub.pubsub()
    await pubsub.subscribe(REQ)
    print(json.dumps({"ready": True}), flush=True)
    while True:
        out: dict[bytes, list[Any]] = {}
        msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
        while msg is not None:                       # everything already read: one pass
            reply_to, calls = msgpack.unpackb(msg["data"])
            out.setdefault(reply_to, []).extend(calls)
            msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0)
        if out:
            async with pub.pipeline(transaction=False) as pipe:
                for reply_to, calls in out.items():
                    pipe.publish(reply_to, msgpack.packb(calls))
                await pipe.execute()


async def redis_caller(args: argparse.Namespace) -> None:
    import redis.asyncio as aioredis

    inbox = f"bench:rep:{uuid.uuid4().hex}"
    sub = aioredis.Redis.from_url(args.url)
    pub = aioredis.Redis.from_url(args.url)
    pubsub = sub.pubsub()
    await pubsub.subscribe(inbox)
    payload = os.urandom(args.payload)
    sent: dict[int, float] = {}
    next_id = 0
    t0 = await _start_at(args)
    tally = _Tally(args, t0)

    def batch(n: int, now: float) -> bytes | None:
        nonlocal next_id
        calls = []
        for _ in range(n):
            if not tally.more(now):
                break
            next_id += 1
            sent[next_id] = now
            calls.append([next_id, payload])
        return msgpack.packb([inbox, calls]) if calls else None

    first = batch(args.inflight * args.conns, time.perf_counter())
    if first:
        await pub.publish(REQ, first)
    async with asyncio.timeout(args.warmup + args.duration + 15):
        while sent:
            msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
            if msg is None:
                continue
            now = time.perf_counter()
            done = 0
            for call_id, _ in msgpack.unpackb(msg["data"]):
                started = sent.pop(call_id, None)
                if started is not None:
                    tally.ended(started, now)
                    done += 1
            nxt = batch(done, now)
            if nxt:
                await pub.publish(REQ, nxt)
    tally.report(args.duration, len(sent))


# -- NATS -----------------------------------------------------------------------------

async def nats_responder(args: argparse.Namespace) -> None:
    import nats

    nc = await nats.connect(args.url)

    async def echo(msg: Any) -> None:
        await msg.respond(msg.data)

    await nc.subscribe("bench.echo", queue="echo", cb=echo)
    print(json.dumps({"ready": True}), flush=True)
    await asyncio.Event().wait()


async def nats_caller(args: argparse.Namespace) -> None:
    import nats
    from nats.errors import TimeoutError as NatsTimeout

    nc = await nats.connect(args.url)
    payload = os.urandom(args.payload)
    t0 = await _start_at(args)
    tally = _Tally(args, t0)
    in_flight = 0

    async def worker() -> None:
        nonlocal in_flight
        while tally.more(time.perf_counter()):
            started = time.perf_counter()
            in_flight += 1
            try:
                await nc.request("bench.echo", payload, timeout=10)
                tally.ended(started, time.perf_counter())
            except NatsTimeout:
                tally.ended(started, time.perf_counter(), "TIMEOUT")
            finally:
                in_flight -= 1

    await asyncio.gather(*(worker() for _ in range(args.inflight * args.conns)))
    tally.report(args.duration, in_flight)
    await nc.close()


# -- driver ---------------------------------------------------------------------------

class Peer:
    """The broker of a peer (redis-server or nats-server) and its responders."""

    def __init__(self, kind: str, responders: int) -> None:
        from rpcbus.broker.local import RedisServer, free_port, wait_for_server

        self.kind = kind
        self.procs: list[subprocess.Popen[Any]] = []
        if kind == "redis":
            self.server: Any = RedisServer().start()
            self.url, self.pid = self.server.url, self.server.proc.pid
        else:
            exe = shutil.which("nats-server") or (
                "/usr/sbin/nats-server" if os.path.exists("/usr/sbin/nats-server") else None)
            if exe is None:
                raise RuntimeError("nats-server is not installed (./dev bench installs it)")
            port = free_port()
            self.server = subprocess.Popen([exe, "-a", "127.0.0.1", "-p", str(port)],
                                           stdout=subprocess.DEVNULL,
                                           stderr=subprocess.DEVNULL)
            self.url, self.pid = f"nats://127.0.0.1:{port}", self.server.pid
            wait_for_server(self.server, port, say=b"", answers=(b"INFO",),
                            name="nats-server")  # it greets with INFO
        for _ in range(responders):
            proc = subprocess.Popen([sys.executable, "-m", "rpcbus.benchmarks.peers",
                                     f"{kind}-responder", "--url", self.url],
                                    stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
            self.procs.append(proc)
            assert json.loads(proc.stdout.readline()) == {"ready": True}

    def stop(self) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait()
        if self.kind == "redis":
            self.server.stop()
        else:
            self.server.kill()
            self.server.wait()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m rpcbus.benchmarks.peers")
    ap.add_argument("role", choices=["redis-responder", "redis-caller", "nats-responder",
                                     "nats-caller"])
    ap.add_argument("--url", required=True)
    for flag, default in (("--conns", 1), ("--inflight", 50), ("--payload", 16),
                          ("--max-calls", 5_000_000), ("--sample-every", 1)):
        ap.add_argument(flag, type=int, default=default)
    for flag, default in (("--duration", 5.0), ("--warmup", 1.0), ("--start-at", 0.0)):
        ap.add_argument(flag, type=float, default=default)
    ap.add_argument("--rpc", default="bench.echo")   # accepted for the common caller flags
    args = ap.parse_args(argv)
    from rpcbus.broker.cli import use_uvloop

    use_uvloop(True)
    role = {"redis-responder": redis_responder, "redis-caller": redis_caller,
            "nats-responder": nats_responder, "nats-caller": nats_caller}[args.role]
    asyncio.run(role(args))


if __name__ == "__main__":
    main()
