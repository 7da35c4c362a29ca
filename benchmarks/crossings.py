"""How many files one cross-node call passes through, and how often it crosses between them.

    python -m rpcbus.benchmarks.crossings [--calls 20]

A redis-server, and in this process two nodes (n1 with a provider, n2 with a caller)
and the two SDK clients. After a warm-up, each of ``--calls`` calls, one at a time,
runs under ``sys.setprofile``: every Python call from one rpcbus file into another is
a crossing (a callback from asyncio into rpcbus is an entry, not a crossing). Prints
the spread of crossings per call, then the call's own path: the call with the fewest,
as no timer of the nodes' (a sweep, a heartbeat) ran while it was under way, so its
count does not move with the machine's load. Its files: all of rpcbus's (the SDK's and
the wire code both sides share included), and the nodes' own (rpcbus.broker and
rpcbus.cluster). A reader following the call through the code follows these
crossings; fewer is simpler.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

import structlog

import rpcbus
import rpcbus.broker
import rpcbus.cluster
from rpcbus.broker import config as config_mod
from rpcbus.broker.local import RedisServer
from rpcbus.broker.node import Node

# the folders, most specific first (installed, broker/ and cluster/ sit in rpcbus/)
FOLDERS = [(Path(rpcbus.broker.__file__).resolve().parent, "broker"),
           (Path(rpcbus.cluster.__file__).resolve().parent, "cluster"),
           (Path(rpcbus.__file__).resolve().parent, "clients")]


def _place(code_file: str) -> str | None:
    """``broker/router.py`` for an rpcbus file, None for anything else."""
    path = Path(code_file).resolve()
    for folder, name in FOLDERS:
        if path.is_relative_to(folder):
            rel = path.relative_to(folder)
            return None if len(rel.parts) > 1 else f"{name}/{rel}"
    return None


class Tracer:
    def __init__(self) -> None:
        self.crossings: Counter[tuple[str, str]] = Counter()
        self.files: set[str] = set()
        self._places: dict[str, str | None] = {}

    def place(self, filename: str) -> str | None:
        if filename not in self._places:
            self._places[filename] = _place(filename)
        return self._places[filename]

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        here = self.place(frame.f_code.co_filename)
        if here is None:
            return
        self.files.add(here)
        back = frame.f_back
        there = self.place(back.f_code.co_filename) if back is not None else None
        if there is not None and there != here:
            self.crossings[(there, here)] += 1


def _node_only(place: str) -> bool:
    return place.startswith(("broker/", "cluster/"))


async def _run(calls: int) -> list[Tracer]:
    redis = RedisServer().start()
    env = {"RPCBUS_AUTH_MODE": "none", "RPCBUS_NODE_PORT": "0",
           "RPCBUS_CLUSTER_REDIS_URL": redis.url, "RPCBUS_CLUSTER_HEARTBEAT_INTERVAL": "5"}
    nodes = [Node(config_mod.load(None, env={**env, "RPCBUS_NODE_NAME": name}))
             for name in ("n1", "n2")]
    tasks = [asyncio.create_task(n.run()) for n in nodes]
    traced: list[Tracer] = []
    try:
        async with asyncio.timeout(20):
            while not all(n.ready for n in nodes):  # noqa: ASYNC110  # a flag, no event
                await asyncio.sleep(0.01)
        async with (rpcbus.connect(nodes[0].url, name="worker") as provider,
                    rpcbus.connect(nodes[1].url) as caller):
            await provider.provide("trace.echo", _echo)
            for _ in range(300):  # until n2 has heard of the provider on n1
                try:
                    await caller.call("trace.echo", 0, timeout=10)
                    break
                except rpcbus.RpcError:
                    await asyncio.sleep(0.05)
            for i in range(50):
                await caller.call("trace.echo", i)
            for i in range(calls):
                tracer = Tracer()
                sys.setprofile(tracer)
                try:
                    await caller.call("trace.echo", i)
                finally:
                    sys.setprofile(None)
                traced.append(tracer)
    finally:
        for n in nodes:
            n.stop()
        await asyncio.gather(*tasks, return_exceptions=True)
        redis.stop()
    return traced


async def _echo(data: Any) -> Any:
    return data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rpcbus.benchmarks.crossings",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args(argv)
    structlog.configure(logger_factory=structlog.ReturnLoggerFactory())  # nodes: quiet
    traced = asyncio.run(_run(args.calls))
    traced.sort(key=lambda t: sum(t.crossings.values()))
    totals = [sum(t.crossings.values()) for t in traced]
    print(f"crossings per call: median {statistics.median(totals):g}, "
          f"least {totals[0]}, most {totals[-1]} ({len(traced)} calls)")
    # the least: a call during which no timer of the nodes' ran (a sweep, a heartbeat),
    # so its count is the call's own path, whatever the machine's load
    own = traced[0]
    node = sorted(f for f in own.files if _node_only(f))
    print(f"the call's own path (the least): {len(own.files)} files, {totals[0]} crossings")
    print(f"the nodes' own (broker/, cluster/): {len(node)} files, "
          f"{sum(n for (a, b), n in own.crossings.items() if _node_only(a) and _node_only(b))}"
          f" crossings: {', '.join(node)}")
    print("its crossings, most first:")
    for (a, b), n in own.crossings.most_common():
        print(f"  {n:3d}  {a} -> {b}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
