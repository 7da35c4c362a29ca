"""One provider of four turns ten times slower mid-run: how fast its share of calls
falls, and how the calls' p99 after compares with before (issue 40's shape).

\b
    python -m rpcbus.benchmarks.slow_provider --nodes 4 --policy local-first
    python -m rpcbus.benchmarks.slow_provider --nodes 2 --policy cluster

Real node processes over an embedded Redis; four providers round-robin over the nodes
(each answers after ``--delay`` s, the last one ten times that from the switch on) and
one caller per node with ``--inflight`` calls at a time, all SDK clients in this
process. Prints, as JSON: the slow provider's share per half second after the switch,
the seconds until its share stays under 10 %, and the p99 of the calls ended in the
second before the switch against those ended from ``--settle`` s after it. Bounded by
``--before`` + ``--after`` seconds of load; traffic stays on loopback.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import click

import rpcbus
from rpcbus.broker.local import LocalCluster

PROVIDERS = 4
BUCKET = 0.5


async def _run(urls: list[str], delay: float, inflight: int, before: float,
               after: float) -> tuple[list[tuple[float, float, str]], float]:
    delays = [delay] * PROVIDERS

    def handler(i: int) -> Any:
        async def serve(data: Any) -> str:
            await asyncio.sleep(delays[i])
            return f"p{i + 1}"
        return serve

    clients = []
    try:
        for i in range(PROVIDERS):
            provider = await rpcbus.connect(urls[i % len(urls)], name=f"p{i + 1}")
            await provider.provide("work", handler(i))
            clients.append(provider)
        callers = [await rpcbus.connect(u) for u in urls]
        clients += callers
        for caller in callers:
            await caller.call("work", None, timeout=10)
        ended: list[tuple[float, float, str]] = []
        start = time.monotonic()
        switch = start + before
        until = switch + after

        async def lane(client: Any) -> None:
            while (t0 := time.monotonic()) < until:
                who = await client.call("work", None, timeout=30)
                t1 = time.monotonic()
                ended.append((t1 - switch, t1 - t0, who))

        async def slow_down() -> None:
            await asyncio.sleep(max(0.0, switch - time.monotonic()))
            delays[-1] = delay * 10
        await asyncio.gather(slow_down(), *(lane(c) for c in callers for _ in range(inflight)))
        return ended, until - switch
    finally:
        await asyncio.gather(*(c.close() for c in clients))


def _p99(latencies: list[float]) -> float:
    ordered = sorted(latencies)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else float("nan")


def summary(ended: list[tuple[float, float, str]], after: float,
            settle: float) -> dict[str, Any]:
    """The figures of one run from its calls (seconds from the switch, latency, who)."""
    slow = f"p{PROVIDERS}"
    shares = []
    for k in range(int(after / BUCKET)):
        inside = [w for t, _, w in ended if k * BUCKET <= t < (k + 1) * BUCKET]
        shares.append(round(sum(w == slow for w in inside) / len(inside), 3) if inside else None)
    under = next((k * BUCKET + BUCKET for k in range(len(shares))
                  if all(s is not None and s < 0.1 for s in shares[k:])), None)
    p99_before = _p99([lat for t, lat, _ in ended if -1.0 <= t < 0])
    p99_after = _p99([lat for t, lat, _ in ended if t >= settle])
    before = [w for t, _, w in ended if -1.0 <= t < 0]
    return {"calls": len(ended),
            "slow_share_before": round(sum(w == slow for w in before) / max(1, len(before)), 3),
            "slow_share_per_half_second": shares,
            "seconds_until_under_10pct": under,
            "p99_before_ms": round(p99_before * 1e3, 2),
            "p99_after_ms": round(p99_after * 1e3, 2),
            "p99_after_over_before": round(p99_after / p99_before, 2)}


@click.command()
@click.option("--nodes", default=4, show_default=True)
@click.option("--policy", type=click.Choice(["local-first", "cluster"]), default="local-first",
              show_default=True)
@click.option("--delay", default=0.002, show_default=True, help="A provider's seconds per call.")
@click.option("--inflight", default=8, show_default=True, help="Calls at a time per caller.")
@click.option("--before", default=3.0, show_default=True, help="Seconds of load before.")
@click.option("--after", default=4.0, show_default=True, help="Seconds of load after.")
@click.option("--settle", default=2.0, show_default=True,
              help="Seconds after the switch from which p99 is measured again.")
def main(nodes: int, policy: str, delay: float, inflight: int, before: float,
         after: float, settle: float) -> None:
    cluster = LocalCluster(nodes, env={"RPCBUS_CLUSTER_POLICY": policy}).start()
    try:
        ended, span = asyncio.run(_run([n.url for n in cluster.nodes], delay, inflight,
                                       before, after))
    finally:
        cluster.stop()
    click.echo(json.dumps({"nodes": nodes, "policy": policy, **summary(ended, span, settle)}))


if __name__ == "__main__":
    main()
