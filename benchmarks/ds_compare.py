"""deepstream's own client against deepstream 7 itself and against an rpcbus node, on
one shape: calls per second, and the server's CPU per call.

    ./dev ds-bench                                 # installs what it needs, then:
    python -m rpcbus.benchmarks.ds_compare [--calls 20000] [--callers 4] [--inflight 50]
                                           [--rounds 3] [--payload 64]

Both servers run on this machine, one after the other in each round, with the same
clients (benchmarks/deepstream/peer.js: ``@deepstream/client`` 7.0.5 from npm): one
provider answering an echo, ``--callers`` processes each making ``--calls`` calls
with ``--inflight`` under way at once (deepstream's shape: 4 x 50). The server is
deepstream 7.0.2 (benchmarks/deepstream/server.js, no auth, no permissions) or one
``rpcbus node --deepstream`` (auth off). CPU per call is the server process's user
and system time over the calls (psutil) divided by the calls. Each round prints
both, and the medians end with rpcbus ÷ deepstream; every client, the provider and
the server share this machine's cores, so the figures are of this machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

PEERS = Path(__file__).resolve().parent / "deepstream"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class _Peer:
    """One peer.js process (see its header for the commands)."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self._n = 0

    async def ask(self, op: str, **fields: Any) -> Any:
        self._n += 1
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"id": self._n, "op": op, **fields}).encode() + b"\n")
        while True:
            line = json.loads(await self.proc.stdout.readline())
            if line.get("id") == self._n:
                if "error" in line:
                    raise RuntimeError(f"{op}: {line['error']}")
                return line["ok"]

    async def stop(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        await self.proc.wait()


async def _peer(url: str) -> _Peer:
    proc = await asyncio.create_subprocess_exec(
        "node", str(PEERS / "peer.js"), cwd=str(PEERS), stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=subprocess.DEVNULL)
    peer = _Peer(proc)
    logged_in = await peer.ask("connect", url=url, login={})
    if not logged_in["ok"]:
        raise RuntimeError(f"login to {url} refused: {logged_in}")
    return peer


async def _measure(url: str, pid: int, args: argparse.Namespace) -> dict[str, float]:
    import psutil

    server = psutil.Process(pid)
    provider = await _peer(url)
    callers = [await _peer(url) for _ in range(args.callers)]
    data = "x" * args.payload
    try:
        await provider.ask("provide", name="bench.echo", kind="echo")
        for _ in range(100):  # until the name is routable, then warm both ends up
            try:
                await callers[0].ask("make", name="bench.echo", data=data)
                break
            except RuntimeError:
                await asyncio.sleep(0.05)
        await asyncio.gather(*(c.ask("load", name="bench.echo", calls=500,
                                     inflight=args.inflight, data=data) for c in callers))
        cpu0 = server.cpu_times()
        started = time.perf_counter()
        results = await asyncio.gather(*(c.ask("load", name="bench.echo", calls=args.calls,
                                               inflight=args.inflight, data=data)
                                         for c in callers))
        wall = time.perf_counter() - started
        cpu1 = server.cpu_times()
    finally:
        for peer in (provider, *callers):
            await peer.stop()
    calls = sum(r["calls"] for r in results)
    failed = sum(r["errors"] for r in results)
    if failed:
        first = next(r["firstError"] for r in results if r["errors"])
        print(f"  {failed} of {calls} calls failed (first: {first})", file=sys.stderr)
    cpu = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
    return {"calls_per_s": calls / wall, "cpu_us_per_call": cpu / calls * 1e6,
            "failed": failed}


async def _deepstream(args: argparse.Namespace) -> dict[str, float]:
    port = _free_port()
    proc = await asyncio.create_subprocess_exec(
        "node", str(PEERS / "server.js"), str(port), cwd=str(PEERS),
        stdout=asyncio.subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert proc.stdout is not None
        async with asyncio.timeout(30):
            while (await proc.stdout.readline()).strip() != b"started":
                pass
        return await _measure(f"ws://127.0.0.1:{port}/deepstream", proc.pid, args)
    finally:
        proc.terminate()
        await proc.wait()


async def _rpcbus(args: argparse.Namespace) -> dict[str, float]:
    from rpcbus.broker.process import NodeProcess

    node = NodeProcess("--deepstream", env={"RPCBUS_AUTH_MODE": "none"})
    await asyncio.to_thread(node.start)
    try:
        return await _measure(node.url + "/deepstream", node.pid, args)
    finally:
        await asyncio.to_thread(node.stop)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20000, help="calls per caller")
    parser.add_argument("--callers", type=int, default=4, help="caller processes")
    parser.add_argument("--inflight", type=int, default=50, help="calls under way per caller")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of both servers")
    parser.add_argument("--payload", type=int, default=64, help="characters per call's data")
    parser.add_argument("--only", choices=("deepstream", "rpcbus"), default=None,
                        help="run one server only (to profile it)")
    args = parser.parse_args()
    if shutil.which("node") is None or not (PEERS / "node_modules" / "@deepstream").is_dir():
        sys.exit("ds_compare: needs Node.js and deepstream's packages: run ./dev ds-bench "
                 "(it installs them), or npm ci in benchmarks/deepstream")
    rows: dict[str, list[dict[str, float]]] = {"deepstream 7.0.2": [], "rpcbus": []}
    for i in range(args.rounds):
        for label, run in (("deepstream 7.0.2", _deepstream), ("rpcbus", _rpcbus)):
            if args.only is not None and not label.startswith(args.only):
                continue
            got = asyncio.run(run(args))
            rows[label].append(got)
            print(f"round {i + 1} {label:17} {got['calls_per_s']:9,.0f} calls/s "
                  f"{got['cpu_us_per_call']:7.1f} µs server CPU per call", flush=True)
    if args.only is not None:
        return
    med = {label: {k: statistics.median(r[k] for r in runs) for k in runs[0]}
           for label, runs in rows.items()}
    ds, rb = med["deepstream 7.0.2"], med["rpcbus"]
    print(f"\nmedians of {args.rounds} rounds, {args.callers} callers x {args.inflight} in "
          f"flight, {args.calls} calls each, {args.payload}-character data:")
    for label, m in med.items():
        print(f"  {label:17} {m['calls_per_s']:9,.0f} calls/s "
              f"{m['cpu_us_per_call']:7.1f} µs server CPU per call")
    print(f"  rpcbus ÷ deepstream: {rb['calls_per_s'] / ds['calls_per_s']:.2f}x calls/s, "
          f"{rb['cpu_us_per_call'] / ds['cpu_us_per_call']:.2f}x CPU per call")


if __name__ == "__main__":
    main()
