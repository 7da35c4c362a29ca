"""Soak: a long run at a steady rate through a 2-node cluster, recorded every second.

    python -m rpcbus.benchmarks.soak --duration 120 --rate 3000      # at most 600 s
    python -m rpcbus.benchmarks.soak --duration 5 --rate 500 --out soak-out   # a smoke run
    python -m rpcbus.benchmarks.soak --duration 600 --rate 1000 --restart-every 120

A paced caller on n2 calls an echo provider on n1 (so every call crosses the
bus) at ``--rate`` calls/s. Each second it records: calls finished, errors by
code, latency p50/p99/max of that second, each node's RSS, and the calls
pending on each node. Writes soak.json and soak.png (latency, memory and
pending over time) to ``--out`` and prints a summary: a leak shows as RSS or
pending that keeps growing at a steady rate.

``--restart-every S``: every S seconds one node in turn is restarted as in a
deploy (SIGTERM, it drains and exits, a new process starts under its name and
port). Both clients know both nodes: the provider moves off a stopping node and
the caller too, and no call may fail for it (a call to a name whose provider is
moving waits for it, within its deadline).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import sys
import time
import urllib.request
from collections import Counter
from typing import Any

import rpcbus
from rpcbus.broker.local import LocalCluster
from rpcbus.broker.logs import configure

MAX_DURATION = 600.0


def _stats(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url.replace("ws://", "http://") + "/stats", timeout=5) as r:
        return json.load(r)


async def echo(data: Any) -> Any:  # answers on the loop: no worker thread per call
    return data


def _rss_mb(node: Any) -> float | None:
    import psutil

    try:
        return float(psutil.Process(node.pid).memory_info().rss) / 2**20
    except (psutil.Error, OSError, AssertionError):
        return None  # restarting (no process yet, or gone)


def _pending(node: Any) -> int | None:
    try:
        return int(_stats(node.url)["pending"])
    except (OSError, ValueError):
        return None  # restarting (no URL yet, or not listening)


async def _restart_in_turn(cluster: LocalCluster, every: float, done: list[str]) -> None:
    """Every ``every`` seconds, a deploy's restart of the next node (they take turns)."""
    for i in itertools.count():
        await asyncio.sleep(every)
        await asyncio.to_thread(cluster.restart, i % len(cluster.nodes), True)
        done.append(f"n{i % len(cluster.nodes) + 1}")


async def soak(duration: float, rate: float, out: str,
               restart_every: float = 0.0) -> dict[str, Any]:
    cluster = await asyncio.to_thread(LocalCluster(nodes=2).start)
    n1, n2 = cluster.nodes
    samples: list[dict[str, Any]] = []
    restarted: list[str] = []
    restarts: asyncio.Task[None] | None = None
    try:
        async with rpcbus.connect([n1.url, n2.url]) as prov, \
                rpcbus.connect([n2.url, n1.url]) as caller:
            await prov.provide("soak.echo", echo)
            await caller.call("soak.echo", 0, timeout=5)
            latencies: list[float] = []
            errors: Counter[str] = Counter()
            first: dict[str, str] = {}  # code -> its first error, with when
            tasks: set[asyncio.Task[None]] = set()

            async def one(i: int) -> None:
                t0 = time.perf_counter()
                try:
                    await caller.call("soak.echo", i, timeout=5)
                    latencies.append(time.perf_counter() - t0)
                except rpcbus.RpcError as exc:
                    errors[exc.code] += 1
                    if exc.code not in first:
                        first[exc.code] = f"t={loop.time() - start:.1f}s {exc}"

            if restart_every > 0:
                restarts = asyncio.create_task(_restart_in_turn(cluster, restart_every,
                                                                restarted))
            loop = asyncio.get_running_loop()
            start = loop.time()
            sent = 0
            next_sample = start + 1.0
            while (now := loop.time()) < start + duration:
                due = int((now - start) * rate)
                for _ in range(due - sent):          # keep the rate, whatever the lag
                    task = asyncio.create_task(one(sent))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                    sent += 1
                if now >= next_sample:
                    lat = sorted(latencies)
                    latencies.clear()
                    samples.append({
                        "t": round(now - start, 1), "calls": len(lat), "errors": dict(errors),
                        "p50_ms": lat[len(lat) // 2] * 1e3 if lat else None,
                        "p99_ms": lat[int(len(lat) * 0.99)] * 1e3 if lat else None,
                        "max_ms": lat[-1] * 1e3 if lat else None,
                        "rss_mb": {f"n{i + 1}": _rss_mb(n) for i, n in enumerate(cluster.nodes)},
                        "pending": {f"n{i + 1}": _pending(n)
                                    for i, n in enumerate(cluster.nodes)},
                        "in_flight": len(tasks),
                    })
                    errors.clear()
                    next_sample += 1.0
                    s = samples[-1]
                    print(f"  t={s['t']:>6.0f}s  calls {s['calls']:>6}  p99 "
                          f"{s['p99_ms'] or 0:7.2f} ms  rss {_sum(s['rss_mb']):7.1f} MB  "
                          f"pending {_sum(s['pending']):.0f}", file=sys.stderr, flush=True)
                await asyncio.sleep(0.002)
            if restarts is not None:
                restarts.cancel()  # a restart under way finishes in its thread
                await asyncio.gather(restarts, return_exceptions=True)
            await asyncio.gather(*tasks)
    finally:
        if restarts is not None and not restarts.done():
            restarts.cancel()
        await asyncio.to_thread(cluster.stop)
    result = {"duration_s": duration, "rate": rate, "samples": samples,
              "restarted": restarted, "first_errors": first}
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "soak.json"), "w") as f:  # noqa: ASYNC230 (once, at the end)
        json.dump(result, f)
    _plot(samples, os.path.join(out, "soak.png"))
    return result


def _plot(samples: list[dict[str, Any]], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s["t"] for s in samples]
    fig, axes = plt.subplots(3, 1, figsize=(9, 8), sharex=True)
    axes[0].plot(t, [s["p50_ms"] for s in samples], label="p50")
    axes[0].plot(t, [s["p99_ms"] for s in samples], label="p99")
    axes[0].set_ylabel("latency, ms")
    axes[0].legend()
    for node in samples[0]["rss_mb"] if samples else ():
        axes[1].plot(t, [s["rss_mb"][node] for s in samples], label=node)
        axes[2].plot(t, [s["pending"][node] for s in samples], label=node)
    axes[1].set_ylabel("node RSS, MB")
    axes[1].legend()
    axes[2].set_ylabel("calls pending")
    axes[2].set_xlabel("seconds")
    axes[2].legend()
    fig.suptitle("rpcbus soak: 2 nodes, every call across the bus")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def _summary(result: dict[str, Any]) -> str:
    s = result["samples"]
    if len(s) < 4:
        return "too short to summarize"
    half = len(s) // 2
    first = sum(_sum(x["rss_mb"]) for x in s[1:half]) / max(1, half - 1)
    second = sum(_sum(x["rss_mb"]) for x in s[half:]) / (len(s) - half)
    calls = sum(x["calls"] for x in s)
    errors: Counter[str] = Counter()
    for x in s:
        errors.update(x["errors"])
    p99 = sorted(x["p99_ms"] for x in s if x["p99_ms"] is not None)
    duration = result["duration_s"]
    return (f"{calls:,} calls in {duration:.0f} s ({calls / duration:,.0f}/s), "
            f"errors {dict(errors) or 'none'}; per-second p99 median {p99[len(p99) // 2]:.2f} ms, "
            f"worst {p99[-1]:.2f} ms; node RSS (both) first half {first:.1f} MB, "
            f"second half {second:.1f} MB"
            + (f"; restarted {', '.join(result['restarted'])}" if result["restarted"] else "")
            + "".join(f"\n  first {code}: {text}" for code, text in result["first_errors"].items()))


def _sum(figures: dict[str, float | None]) -> float:
    return sum(v for v in figures.values() if v is not None)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m rpcbus.benchmarks.soak", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=120.0)
    ap.add_argument("--rate", type=float, default=3000.0, help="calls per second")
    ap.add_argument("--out", default="bench-results/soak")
    ap.add_argument("--restart-every", type=float, default=0.0,
                    help="seconds between deploy restarts of one node in turn (0: none)")
    args = ap.parse_args(argv)
    if not 0 < args.duration <= MAX_DURATION:
        ap.error(f"--duration must be in (0, {MAX_DURATION:.0f}] seconds")
    configure("warning", "console")
    result = asyncio.run(soak(args.duration, args.rate, args.out, args.restart_every))
    print(_summary(result))
    print(f"wrote {args.out}/soak.json and {args.out}/soak.png")


if __name__ == "__main__":
    main()
