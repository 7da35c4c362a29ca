"""``rpcbus demo``: a 3-node cluster on an embedded Redis, calls crossing nodes, a clean stop."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable

import rpcbus
from rpcbus.broker.local import LocalCluster


def _say(text: str) -> None:
    print(text, flush=True)


async def run_demo(calls: int) -> int:
    """Returns the exit code: 0 when every step did what it should."""
    _say("starting redis-server and 3 nodes (their bus signed with a key made now) ...")
    cluster = await asyncio.to_thread(LocalCluster(nodes=3, seal=True).start)
    n1, n2, n3 = cluster.nodes
    for node in cluster.nodes:
        _say(f"  node {node.name} serves {node.url}")
    ok = False
    try:
        async with rpcbus.connect(n1.url, name="adder@n1") as p1, \
                rpcbus.connect(n2.url, name="adder@n2") as p2, \
                rpcbus.connect(n2.url, name="greeter@n2") as p3, \
                rpcbus.connect(n3.url, name="caller@n3") as c3, \
                rpcbus.connect(n1.url, name="caller@n1") as c1:

            def adder(where: str) -> Callable[[dict[str, int]], dict[str, Any]]:
                return lambda data: {"sum": data["a"] + data["b"], "served_by": where}

            async def greet(data: dict[str, str], ctx: rpcbus.CallContext) -> str:
                await asyncio.sleep(0.01)  # an awaiting handler: ACCEPT travels first
                return f"hello {data['name']}, you are {ctx.caller}"

            await p1.provide("math.add", adder("adder@n1"))
            await p2.provide("math.add", adder("adder@n2"))
            await p3.provide("demo.greet", greet)
            _say("math.add is provided on n1 and n2, demo.greet on n2; callers sit on n3 and n1")
            for i in range(calls):
                t0 = time.perf_counter()
                r = await c3.call("math.add", {"a": i, "b": 10 * i}, timeout=5)
                _say(f"  caller@n3 -> math.add({i}, {10 * i}) = {r['sum']:<4} served by "
                     f"{r['served_by']:<9} [{(time.perf_counter() - t0) * 1e3:.2f} ms]")
            _say("  caller@n1 -> " + await c1.call("demo.greet", {"name": "newcomer"}, timeout=5))
            try:
                await c3.call("nobody.provides.this", timeout=5)
            except rpcbus.RpcError as exc:
                _say(f"  an rpc nobody provides fails cleanly: {exc.code}")
            t0 = time.perf_counter()
            results = await asyncio.gather(*(c3.call("math.add", {"a": i, "b": 1}, timeout=30)
                                             for i in range(10_000)))
            elapsed = time.perf_counter() - t0
            ok = [r["sum"] for r in results] == [i + 1 for i in range(10_000)]
            share = sum(r["served_by"] == "adder@n1" for r in results) / 10_000
            _say(f"  10,000 concurrent calls from n3: {'all correct' if ok else 'WRONG ANSWERS'} "
                 f"in {elapsed:.2f} s; {share:.0%} served on n1, {1 - share:.0%} on n2")
    finally:
        codes = await asyncio.to_thread(cluster.stop)
    _say("stopped: " + ", ".join(f"{n} exit {c}" for n, c in codes.items()))
    return 0 if ok and all(c == 0 for c in codes.values()) else 1
