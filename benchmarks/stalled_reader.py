"""Readers that stop reading their streams while the providers would go on sending: the
memory of both nodes, the provider and the reader over time (issue 41's flow-control
goal: flat within 1 MB for 60 s).

\b
    python -m rpcbus.benchmarks.stalled_reader --seconds 60 --streams 50 --window 64

Real node processes over an embedded Redis: the provider on n1 (endless async
generators of ``--payload`` bytes), the reader on n2 (so every part crosses the bus),
each in a process of its own. The reader opens ``--streams`` streams, reads a few parts
of each, then stops reading and holds them open for ``--seconds``. Prints, as JSON, the
RSS of each process every ``--every`` seconds from the stop on, and its growth from the
first sample to the last. Bounded by ``--seconds``; traffic stays on loopback.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

import click

from rpcbus.broker.local import LocalCluster

_PROVIDER = """
import asyncio, sys, rpcbus
async def main(url, size):
    payload = b"x" * size
    async def parts(_):
        while True:
            yield payload
    async with rpcbus.connect(url, name="stalled-provider") as c:
        await c.provide("stalled.parts", parts)
        print("ready", flush=True)
        await asyncio.Event().wait()
asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""

_READER = """
import asyncio, sys, rpcbus
async def main(url, streams, window, seconds):
    async with rpcbus.connect(url, name="stalled-reader") as c:
        opened = [c.stream("stalled.parts", None, timeout=seconds + 30, window=window)
                  for _ in range(streams)]
        for s in opened:
            for _ in range(3):
                await s.__anext__()
        print("stopped", flush=True)        # from here on nothing is read
        await asyncio.sleep(seconds + 30)
asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])))
"""


def _rss_mb(pids: dict[str, int]) -> dict[str, float]:
    import psutil

    return {name: round(psutil.Process(pid).memory_info().rss / 2**20, 2)
            for name, pid in pids.items()}


def run(seconds: float, streams: int, window: int, payload: int,
        every: float) -> dict[str, Any]:
    cluster = LocalCluster(nodes=2).start()
    procs: list[subprocess.Popen[str]] = []
    try:
        n1, n2 = cluster.nodes
        provider = subprocess.Popen([sys.executable, "-c", _PROVIDER, n1.url, str(payload)],
                                    stdout=subprocess.PIPE, text=True)
        procs.append(provider)
        assert provider.stdout is not None and provider.stdout.readline().strip() == "ready"
        time.sleep(1.0)  # n2 hears of the name
        reader = subprocess.Popen([sys.executable, "-c", _READER, n2.url, str(streams),
                                   str(window), str(seconds)], stdout=subprocess.PIPE,
                                  text=True)
        procs.append(reader)
        assert reader.stdout is not None and reader.stdout.readline().strip() == "stopped"
        pids = {"n1": n1.pid, "n2": n2.pid, "provider": provider.pid, "reader": reader.pid}
        time.sleep(1.0)  # what was in flight at the stop has arrived
        samples = []
        start = time.monotonic()
        while True:
            samples.append({"t": round(time.monotonic() - start, 1), **_rss_mb(pids)})
            if time.monotonic() - start >= seconds:
                break
            time.sleep(every)
        growth = {name: round(samples[-1][name] - samples[0][name], 2) for name in pids}
        return {"streams": streams, "window": window, "payload": payload,
                "seconds": seconds, "rss_mb": samples, "growth_mb": growth}
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
        cluster.stop()


@click.command(help=__doc__)
@click.option("--seconds", default=60.0, show_default=True, help="How long readers stop.")
@click.option("--streams", default=50, show_default=True, help="Streams the reader opens.")
@click.option("--window", default=64, show_default=True, help="Each stream's window.")
@click.option("--payload", default=1024, show_default=True, help="Bytes per part.")
@click.option("--every", default=5.0, show_default=True, help="Seconds between samples.")
def main(seconds: float, streams: int, window: int, payload: int, every: float) -> None:
    click.echo(json.dumps(run(seconds, streams, window, payload, every), indent=1))


if __name__ == "__main__":
    main()
