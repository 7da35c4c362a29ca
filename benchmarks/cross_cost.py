"""What a call that crosses nodes costs each node, in instructions.

    python -m rpcbus.benchmarks.cross_cost [--calls 3000,12000] [--inflight 200] [--conns 1]

The ``cross`` shape of ``rpcbus bench`` in miniature: a redis-server, node n1 with
one provider, node n2 with ``--conns`` caller connections and ``--inflight`` calls at
once on each, every call crossing the bus (``--conns 200 --inflight 1``: every client
frame carries one message, as in ``rpcbus bench cross --conns 50 --inflight 1``). One
node at a time runs under ``valgrind --tool=callgrind`` (instruction counts repeat
where timings on this machine do not: two runs of the same code agree within 0.7 %);
each runs with two call counts, and the difference over the difference in calls is
that node's instructions per call, start-up and shutdown cancelled out. Use it to
weigh a change to the cross-node path (docs/performance.md); ``rpcbus bench cross``
gives the speed.
"""

from __future__ import annotations

import asyncio

import rpcbus
from rpcbus.benchmarks.callgrind import (
    CALLGRIND,
    SLOW_NODE_ENV,
    collected,
    echo,
    echo_calls,
    options,
)
from rpcbus.broker.local import RedisServer
from rpcbus.broker.process import NodeProcess


async def _load(provider_url: str, caller_url: str, calls: int, inflight: int,
                conns: int) -> None:
    async with (rpcbus.connect(provider_url, name="worker") as prov,
                rpcbus.connect(caller_url) as caller):
        await prov.provide("cost.echo", echo)
        more = [await rpcbus.connect(caller_url) for _ in range(conns - 1)]
        for _ in range(300):        # until n2 has heard of the provider on n1
            try:
                await caller.call("cost.echo", {}, timeout=30)
                break
            except rpcbus.RpcError:
                await asyncio.sleep(0.1)
        try:
            await echo_calls([caller, *more], calls, inflight)
        finally:
            await asyncio.gather(*(c.close() for c in more))


def instructions(measured: str, calls: int, inflight: int, conns: int = 1) -> int:
    """The instructions node ``measured`` (n1 or n2) ran for a whole run of ``calls``."""
    redis = RedisServer().start()
    nodes: dict[str, NodeProcess] = {}
    try:
        for name in ("n1", "n2"):
            nodes[name] = NodeProcess(
                "--name", name, "--redis", redis.url, env=SLOW_NODE_ENV,
                wrapper=CALLGRIND if name == measured else None).start(timeout=180)
        asyncio.run(_load(nodes["n1"].url, nodes["n2"].url, calls, inflight, conns))
    finally:
        for node in nodes.values():
            node.stop(timeout=180)
        redis.stop()
    return collected(nodes[measured])


def main(argv: list[str] | None = None) -> None:
    low, high, inflight, conns = options(__doc__, "3000,12000", argv, conns=True)
    total = 0.0
    for node, role in (("n1", "the provider's node"), ("n2", "the caller's node")):
        per_call = (instructions(node, high, inflight, conns)
                    - instructions(node, low, inflight, conns)) / (high - low)
        total += per_call
        print(f"{node} ({role}): {per_call:,.0f} instructions per call", flush=True)
    print(f"both nodes: {total:,.0f} instructions per call")


if __name__ == "__main__":
    main()
