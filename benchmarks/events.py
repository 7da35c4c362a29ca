"""``rpcbus bench events``: one publisher to many subscribers, beside deepstream and NATS.

    ./dev bench events [--fanout 1,100,1000] [--nodes 1,2] [--duration 5] [--payload 64]
                       [--compare deepstream,nats] [--out DIR]

For each fan-out (subscribing connections) and each cluster size, one publisher
emits events to one topic as fast as its node takes them (a round trip after
each ``--batch`` emits: rpcbus's PING, NATS's flush, a deepstream presence query),
for ``--duration`` seconds, while the subscribers (in up to ``--procs``
processes, each holding its share of the connections) count what they get and
how late: each event carries the publisher's monotonic clock in µs, so latency
is emit to delivery. One node is a node alone (as deepstream and nats-server run
here); on 2 nodes (an embedded Redis between them) the publisher is on n1 and
every subscriber on n2 (every event crosses Redis). Figures per run:

- deliveries/s: events received by all subscribers, over the publishing time;
- lost: events the nodes dropped for subscribers that fell behind (GAP counts;
  deepstream and NATS drop silently: their loss is what was not received);
- server CPU µs per delivery: the nodes' (and Redis') user and system time over
  the run, per delivery (deepstream's server process, nats-server);
- p50 and p99 from emit to delivery, of a sample of every subscriber's events.

deepstream 7.0.2 (benchmarks/deepstream/server.js, its own client: events.js)
and nats-server (nats-py) run on 1 node, on the same shapes, in the same run:
the same machine and hour, so the ratios hold where the absolute figures drift.
Everything is on loopback and stops by itself.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

PEERS = Path(__file__).resolve().parent / "deepstream"
TOPIC = "bench.events"
SAMPLE = 20_000   # latencies each subscriber process keeps (a uniform sample)


def _now_us() -> int:
    return time.monotonic_ns() // 1000


class _Tally:
    """What one subscriber process got: a count, the losses it was told of, a latency
    sample (reservoir)."""

    def __init__(self) -> None:
        self.got = 0
        self.lost = 0       # counts the nodes gave
        self.gaps = 0       # notices of losses, of a count or not (a node off the bus)
        self.sample: list[int] = []

    def event(self, sent_us: int) -> None:
        self.got += 1
        late = _now_us() - sent_us
        if len(self.sample) < SAMPLE:
            self.sample.append(late)
        else:
            i = random.randrange(self.got)
            if i < SAMPLE:
                self.sample[i] = late

    def report(self) -> dict[str, Any]:
        return {"got": self.got, "lost": self.lost, "gaps": self.gaps,
                "sample": self.sample}


async def _wait_report(tally: _Tally) -> None:
    """``ready`` is printed; the driver's ``report`` line ends the run."""
    print(json.dumps({"ready": True}), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    print(json.dumps(tally.report()), flush=True)


# -- rpcbus and NATS workers (this module's roles) -------------------------------------------

async def rpcbus_subs(args: argparse.Namespace) -> None:
    import rpcbus

    tally = _Tally()

    def on_gap(topic: str, count: int | None) -> None:
        tally.lost += count or 0
        tally.gaps += 1

    clients = [await rpcbus.connect(args.url) for _ in range(args.conns)]
    for c in clients:
        await c.subscribe(TOPIC, lambda data: tally.event(data[1]), on_gap=on_gap)
    await _wait_report(tally)
    for c in clients:
        await c.close()


async def rpcbus_pub(args: argparse.Namespace) -> None:
    import rpcbus

    payload = "x" * args.payload
    async with rpcbus.connect(args.url) as c:
        sent, started = 0, time.perf_counter()
        end = started + args.duration
        while time.perf_counter() < end:
            for _ in range(args.batch):
                await c.emit(TOPIC, [sent, _now_us(), payload])
                sent += 1
            await c.ping()   # the node has taken the batch
        print(json.dumps({"sent": sent, "seconds": time.perf_counter() - started}),
              flush=True)


async def nats_subs(args: argparse.Namespace) -> None:
    import msgpack
    import nats

    tally = _Tally()
    unpack = msgpack.unpackb

    async def on(msg: Any) -> None:
        tally.event(unpack(msg.data)[1])

    conns = [await nats.connect(args.url) for _ in range(args.conns)]
    for nc in conns:
        await nc.subscribe(TOPIC, cb=on, pending_msgs_limit=1_000_000)
        await nc.flush()
    await _wait_report(tally)
    for nc in conns:
        await nc.close()


async def nats_pub(args: argparse.Namespace) -> None:
    import msgpack
    import nats

    payload = "x" * args.payload
    nc = await nats.connect(args.url)
    sent, started = 0, time.perf_counter()
    end = started + args.duration
    while time.perf_counter() < end:
        for _ in range(args.batch):
            await nc.publish(TOPIC, msgpack.packb([sent, _now_us(), payload]))
            sent += 1
        await nc.flush()
    print(json.dumps({"sent": sent, "seconds": time.perf_counter() - started}), flush=True)
    await nc.close()


# -- the driver ------------------------------------------------------------------------------

def _spawn(cmd: list[str], cwd: str | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, cwd=cwd)


def _worker(kind: str, role: str, url: str, args: argparse.Namespace,
            conns: int = 1) -> subprocess.Popen[str]:
    if kind == "deepstream":
        return _spawn(["node", str(PEERS / "events.js"), role, url, str(conns),
                       str(args.duration), str(args.payload), str(args.batch)],
                      cwd=str(PEERS))
    return _spawn([sys.executable, "-m", "rpcbus.benchmarks.events", f"{kind}-{role}",
                   "--url", url, "--conns", str(conns), "--duration", str(args.duration),
                   "--payload", str(args.payload), "--batch", str(args.batch)])


def _line(proc: subprocess.Popen[str]) -> Any:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"a worker ({proc.args!r:.80}) ended with code {proc.wait()}")
    return json.loads(line)


def _cpu(pids: list[int]) -> float:
    import psutil

    total = 0.0
    for pid in pids:
        t = psutil.Process(pid).cpu_times()
        total += t.user + t.system
    return total


def _run(kind: str, pub_url: str, sub_url: str, pids: list[int], fanout: int,
         args: argparse.Namespace) -> dict[str, Any]:
    procs = min(args.procs, fanout)
    subs = [_worker(kind, "subs", sub_url, args, fanout // procs + (i < fanout % procs))
            for i in range(procs)]
    try:
        for s in subs:
            assert _line(s) == {"ready": True}
        cpu0 = _cpu(pids)
        pub = _worker(kind, "pub", pub_url, args)
        done = _line(pub)
        pub.wait()
        time.sleep(1.0)   # what is on its way arrives, and the GAPs of what was shed
        cpu = _cpu(pids) - cpu0
        reports = []
        for s in subs:
            assert s.stdin is not None
            s.stdin.write("report\n")
            s.stdin.flush()
            reports.append(_line(s))
    finally:
        for s in subs:
            s.kill()
            s.wait()
    got = sum(r["got"] for r in reports)
    sample = sorted(x for r in reports for x in r["sample"])

    def pct(q: float) -> float | None:
        return sample[min(len(sample) - 1, int(q * len(sample)))] / 1000 if sample else None
    return {"system": kind, "fanout": fanout, "emitted": done["sent"],
            "seconds": round(done["seconds"], 3),
            "deliveries_per_s": round(got / done["seconds"]),
            "expected": done["sent"] * fanout, "delivered": got,
            "lost_told": sum(r["lost"] for r in reports),
            "gaps": sum(r.get("gaps", 0) for r in reports),
            "server_cpu_us_per_delivery": round(cpu / got * 1e6, 3) if got else None,
            "p50_ms": pct(0.5), "p99_ms": pct(0.99)}


def _rpcbus(nodes: int, fanouts: list[int], args: argparse.Namespace) -> list[dict[str, Any]]:
    """One node is a node alone (no Redis: as deepstream and nats-server run here); two
    are a cluster on an embedded Redis, whose CPU counts too."""
    from rpcbus.broker.local import LocalCluster
    from rpcbus.broker.process import NodeProcess

    env = {"RPCBUS_AUTH_MODE": "none"}
    if nodes == 1:
        node = NodeProcess(env=env).start()
        try:
            return [{**_run("rpcbus", node.url, node.url, [node.pid], f, args), "nodes": 1}
                    for f in fanouts]
        finally:
            node.stop()
    cluster = LocalCluster(nodes=nodes, env=env).start()
    try:
        pids = [n.pid for n in cluster.nodes] + (
            [cluster.redis.proc.pid] if cluster.redis is not None else [])
        urls = [n.url for n in cluster.nodes]
        return [{**_run("rpcbus", urls[0], urls[-1], pids, f, args), "nodes": nodes}
                for f in fanouts]
    finally:
        cluster.stop()


def _deepstream(fanouts: list[int], args: argparse.Namespace) -> list[dict[str, Any]]:
    from rpcbus.broker.local import free_port

    port = free_port()
    server = subprocess.Popen(["node", str(PEERS / "server.js"), str(port)], cwd=str(PEERS),
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert server.stdout is not None
        while server.stdout.readline().strip() != "started":
            if server.poll() is not None:
                raise RuntimeError("deepstream did not start (./dev ds-bench installs it)")
        url = f"ws://127.0.0.1:{port}/deepstream"
        return [{**_run("deepstream", url, url, [server.pid], f, args), "nodes": 1}
                for f in fanouts]
    finally:
        server.terminate()
        server.wait()


def _nats(fanouts: list[int], args: argparse.Namespace) -> list[dict[str, Any]]:
    from rpcbus.benchmarks.peers import Peer

    peer = Peer("nats", 0)
    try:
        return [{**_run("nats", peer.url, peer.url, [peer.pid], f, args), "nodes": 1}
                for f in fanouts]
    finally:
        peer.stop()


def _table(rows: list[dict[str, Any]]) -> str:
    head = ("| system | nodes | fan-out | deliveries/s | delivered of expected | lost (told) "
            "| gap notices | server CPU µs/delivery | p50 ms | p99 ms |\n"
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    lines = [head]
    for r in rows:
        lines.append(f"| {r['system']} | {r['nodes']} | {r['fanout']} | "
                     f"{r['deliveries_per_s']:,} | {r['delivered']:,} of {r['expected']:,} | "
                     f"{r['lost_told']:,} | {r['gaps']:,} | {r['server_cpu_us_per_delivery']} | "
                     f"{r['p50_ms']} | {r['p99_ms']} |")
    return "\n".join(lines)


def _ratios(rows: list[dict[str, Any]]) -> list[str]:
    """rpcbus on one node against deepstream, per fan-out (the issue's goals: deliveries/s
    at least 3x, CPU per delivery at most 0.3x)."""
    out = []
    for f in sorted({r["fanout"] for r in rows}):
        ours = next((r for r in rows if r["system"] == "rpcbus" and r["nodes"] == 1
                     and r["fanout"] == f), None)
        ds = next((r for r in rows if r["system"] == "deepstream" and r["fanout"] == f), None)
        if ours and ds and ds["deliveries_per_s"] and ds["server_cpu_us_per_delivery"]:
            speed = ours["deliveries_per_s"] / ds["deliveries_per_s"]
            cpu = ours["server_cpu_us_per_delivery"] / ds["server_cpu_us_per_delivery"]
            out.append(f"fan-out {f}: rpcbus ÷ deepstream deliveries/s {speed:.2f}x, "
                       f"server CPU per delivery {cpu:.2f}x")
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="rpcbus bench events", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fanout", default="1,100,1000", help="subscribing connections, "
                    "comma-separated (default 1,100,1000)")
    ap.add_argument("--nodes", default="1,2", help="rpcbus cluster sizes (1,2)")
    ap.add_argument("--compare", default="deepstream,nats",
                    help="peers run beside on one node: deepstream, nats, or none")
    ap.add_argument("--duration", type=float, default=5.0, help="s of publishing per run")
    ap.add_argument("--payload", type=int, default=64, help="bytes of data per event")
    ap.add_argument("--batch", type=int, default=100, help="emits between round trips")
    ap.add_argument("--procs", type=int, default=4, help="subscriber processes at most")
    ap.add_argument("--out", default="", help="a folder for result.json and summary.md")
    args = ap.parse_args(argv)
    try:
        fanouts = [int(f) for f in args.fanout.split(",")]
        nodes = [int(n) for n in args.nodes.split(",")]
    except ValueError:
        ap.error("--fanout and --nodes take comma-separated whole numbers")
    if any(f < 1 for f in fanouts) or any(n not in (1, 2) for n in nodes):
        ap.error("--fanout values are 1 or more, --nodes values 1 or 2")
    peers = [] if args.compare == "none" else args.compare.split(",")
    if set(peers) - {"deepstream", "nats"}:
        ap.error("--compare takes deepstream, nats (comma-separated) or none")
    rows: list[dict[str, Any]] = []
    for n in nodes:
        rows += _rpcbus(n, fanouts, args)
    if "deepstream" in peers:
        rows += _deepstream(fanouts, args)
    if "nats" in peers:
        rows += _nats(fanouts, args)
    table = _table(rows)
    ratios = _ratios(rows)
    print(table)
    for line in ratios:
        print(line)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "result.json").write_text(json.dumps(rows, indent=1))
        (out / "summary.md").write_text(table + "\n\n" + "\n".join(ratios) + "\n")


def _worker_main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="python -m rpcbus.benchmarks.events")
    ap.add_argument("role", choices=["rpcbus-subs", "rpcbus-pub", "nats-subs", "nats-pub"])
    ap.add_argument("--url", required=True)
    ap.add_argument("--conns", type=int, default=1)
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--payload", type=int, default=64)
    ap.add_argument("--batch", type=int, default=100)
    args = ap.parse_args(argv)
    from rpcbus.broker.cli import use_uvloop

    use_uvloop(True)
    role = {"rpcbus-subs": rpcbus_subs, "rpcbus-pub": rpcbus_pub, "nats-subs": nats_subs,
            "nats-pub": nats_pub}[args.role]
    asyncio.run(role(args))


if __name__ == "__main__":
    _worker_main(sys.argv[1:])
