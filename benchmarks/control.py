"""The cluster's control traffic at 10 to 500 nodes, simulated against a real redis-server.

Every node subscribes to the control topic and publishes on it: a STATE heartbeat every
``heartbeat_interval`` (its size measured from a real heartbeat: 20 busiest rpcs with
their latency buckets, up to 100 provided names), RPC_QUERY for a name it does not know
(answered by a PROVIDER_UPDATE from every node), and after a restart a PROVIDER_UPDATE
per name it provides. Redis delivers each control PUBLISH to every node, so deliveries
grow with the square of the nodes.

For each cluster size N this starts one redis-server, N subscriber connections (one
per simulated node, reading and discarding in this process: Redis does the same work
as for real nodes) and publishes heartbeats at N per second for ``--seconds``; it
reports Redis CPU per second (the share of one core it needs) and the bytes it sends.
Sizes whose heartbeats alone would need more than one core are not run: their figures
are extrapolated from the measured cost per delivered byte and per PUBLISH, and marked.

    python -m rpcbus.benchmarks.control            # 10, 50, 100, 200 measured; 500 extrapolated
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import click
import psutil

from rpcbus.broker.local import RedisServer
from rpcbus.broker.rpcstats import RpcStatsTable
from rpcbus.cluster import messages as m
from rpcbus.cluster import resp


def heartbeat(rpcs: int = 20, provided: int = 100) -> bytes:
    """One STATE batch as a busy node sends it (20 busiest rpcs, ``provided`` names)."""
    table = RpcStatsTable()
    for i in range(rpcs):
        stats = table.get(f"service-{i}.method")
        for j in range(200):
            stats.answered(0.0001 * (1 + j % 50))
        stats.ok += 1_000_000 + i
    info = {"connections": 250, "pending": 120, "uptime_s": 86400.0,
            "providers": {f"service-{i}.method": 4 for i in range(provided)},
            "rpcs": provided, "providers_total": 4 * provided, "calls_ok": 123_456_789,
            "calls_failed": 1234, "calls_by_rpc": table.busiest(rpcs)}
    return m.encode_batch("node-123", m.new_incarnation(), 0, time.monotonic(),
                          [[m.STATE, m.READY, "ws://10.0.0.123:9000", time.time(), info]])


class _Sink(asyncio.Protocol):
    """A subscribed node that reads and counts bytes (parsing is the node's cost, not
    Redis's)."""

    received = 0

    def data_received(self, data: bytes) -> None:
        _Sink.received += len(data)


async def _measure(nodes: int, payload: bytes, seconds: float) -> dict[str, float]:
    redis = RedisServer(args=["--client-output-buffer-limit", "pubsub", "0", "0", "0"]).start()
    loop = asyncio.get_running_loop()
    sinks = []
    try:
        proc = psutil.Process(redis.proc.pid)
        for _ in range(nodes):
            transport, _ = await loop.create_connection(_Sink, "127.0.0.1", redis.port)
            transport.write(resp.encode(b"SUBSCRIBE", b"rpcbus:ctrl"))
            sinks.append(transport)
        pub = await resp.connect(redis.url)
        command = resp.publish(resp.publish_head("rpcbus:ctrl"), payload)
        await asyncio.sleep(0.5)
        _Sink.received = 0
        cpu0 = sum(proc.cpu_times()[:2])
        start = time.perf_counter()
        sent = 0
        tick = 0.01  # heartbeats spread over the second, as N independent nodes send them
        while (elapsed := time.perf_counter() - start) < seconds:
            due = int(elapsed * nodes) + 1 - sent
            if due > 0:
                pub.send(command * due, due, lambda error: None)
                sent += due
            await asyncio.sleep(tick)
        await pub.request(b"PING")
        span = time.perf_counter() - start
        cpu = sum(proc.cpu_times()[:2]) - cpu0
        pub.abort(ConnectionError("done"))
        return {"nodes": nodes, "publishes_per_s": sent / span,
                "deliveries_per_s": sent * nodes / span,
                "redis_cpu_share": cpu / span, "redis_out_mb_per_s": _Sink.received / span / 1e6,
                "redis_cpu_us_per_delivery": cpu * 1e6 / (sent * nodes)}
    finally:
        for transport in sinks:
            transport.close()
        redis.stop()


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--sizes", default="10,50,100,200,500", show_default=True,
              help="Cluster sizes, comma-separated.")
@click.option("--seconds", type=click.FloatRange(min=0.5), default=3.0, show_default=True,
              help="Measured seconds per size.")
@click.option("--interval", type=click.FloatRange(min=0.1), default=1.0, show_default=True,
              help="heartbeat_interval (s).")
def command(sizes: str, seconds: float, interval: float) -> None:
    """The control traffic of N nodes at Redis, measured and extrapolated."""
    payload = heartbeat()
    small = heartbeat(rpcs=0, provided=3)
    click.echo(f"heartbeat batch: {len(payload):,} B (20 busiest rpcs, 100 names); "
               f"{len(small):,} B (an idle node with 3 names)")
    fitted: Any = None
    rows = []
    for nodes in (int(s) for s in sizes.split(",")):
        deliveries = nodes * nodes / interval
        if fitted is not None and deliveries * fitted > 0.8:  # more than one core: not run
            rows.append({"nodes": nodes, "publishes_per_s": nodes / interval,
                         "deliveries_per_s": deliveries,
                         "redis_cpu_share": deliveries * fitted,
                         "redis_out_mb_per_s": deliveries * len(payload) / 1e6,
                         "redis_cpu_us_per_delivery": fitted * 1e6, "extrapolated": True})
            continue
        row = asyncio.run(_measure(nodes, payload, seconds * interval))
        fitted = row["redis_cpu_us_per_delivery"] / 1e6
        rows.append(row)
    click.echo(f"{'nodes':>6} {'PUBLISH/s':>10} {'deliveries/s':>13} {'Redis CPU':>10} "
               f"{'Redis out MB/s':>15} {'µs/delivery':>12} {'per node in/s':>14}")
    for r in rows:
        click.echo(f"{r['nodes']:>6} {r['publishes_per_s']:>10,.0f} "
                   f"{r['deliveries_per_s']:>13,.0f} "
                   f"{r['redis_cpu_share']:>9.0%} {r['redis_out_mb_per_s']:>15.1f} "
                   f"{r['redis_cpu_us_per_delivery']:>12.2f} {r['nodes'] / interval:>14,.0f}"
                   + ("  (extrapolated)" if r.get("extrapolated") else ""))


if __name__ == "__main__":
    command(prog_name="python -m rpcbus.benchmarks.control")
