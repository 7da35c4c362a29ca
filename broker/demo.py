"""``rpcbus demo``: one node, one provider, a caller, visible output, a clean stop."""

from __future__ import annotations

import asyncio
import time

import clients

from .process import NodeProcess


def _say(text: str) -> None:
    print(text, flush=True)


async def run_demo(calls: int) -> int:
    """Returns the exit code: 0 when every step did what it should."""
    _say("starting a node ...")
    node = await asyncio.to_thread(NodeProcess().start)
    _say(f"  node {node.name} serves {node.url} (pid {node.pid})")
    try:
        async with clients.connect(node.url, name="demo-provider") as provider, \
                clients.connect(node.url, name="demo-caller") as caller:

            def add(data: dict) -> int:
                return data["a"] + data["b"]

            async def greet(data: dict, ctx: clients.CallContext) -> str:
                await asyncio.sleep(0.01)  # an awaiting handler: the node sees ACCEPT first
                return f"hello {data['name']}, from {ctx.rpc} (you are {ctx.caller})"

            await provider.provide("math.add", add)
            await provider.provide("demo.greet", greet)
            _say("provider 'demo-provider' provides math.add and demo.greet")
            for i in range(calls):
                t0 = time.perf_counter()
                result = await caller.call("math.add", {"a": i, "b": 10 * i}, timeout=5)
                _say(f"  math.add({i}, {10 * i}) = {result}   "
                     f"[{(time.perf_counter() - t0) * 1e3:.2f} ms]")
            _say("  " + await caller.call("demo.greet", {"name": "newcomer"}, timeout=5))
            try:
                await caller.call("nobody.provides.this", timeout=5)
            except clients.RpcError as exc:
                _say(f"  calling an unknown rpc fails cleanly: {exc.code}")
            t0 = time.perf_counter()
            results = await asyncio.gather(*(caller.call("math.add", {"a": i, "b": 1})
                                             for i in range(10_000)))
            elapsed = time.perf_counter() - t0
            ok = results == [i + 1 for i in range(10_000)]
            _say(f"  10,000 concurrent calls: {'all correct' if ok else 'WRONG ANSWERS'} "
                 f"in {elapsed:.2f} s ({10_000 / elapsed:,.0f} calls/s through one connection)")
    finally:
        code = await asyncio.to_thread(node.stop)
    _say(f"node stopped with exit code {code}")
    return 0 if ok and code == 0 else 1
