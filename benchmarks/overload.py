"""``rpcbus bench overload``: open-loop arrivals beyond capacity, step by step.

Callers that slow down with the server (a closed loop) never overload it; real users
do not wait for each other. This sends calls at a fixed Poisson rate whatever comes
back (as wrk2 and Gatling do), stepped from half to five times the capacity measured
first, and prints per step: goodput (answers per second), p50/p99 of the answered
calls, every outcome's count, and wasted work: handlers that started, or finished,
after their call's deadline (their caller had already given up).

The provider is one process whose handler is a plain function that blocks
``--service-ms`` in one of ``--threads`` worker threads: its capacity is about
threads / service time whatever the machine's load, so each step's offered load is
known. ``--nodes 1``: provider and caller on one node; ``2``: the provider on n1, the
caller on n2 (every call crosses Redis). NATS request/reply (nats-py, a queue-group
responder running the same handler in as many threads) gets the same offered loads:
it has no admission, so its callers see what a broker without one gives.

The caller process collects its garbage between steps, not during one: a full pass
over the generator's thousands of calls in flight took 17-39 ms, and every answer
that came meanwhile was timed that much later, a pause of the load generator's own
(as wrk2, in C, has none).

Every process runs on loopback and stops by itself; one run takes about
``(len(steps) + 1) * step_seconds`` per setup. Ratios are of the same run's capacity.

    python -m rpcbus.benchmarks.overload --nodes 1,2 --steps 0.5,0.8,1,2,3,5
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import gc
import json
import random
import subprocess
import sys
import time
from collections import Counter
from typing import Any

WORK, STATS = "ov.work", "ov.stats"


def _handler_counts() -> tuple[dict[str, int], Any]:
    counts = {"started": 0, "started_late": 0, "finished_late": 0}

    def work(data: dict[str, Any], service: float) -> int:
        now = time.monotonic()  # one clock for every process on this machine
        counts["started"] += 1
        if now > data["deadline"]:
            counts["started_late"] += 1
        time.sleep(service)
        if time.monotonic() > data["deadline"]:
            counts["finished_late"] += 1
        return int(data["id"])
    return counts, work


async def provider(url: str, threads: int, service: float) -> None:
    """The rpcbus provider process: ``ov.work`` blocks ``service`` s in a worker thread."""
    import rpcbus

    counts, work = _handler_counts()
    async with rpcbus.connect(url, name="overload-provider", handler_threads=threads) as c:
        async def stats(_data: Any) -> dict[str, int]:
            return dict(counts)  # on the loop: never waits behind the busy threads

        await c.provide(WORK, lambda data: work(data, service))
        await c.provide(STATS, stats)
        print(json.dumps({"ready": True}), flush=True)
        await asyncio.Event().wait()


async def nats_responder(url: str, threads: int, service: float) -> None:
    """The NATS responder: the same handler in as many threads, a reply per request."""
    import msgpack
    import nats

    counts, work = _handler_counts()
    pool = concurrent.futures.ThreadPoolExecutor(threads)
    loop = asyncio.get_running_loop()
    nc = await nats.connect(url)

    tasks: set[asyncio.Task[None]] = set()

    async def handle(msg: Any) -> None:
        answer = await loop.run_in_executor(pool, work, msgpack.unpackb(msg.data), service)
        await msg.respond(msgpack.packb(answer))

    async def on_work(msg: Any) -> None:  # nats-py awaits a callback before the next
        task = loop.create_task(handle(msg))  # message: the threads get them all at once
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    async def on_stats(msg: Any) -> None:
        await msg.respond(msgpack.packb(dict(counts)))

    await nc.subscribe(WORK, queue="ov", cb=on_work)
    await nc.subscribe(STATS, cb=on_stats)
    await nc.flush()
    print(json.dumps({"ready": True}), flush=True)
    await asyncio.Event().wait()


class _Target:
    """What the caller calls: an rpcbus client, or a NATS connection."""

    def __init__(self, kind: str, url: str) -> None:
        self.kind, self.url = kind, url
        self.conn: Any = None

    async def __aenter__(self) -> _Target:
        if self.kind == "rpcbus":
            import rpcbus

            self.conn = await rpcbus.connect(self.url, name="overload-caller").__aenter__()
        else:
            import nats

            self.conn = await nats.connect(self.url)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self.kind == "rpcbus":
            await self.conn.close()
        else:
            await self.conn.close()

    async def call(self, name: str, data: Any, timeout: float) -> tuple[str, Any]:
        """(outcome code, answer): "OK", an rpcbus code, or NATS's failure's name."""
        if self.kind == "rpcbus":
            import rpcbus

            try:
                return "OK", await self.conn.call(name, data, timeout=timeout)
            except rpcbus.RpcError as exc:
                return exc.code, None
        import msgpack
        import nats.errors

        try:
            msg = await self.conn.request(name, msgpack.packb(data), timeout=timeout)
            return "OK", msgpack.unpackb(msg.data)
        except nats.errors.TimeoutError:
            return "TIMEOUT", None
        except nats.errors.NoRespondersError:
            return "NO_RESPONDERS", None


async def _closed_loop(target: _Target, inflight: int, seconds: float, timeout: float) -> float:
    """Answers per second with ``inflight`` calls always under way: the capacity."""
    done = 0
    end = time.monotonic() + seconds
    seq = iter(range(10**9))

    async def loop() -> None:
        nonlocal done
        while time.monotonic() < end:
            code, _ = await target.call(WORK, {"id": next(seq),
                                                "deadline": time.monotonic() + timeout},
                                        timeout)
            done += code == "OK"
    start = time.monotonic()
    await asyncio.gather(*(loop() for _ in range(inflight)))
    return done / (time.monotonic() - start)


async def _open_loop(target: _Target, rate: float, seconds: float, timeout: float,
                     rand: random.Random) -> dict[str, Any]:
    """Calls at ``rate`` per second (Poisson), whatever comes back; every one awaited.
    Each call is timed from when it was due, not from when this process got to it: a
    generator that falls behind shows as latency, not as a lower offered load (as wrk2
    corrects for coordinated omission). Calls due together start in one loop turn, and
    finished calls are not kept, so the generator stays cheaper than what it measures
    (its CPU is printed beside the nodes')."""
    outcomes: Counter[str] = Counter()
    latencies: list[float] = []
    lags: list[float] = []  # how late this process made each call (its own load)
    loop = asyncio.get_running_loop()
    under_way = 0
    all_done = loop.create_future()
    generating = True

    async def one(i: int, due: float) -> None:
        nonlocal under_way
        now = time.monotonic()
        lags.append(now - due)
        left = max(timeout - (now - due), 0.001)
        code, _ = await target.call(WORK, {"id": i, "deadline": now + left}, left)
        outcomes[code] += 1
        if code == "OK":
            latencies.append(time.monotonic() - due)
        under_way -= 1
        if not under_way and not generating and not all_done.done():
            all_done.set_result(None)

    start = time.monotonic()
    due, i = start + rand.expovariate(rate), 0
    while due < start + seconds:
        delay = due - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        now = time.monotonic()
        while due <= now and due < start + seconds:  # every call due by now, at once
            loop.create_task(one(i, due))
            under_way += 1
            i += 1
            due += rand.expovariate(rate)
    generating = False
    if under_way:
        await all_done
    latencies.sort()
    lags.sort()

    def pct(values: list[float], q: float) -> float:
        return values[min(len(values) - 1, int(q * len(values)))] * 1000 \
            if values else float("nan")
    return {"offered": i / seconds, "goodput": outcomes["OK"] / seconds,
            "p50_ms": pct(latencies, 0.5), "p99_ms": pct(latencies, 0.99),
            "lag_p50_ms": pct(lags, 0.5), "lag_p99_ms": pct(lags, 0.99),
            "outcomes": dict(outcomes)}


def _cpu() -> dict[str, float]:
    """CPU seconds so far of this process (the caller) and of the processes it started,
    by role: nodes, provider (or NATS responder), redis, nats."""
    import psutil

    me = psutil.Process()
    out: Counter[str] = Counter()
    times = me.cpu_times()
    out["caller"] = times.user + times.system
    for child in me.children(recursive=True):
        try:
            line = " ".join(child.cmdline())
            times = child.cpu_times()
        except psutil.Error:
            continue  # it ended meanwhile
        role = ("provider" if "--role" in line else "redis" if "redis-server" in line
                else "nats" if "nats-server" in line else "nodes")
        out[role] += times.user + times.system
    return dict(out)


async def _measure(kind: str, url: str, args: argparse.Namespace) -> dict[str, Any]:
    rand = random.Random(1)
    async with _Target(kind, url) as target:
        await _closed_loop(target, 2 * args.threads, 1.0, args.timeout)  # warm up
        capacity = await _closed_loop(target, 4 * args.threads, args.step_seconds,
                                      args.timeout)
        steps = []
        for factor in args.steps:
            before = await target.call(STATS, None, 5.0)
            gc.collect()
            gc.disable()  # (module docstring)
            try:
                cpu_before, began = _cpu(), time.monotonic()
                step = await _open_loop(target, factor * capacity, args.step_seconds,
                                        args.timeout, rand)
            finally:
                gc.enable()
            cpu_after, took = _cpu(), time.monotonic() - began
            step["cpu"] = {role: round((cpu_after[role] - cpu_before.get(role, 0.0)) / took, 2)
                           for role in cpu_after}
            await asyncio.sleep(args.timeout + 0.5)  # handlers of the step finish
            after = await target.call(STATS, None, 5.0)
            step["factor"] = factor
            if before[0] == "OK" and after[0] == "OK":
                step["started_late"] = after[1]["started_late"] - before[1]["started_late"]
                step["finished_late"] = after[1]["finished_late"] - before[1]["finished_late"]
            steps.append(step)
            _print_step(kind, capacity, step)
    return {"kind": kind, "capacity": capacity, "steps": steps}


def _print_step(kind: str, capacity: float, step: dict[str, Any]) -> None:
    codes = ", ".join(f"{k} {v}" for k, v in sorted(step["outcomes"].items()))
    print(f"  {kind:<10} {step['factor']:>4.1f}x  offered {step['offered']:8.0f}/s  goodput "
          f"{step['goodput']:8.0f}/s ({step['goodput'] / capacity:5.0%} of capacity)  "
          f"p50 {step['p50_ms']:7.1f} ms  p99 {step['p99_ms']:7.1f} ms  "
          f"late starts {step.get('started_late', '?')}, late finishes "
          f"{step.get('finished_late', '?')}  [{codes}]", flush=True)
    print("        CPU, cores: " + ", ".join(f"{role} {cores:.2f}"
                                            for role, cores in sorted(step["cpu"].items()))
          + f"; calls made late by the caller's own load: p50 {step['lag_p50_ms']:.1f} ms, "
          f"p99 {step['lag_p99_ms']:.1f} ms (in the latencies above)", flush=True)


def _spawn(role: str, url: str, args: argparse.Namespace) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-m", "rpcbus.benchmarks.overload", "--role",
                             role, "--url", url, "--threads", str(args.threads),
                             "--service-ms", str(args.service_ms)],
                            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    if json.loads(proc.stdout.readline()) != {"ready": True}:
        raise RuntimeError(f"the {role} did not start")
    return proc


def _with_server(kind: str, role: str, serve_url: str, call_url: str, nodes: int,
                 settle: float, args: argparse.Namespace) -> dict[str, Any]:
    """The steps of ``kind`` against a ``role`` process serving on ``serve_url``, called on
    ``call_url`` after ``settle`` seconds; the server process is killed afterwards."""
    proc = _spawn(role, serve_url, args)
    try:
        time.sleep(settle)
        result = asyncio.run(_measure(kind, call_url, args))
        result["nodes"] = nodes
        return result
    finally:
        proc.kill()
        proc.wait()


def _rpcbus_run(nodes: int, args: argparse.Namespace) -> dict[str, Any]:
    from rpcbus.broker.local import LocalCluster

    cluster = LocalCluster(nodes=nodes, env={"RPCBUS_RPC_MAX_TIMEOUT": "60"}).start()
    try:  # with 2 nodes, the name is known on the caller's node before the first step
        return _with_server("rpcbus", "provider", cluster.nodes[0].url, cluster.nodes[-1].url,
                            nodes, 1.0 if nodes > 1 else 0.0, args)
    finally:
        cluster.stop()


def _nats_run(args: argparse.Namespace) -> dict[str, Any]:
    from rpcbus.benchmarks.peers import Peer

    peer = Peer("nats", 0)
    try:
        return _with_server("nats", "nats-responder", peer.url, peer.url, 0, 0.0, args)
    finally:
        peer.stop()


def _verdict(result: dict[str, Any], queue_target_ms: float) -> list[str]:
    """The issue's goals, each as a line saying met or not, with the figure."""
    cap, steps = result["capacity"], {s["factor"]: s for s in result["steps"]}
    lines = []
    for factor in (3.0, 5.0):
        if factor in steps:
            share = steps[factor]["goodput"] / cap
            lines.append(f"goodput at {factor:g}x: {share:.0%} of capacity "
                         f"({'met' if share >= 0.9 else 'NOT met'}: >= 90 %)")
    no_provider = sum(s["outcomes"].get("NO_PROVIDER", 0) for s in result["steps"])
    lines.append(f"NO_PROVIDER with a live provider: {no_provider} "
                 f"({'met' if not no_provider else 'NOT met'})")
    late = sum(s.get("started_late", 0) for s in result["steps"])
    lines.append(f"handlers started after their deadline: {late} "
                 f"({'met' if not late else 'NOT met'})")
    if 3.0 in steps and 0.8 in steps:
        grew = steps[3.0]["p99_ms"] - steps[0.8]["p99_ms"]
        lines.append(f"p99 at 3x minus p99 at 0.8x: {grew:.1f} ms "
                     f"({'met' if grew <= queue_target_ms else 'NOT met'}: "
                     f"<= queue target {queue_target_ms:g} ms)")
    return lines


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="rpcbus bench overload", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", default="1,2", help="rpcbus setups to run (1, 2 or both)")
    ap.add_argument("--steps", default="0.5,0.8,1,2,3,5",
                    help="offered loads, as multiples of the measured capacity")
    ap.add_argument("--step-seconds", type=float, default=5.0)
    ap.add_argument("--service-ms", type=float, default=5.0)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--timeout", type=float, default=1.0, help="each call's, s")
    ap.add_argument("--no-nats", action="store_true", help="leave NATS out")
    ap.add_argument("--out", default=None, help="also write the results as JSON here")
    ap.add_argument("--role", choices=["provider", "nats-responder"], help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.role == "provider":
        asyncio.run(provider(args.url, args.threads, args.service_ms / 1000))
        return
    if args.role == "nats-responder":
        asyncio.run(nats_responder(args.url, args.threads, args.service_ms / 1000))
        return
    try:
        args.steps = [float(s) for s in args.steps.split(",")]
        setups = [int(n) for n in args.nodes.split(",") if n]
    except ValueError:
        ap.error("--steps and --nodes take comma-separated numbers, as 0.5,1,3 and 1,2")
    if not set(setups) <= {1, 2}:
        ap.error("--nodes takes 1, 2 or 1,2")
    print(f"handler: {args.service_ms:g} ms in {args.threads} threads; calls time out after "
          f"{args.timeout:g} s; {args.step_seconds:g} s a step", flush=True)
    results = []
    for nodes in setups:
        print(f"rpcbus, {nodes} node{'s' if nodes > 1 else ''}:", flush=True)
        results.append(_rpcbus_run(nodes, args))
        print(f"  capacity {results[-1]['capacity']:.0f} calls/s", flush=True)
    if not args.no_nats:
        print("NATS request/reply (no admission: what its callers see):", flush=True)
        results.append(_nats_run(args))
        print(f"  capacity {results[-1]['capacity']:.0f} calls/s", flush=True)
    for result in results:
        if result["kind"] == "rpcbus":
            print(f"goals, rpcbus on {result['nodes']} node(s):")
            for line in _verdict(result, 100.0):
                print("  " + line)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
