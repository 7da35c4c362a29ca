"""Load-generator processes: a lean caller, an SDK caller, an SDK provider, and a direct
echo server (on rpcbus's WebSocket stack, or on picows' for comparison).

Each runs as ``python -m rpcbus.benchmarks.workers ROLE ...`` in its own process, so
the load generator never competes with the node inside one interpreter. A
caller prints one JSON line with its counts and latency sample at the end.

The caller keeps W calls in flight per connection without a Task or future per
call: each RESPONSE immediately sends the next REQUEST from the frame
callback (like wrk's pipelining), so the figures measure the node, not the
caller's own overhead.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from typing import Any

import rpcbus
from rpcbus import protocol as p
from rpcbus.broker.cli import use_uvloop
from rpcbus.broker.logs import configure
from rpcbus.websocket import ClientConnection, ServerConnection, dial


class _CallerWire(ClientConnection):
    run: "CallerRun | StreamRun | _AuthWaiter"

    def frame_received(self, data: bytes) -> None:
        self.run.on_frame(self, data)


class CallerRun:
    """Counts and samples calls over [start, end); stops sending at ``stop_at`` or the cap."""

    def __init__(self, rpc: str, payload: bytes, start: float, end: float, cap: int,
                 sample_every: int) -> None:
        self.rpcs, self.payload = rpc.split(","), payload   # names, called in turn
        self.start, self.end, self.cap = start, end, cap
        self.sample_every = sample_every
        self.sent_at: dict[int, float] = {}
        self.next_id = 0
        self.measured = 0
        self.last_measured = start  # when the last measured call ended (the cap may end early)
        self.total = 0
        self.errors: dict[str, int] = {}
        self.latencies_us: list[int] = []
        self.done = asyncio.Event()

    def send_one(self, wire: _CallerWire, now: float) -> None:
        if now >= self.end or self.total >= self.cap:
            if not self.sent_at:
                self.done.set()
            return
        self.next_id += 1
        self.sent_at[self.next_id] = now
        rpcs = self.rpcs
        wire.send([p.REQUEST, self.next_id, rpcs[self.next_id % len(rpcs)] if len(rpcs) > 1
                   else rpcs[0], self.payload, 10_000])

    def on_frame(self, wire: _CallerWire, data: bytes) -> None:
        now = time.perf_counter()
        for msg in p.decode(data):
            kind = msg[0]
            if kind not in (p.RESPONSE, p.ERROR):
                continue
            sent = self.sent_at.pop(msg[1], None)
            if sent is None:
                continue
            self.total += 1
            if kind == p.ERROR:
                self.errors[msg[2]] = self.errors.get(msg[2], 0) + 1
            elif self.start <= now < self.end:
                self.measured += 1
                self.last_measured = now
                if self.measured % self.sample_every == 0:
                    self.latencies_us.append(int((now - sent) * 1e6))
            self.send_one(wire, now)


class StreamRun:
    """``--stream W``: each of the W-window streams in flight reads the provider's endless
    ``<rpc>.parts`` (its payload, again and again), telling the parts read (CREDIT) every
    half window;
    parts are counted as calls are (no latency: a part answers no request). At the end
    every stream is cancelled."""

    def __init__(self, rpc: str, payload: bytes, start: float, end: float, cap: int,
                 window: int, timeout_ms: int) -> None:
        self.rpc, self.payload = rpc.split(",")[0] + ".parts", payload
        self.start, self.end, self.cap = start, end, cap
        self.window, self.timeout_ms = window, timeout_ms
        self.read: dict[int, int] = {}   # open streams: parts read
        self.wires: dict[int, _CallerWire] = {}
        self.next_id = 0
        self.measured = self.total = 0
        self.last_measured = start
        self.errors: dict[str, int] = {}
        self.latencies_us: list[int] = []
        self.sample_every = 1
        self.sent_at = self.read  # what is still open at the end ("unanswered")
        self.done = asyncio.Event()

    def send_one(self, wire: _CallerWire, now: float) -> None:
        if now >= self.end or self.total >= self.cap:
            self.finish()
            return
        self.next_id += 1
        self.read[self.next_id] = 0
        self.wires[self.next_id] = wire
        wire.send([p.STREAM, self.next_id, self.rpc, self.payload, self.timeout_ms,
                   {"window": self.window}])

    def finish(self) -> None:
        if self.done.is_set():
            return
        for sid, wire in self.wires.items():
            wire.send([p.CANCEL, sid])
        self.read.clear()
        self.done.set()

    def on_frame(self, wire: _CallerWire, data: bytes) -> None:
        now = time.perf_counter()
        read, half = self.read, (self.window + 1) // 2
        for msg in p.decode(data):
            kind = msg[0]
            if kind == p.PART:
                n = read.get(msg[1])
                if n is None:
                    continue
                self.total += 1
                if self.start <= now < self.end:
                    self.measured += 1
                    self.last_measured = now
                n += 1
                if n % half == 0:  # every half window: the parts read in all
                    wire.send([p.CREDIT, msg[1], n])
                read[msg[1]] = n
            elif kind in (p.RESPONSE, p.ERROR) and read.pop(msg[1], None) is not None:
                del self.wires[msg[1]]
                if kind == p.ERROR:
                    self.errors[msg[2]] = self.errors.get(msg[2], 0) + 1
                self.send_one(wire, now)
        if now >= self.end or self.total >= self.cap:
            self.finish()


async def run_caller(args: argparse.Namespace) -> None:
    wires = []
    for _ in range(args.conns):
        wire = await dial(_CallerWire, args.url)
        wire.max_size = None
        wires.append(wire)
    loop = asyncio.get_running_loop()
    for wire in wires:  # AUTH, then wait for AUTH_OK through the plain path below
        fut = loop.create_future()
        wire.run = _AuthWaiter(fut)
        wire.send([p.AUTH, {"protocol": p.PROTOCOL_VERSION, "name": "bench-caller"}])
        await fut
    # Wall clock to agree with the other processes on when to start; then perf_counter.
    await asyncio.sleep(max(0.0, args.start_at - time.time()))
    t0 = time.perf_counter()
    run: CallerRun | StreamRun
    if args.stream:
        run = StreamRun(args.rpc, os.urandom(args.payload), t0 + args.warmup,
                        t0 + args.warmup + args.duration, args.max_calls, args.stream,
                        int(min(300.0, args.warmup + args.duration + 15) * 1000))
    else:
        run = CallerRun(args.rpc, os.urandom(args.payload), t0 + args.warmup,
                        t0 + args.warmup + args.duration, args.max_calls, args.sample_every)
    for wire in wires:
        wire.run = run
        for _ in range(args.inflight):
            run.send_one(wire, t0)
    try:
        async with asyncio.timeout(args.warmup + args.duration + 15):
            await run.done.wait()
    except TimeoutError:
        pass
    capped = run.total >= run.cap
    span = (run.last_measured - run.start) if capped else args.duration
    print(json.dumps({"measured": run.measured, "span": span, "capped": capped,
                      "total": run.total, "errors": run.errors,
                      "unanswered": len(run.sent_at), "latencies_us": run.latencies_us,
                      "sample_every": run.sample_every}), flush=True)


async def run_sdk_caller(args: argparse.Namespace) -> None:
    """The caller's load and JSON line through the Python SDK (``rpcbus.connect`` and
    ``call``), as an application would: the SDK's own cost is part of the figures
    (benchmarks/sdks.py sets it beside the JS SDK's)."""
    clients = [await rpcbus.connect(args.url, name="bench-sdk-caller", ping_interval=None)
               for _ in range(args.conns)]
    payload, rpcs = os.urandom(args.payload), args.rpc.split(",")
    await asyncio.sleep(max(0.0, args.start_at - time.time()))
    t0 = time.perf_counter()
    start, end = t0 + args.warmup, t0 + args.warmup + args.duration
    tally = {"measured": 0, "total": 0, "started": 0, "last": start}
    errors: dict[str, int] = {}
    latencies: list[int] = []

    async def lane(client: rpcbus.Client) -> None:
        while (sent := time.perf_counter()) < end and tally["started"] < args.max_calls:
            tally["started"] += 1
            try:
                await client.call(rpcs[tally["started"] % len(rpcs)], payload, timeout=10)
            except rpcbus.RpcError as exc:
                errors[exc.code] = errors.get(exc.code, 0) + 1
            else:
                now = time.perf_counter()
                if start <= now < end:
                    tally["measured"] += 1
                    tally["last"] = now
                    if tally["measured"] % args.sample_every == 0:
                        latencies.append(int((now - sent) * 1e6))
            tally["total"] += 1

    await asyncio.gather(*(lane(c) for c in clients for _ in range(args.inflight)))
    capped = tally["total"] >= args.max_calls
    print(json.dumps({"measured": tally["measured"], "capped": capped,
                      "span": (tally["last"] - start) if capped else args.duration,
                      "total": tally["total"], "errors": errors,
                      "unanswered": tally["started"] - tally["total"],
                      "latencies_us": latencies, "sample_every": args.sample_every}), flush=True)
    for c in clients:
        await c.close()


class _AuthWaiter:
    def __init__(self, fut: asyncio.Future[None]) -> None:
        self.fut = fut

    def on_frame(self, wire: Any, data: bytes) -> None:
        for msg in p.decode(data):
            if msg[0] == p.AUTH_OK and not self.fut.done():
                self.fut.set_result(None)


async def run_provider(args: argparse.Namespace) -> None:
    """An echo provider on one or several (comma-separated) URLs; with ``--record FILE``
    it appends every call's data to FILE as it runs it (unbuffered: a SIGKILL loses none),
    and ``{"cancelled": data}`` for a call the node cancelled while it ran.
    ``--work S`` makes each call take S seconds in the handler ``--handler`` names:
    ``async`` (awaits), ``def`` (a plain function that blocks: the SDK runs it in a worker
    thread) or ``spin`` (an ``async def`` that holds the event loop, CPU-bound).
    On SIGTERM it prints ``{"served": N}``, the calls it ran, and exits."""
    fd = os.open(args.record, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) \
        if args.record else -1
    work = args.work
    served = [0]

    def record(data: Any) -> None:
        served[0] += 1
        if fd >= 0:
            os.write(fd, json.dumps(data).encode() + b"\n")

    async def echo(data: Any) -> Any:
        record(data)
        if work:
            try:
                await asyncio.sleep(work)
            except asyncio.CancelledError:  # the node cancelled it: recorded as such
                record({"cancelled": data})
                raise
        return data

    def blocking(data: Any) -> Any:
        record(data)
        time.sleep(work)
        return data

    async def spin(data: Any) -> Any:
        record(data)
        until = time.monotonic() + work
        while time.monotonic() < until:
            pass
        return data

    async def parts(data: Any) -> Any:  # ``<rpc>.parts``: the data, again and again
        while True:
            yield data

    handler = {"async": echo, "def": blocking, "spin": spin}[args.handler]
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with rpcbus.connect(args.url.split(","), name="bench-provider",
                               ping_interval=None) as c:
        for name in args.rpc.split(","):
            await c.provide(name, handler)
            await c.provide(f"{name}.parts", parts)
        print(json.dumps({"ready": True}), flush=True)
        await stop.wait()  # until SIGTERM (then the calls it ran), or killed
    print(json.dumps({"served": served[0]}), flush=True)


class _EchoSession(ServerConnection):
    """The baseline: answers every REQUEST itself, on the same I/O stack, with no routing."""

    max_size = None

    def frame_received(self, data: bytes) -> None:
        for msg in p.decode(data):
            if msg[0] == p.REQUEST:
                self.send([p.RESPONSE, msg[1], msg[3]])
            elif msg[0] == p.AUTH:
                self.send([p.AUTH_OK, {"node": "echo", "session": "e"}])


def _picows_echo() -> Any:
    """The same echo on picows (a Cython WebSocket library), for benchmarks/ws_stack.py:
    what the I/O stack alone costs when it is compiled."""
    from picows import WSListener, WSMsgType

    class Echo(WSListener):  # type: ignore[misc]
        def on_ws_connected(self, transport: Any) -> None:
            self.transport = transport
            self.out: list[Any] = []

        def on_ws_frame(self, transport: Any, frame: Any) -> None:
            if frame.msg_type == WSMsgType.BINARY:
                for msg in p.decode(frame.get_payload_as_bytes()):
                    if msg[0] == p.REQUEST:
                        self.send([p.RESPONSE, msg[1], msg[3]])
                    elif msg[0] == p.AUTH:
                        self.send([p.AUTH_OK, {"node": "echo", "session": "e"}])
            elif frame.msg_type == WSMsgType.CLOSE:
                transport.send_close(frame.get_close_code())
                transport.disconnect()

        def send(self, msg: list[Any]) -> None:
            self.out.append(msg)
            if len(self.out) == 1:
                asyncio.get_running_loop().call_soon(self.flush)

        def flush(self) -> None:
            out, self.out = self.out, []
            self.transport.send(WSMsgType.BINARY, p.encode(out))
    return Echo


async def run_echo(args: argparse.Namespace) -> None:
    if args.stack == "picows":
        from picows import ws_create_server
        server = await ws_create_server(lambda _request: _picows_echo()(), "127.0.0.1", 0,
                                        max_frame_size=1 << 30)
    else:
        server = await asyncio.get_running_loop().create_server(_EchoSession, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    print(json.dumps({"url": f"ws://127.0.0.1:{port}"}), flush=True)
    await asyncio.Event().wait()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m rpcbus.benchmarks.workers")
    ap.add_argument("role", choices=["caller", "sdk-caller", "provider", "echo"])
    ap.add_argument("--url", default="")
    ap.add_argument("--rpc", default="bench.echo", help="rpc name(s), comma-separated")
    ap.add_argument("--conns", type=int, default=1)
    ap.add_argument("--inflight", type=int, default=50)
    ap.add_argument("--payload", type=int, default=16)
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--max-calls", type=int, default=10_000_000)
    ap.add_argument("--sample-every", type=int, default=4)
    ap.add_argument("--start-at", type=float, default=0.0)
    ap.add_argument("--record", default="", help="provider: append each call's data here")
    ap.add_argument("--work", type=float, default=0.0, help="provider: seconds per call")
    ap.add_argument("--stack", choices=["rpcbus", "picows"], default="rpcbus",
                    help="echo: the WebSocket stack it runs on")
    ap.add_argument("--stream", type=int, default=0,
                    help="caller: read streams of this window instead of calling")
    ap.add_argument("--handler", choices=["async", "def", "spin"], default="async",
                    help="provider: how the handler spends --work (see run_provider)")
    args = ap.parse_args(argv)
    use_uvloop(True)
    configure("warning", "json")  # stdout carries the results: logs go to stderr
    role = {"caller": run_caller, "sdk-caller": run_sdk_caller, "provider": run_provider,
            "echo": run_echo}[args.role]
    try:
        asyncio.run(role(args))
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
