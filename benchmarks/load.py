"""One-node or cluster load benchmark: calls/s, latency, node CPU per call, messages
per frame (rpcbus bench adds scenarios and a report).

\b
    # deepstream's shape: 1 provider, 4 callers, 200 in flight
    python -m rpcbus.benchmarks.load
    # 200 connections x 1 in flight
    python -m rpcbus.benchmarks.load --callers 4 --conns 50 --inflight 1
    # aim at a running node (no node CPU figures)
    python -m rpcbus.benchmarks.load --url ws://host:port
    # providers on n1, callers on n2, over Redis
    python -m rpcbus.benchmarks.load --nodes 2 --layout cross
    # providers and callers over all 3 nodes
    python -m rpcbus.benchmarks.load --nodes 3 --layout spread

Providers and callers run in their own processes (benchmarks/workers.py). The
baseline, measured in the same run with the same callers and shape, is a direct
echo server on the same I/O stack with no routing hop and no provider: rpcbus ÷
direct is the cost of being a broker. Every run is bounded by --duration and
--max-calls; traffic stays on loopback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from types import SimpleNamespace
from typing import Any

import click

from rpcbus.benchmarks import quiet
from rpcbus.broker.local import LocalCluster
from rpcbus.broker.process import NodeProcess

LAYOUTS = ("cross", "spread", "gather")


def _spawn(role: str, *args: str, module: str = "rpcbus.benchmarks.workers",
           program: list[str] | None = None) -> subprocess.Popen[str]:
    """A worker process: ``python -m MODULE ROLE ARGS``, or ``PROGRAM ARGS`` when given."""
    argv = [*program, *args] if program else [sys.executable, "-m", module, role, *args]
    return subprocess.Popen(argv,
                            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)


def _first_line(proc: subprocess.Popen[str]) -> dict[str, Any]:
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"worker exited with {proc.wait()}")
    return json.loads(line)


def _stats(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url.replace("ws://", "http://") + "/stats", timeout=10) as r:
        return json.load(r)


def _histogram(latencies_us: list[int]) -> Any:
    """An HDR histogram (1 µs to 10 min, 3 significant digits) of the latencies."""
    from hdrh.histogram import HdrHistogram

    hist = HdrHistogram(1, 600_000_000, 3)
    for value in latencies_us:
        hist.record_value(max(1, value))
    return hist


def run_callers(urls: list[str], args: SimpleNamespace, cpu_of: Any = None,
                stats_urls: list[str] = (), redis_cpu: Any = None,
                role: str = "caller", module: str = "rpcbus.benchmarks.workers",
                program: list[str] | None = None) -> dict[str, Any]:
    """Run the callers (round-robin over ``urls``); sample CPU and /stats over the window.

    ``role``/``module``, or a ``program`` (argv): another caller with the same flags and
    output (benchmarks/peers.py, benchmarks/sdks.py).
    """
    per_caller = max(1, args.max_calls // args.callers)
    counted_before = sum(_ended(_stats(u)) for u in stats_urls)
    start_at = time.time() + 1.5 + args.callers * args.conns * 0.004
    callers = [_spawn(role, "--url", urls[i % len(urls)], "--conns", str(args.conns),
                      "--inflight", str(args.inflight), "--payload", str(args.payload),
                      "--duration", str(args.duration), "--warmup", str(args.warmup),
                      "--max-calls", str(per_caller), "--start-at", str(start_at),
                      "--rpc", args.rpc,
                      *(["--stream", str(args.stream)] if getattr(args, "stream", 0) else []),
                      module=module, program=program)
               for i in range(args.callers)]
    time.sleep(max(0.0, start_at + args.warmup - time.time()))
    watch = _watch()
    cpu0 = cpu_of() if cpu_of else None      # per process
    rcpu0 = redis_cpu() if redis_cpu else None
    s0 = [_stats(u) for u in stats_urls]
    series = _measure(args.duration, stats_urls, s0)
    cpu1 = cpu_of() if cpu_of else None
    rcpu1 = redis_cpu() if redis_cpu else None
    watched = watch.stop() if watch is not None else None
    s1 = [_stats(u) for u in stats_urls]
    results = [json.loads(c.communicate(timeout=args.duration + 60)[0].strip().splitlines()[-1])
               for c in callers]
    # Every caller has its answers now, so the nodes have counted them: each call once,
    # on its caller's node, however many nodes it crossed (the live rate is read so).
    counted = (sum(_ended(_stats(u)) for u in stats_urls) - counted_before
               if stats_urls else None)
    measured = sum(r["measured"] for r in results)
    if not series and all("bins" in r for r in results):  # callers that count per bin
        bins = [sum(counts) for counts in zip(*(r["bins"] for r in results), strict=False)]
        series = [[round((k + 1) * 0.5, 3), n / 0.5] for k, n in enumerate(bins)]
    latencies = [v for r in results for v in r["latencies_us"]]
    hist = _histogram(latencies)
    errors: dict[str, int] = {}
    for r in results:
        for code, n in r["errors"].items():
            errors[code] = errors.get(code, 0) + n
    if not measured:
        raise SystemExit("no call completed inside the measured window: raise --max-calls "
                         "or --duration, or check the node")
    out: dict[str, Any] = {
        # Callers run side by side; one that hit its share of --max-calls early is
        # rated over the part of the window it was busy.
        "calls_per_s": sum(r["measured"] / r["span"] for r in results if r["span"] > 0),
        "capped": any(r["capped"] for r in results),
        "calls_measured": measured,
        "calls_total": sum(r["total"] for r in results),
        "unanswered": sum(r["unanswered"] for r in results),
        "errors": errors,
        "p50_us": float(hist.get_value_at_percentile(50)),
        "p90_us": float(hist.get_value_at_percentile(90)),
        "p99_us": float(hist.get_value_at_percentile(99)),
        "p999_us": float(hist.get_value_at_percentile(99.9)),
        "max_us": float(hist.get_max_value()),
        "throughput_series": series,       # [seconds into the window, calls/s]
        "_histogram": hist,                # for plots; not written to JSON
    }
    low = quiet.dips(series)
    out["disturbance"] = {**(watched or {}), "dips": low}
    if said := quiet.verdict(watched, low):
        out["disturbed"] = said
    if counted is not None:
        out["calls_counted_by_nodes"] = counted
    if cpu0 is not None and measured:
        used = [b - a for a, b in zip(cpu0, cpu1, strict=True)]
        out["node_cpu_us_per_call"] = sum(used) * 1e6 / measured  # all nodes together
        out["node_cpu_share"] = sum(used) / args.duration
        out["cpu_us_per_call_by_node"] = [u * 1e6 / measured for u in used]
    if rcpu0 is not None and measured:
        out["redis_cpu_us_per_call"] = sum(rcpu1) * 1e6 / measured - sum(rcpu0) * 1e6 / measured
        out["redis_cpu_us_per_call_by_server"] = [  # a Redis Cluster: per shard master
            (b - a) * 1e6 / measured for a, b in zip(rcpu0, rcpu1, strict=True)]
    if s0:
        def delta(section: str, key: str) -> float:
            return sum(((b.get(section) or {}).get(key, 0) - (a.get(section) or {}).get(key, 0))
                       for a, b in zip(s0, s1, strict=True))

        def bus_delta(key: str) -> float:
            return sum(((b.get("cluster") or {}).get("bus", {}).get(key, 0)
                        - (a.get("cluster") or {}).get("bus", {}).get(key, 0))
                       for a, b in zip(s0, s1, strict=True))

        d_in, d_out = delta("io", "frames_in"), delta("io", "frames_out")
        out["msgs_per_frame_in"] = delta("io", "messages_in") / d_in if d_in else float("nan")
        out["msgs_per_frame_out"] = delta("io", "messages_out") / d_out if d_out else float("nan")
        batches = bus_delta("batches_out")
        if batches:
            out["msgs_per_publish"] = bus_delta("messages_out") / batches
            out["bus_msgs_per_call"] = bus_delta("messages_out") / measured
        out["by_node"] = [_node_batching(a, b, measured) for a, b in zip(s0, s1, strict=True)]
        local, remote = delta("router", "local_calls"), delta("router", "remote_calls")
        if local + remote:  # first attempts of callers' calls that stayed on their node
            out["stayed_local"] = local / (local + remote)
    return out


def _watch() -> "quiet.Watch | None":
    """The machine's CPU over the window, when psutil is there (``rpcbus[bench]``)."""
    try:
        return quiet.Watch()
    except ImportError:
        return None


def _node_batching(before: dict[str, Any], after: dict[str, Any],
                   calls: int) -> dict[str, float]:
    """One node's batching over the window, from two /stats: client messages per frame in
    and out, bus messages per PUBLISH, and bus messages and PUBLISHes per call (of all)."""
    def d(section: str, key: str) -> float:
        return float((after.get(section) or {}).get(key, 0)
                     - (before.get(section) or {}).get(key, 0))

    def bus(key: str) -> float:
        return float(((after.get("cluster") or {}).get("bus") or {}).get(key, 0)
                     - ((before.get("cluster") or {}).get("bus") or {}).get(key, 0))

    nan = float("nan")
    frames_in, frames_out, publishes = d("io", "frames_in"), d("io", "frames_out"), bus(
        "batches_out")
    return {"msgs_per_frame_in": d("io", "messages_in") / frames_in if frames_in else nan,
            "msgs_per_frame_out": d("io", "messages_out") / frames_out if frames_out else nan,
            "msgs_per_publish": bus("messages_out") / publishes if publishes else nan,
            "publishes_per_call": publishes / calls if calls else nan,
            "bus_msgs_out_per_call": bus("messages_out") / calls if calls else nan}


def _ended(stats: dict[str, Any]) -> int:
    """Calls of a node's own callers ended so far (answered or failed), from its /stats:
    summed over nodes, a call that crossed nodes counts once (on its caller's node)."""
    router = stats["router"]
    return router["calls_ok"] + router["calls_failed"]


def _measure(duration: float, stats_urls: list[str] | tuple[()],
             first: list[dict[str, Any]]) -> list[list[float]]:
    """Wait out the window with a progress bar on stderr; with node URLs, sample the calls
    the nodes ended twice a second for the bar's current rate and the throughput series.
    (Each node counts the calls of its own callers, so the sum counts a call that crossed
    nodes once: the series is calls/s as the callers see them.)"""
    series: list[list[float]] = []
    t0 = time.perf_counter()
    last_t, last_n = t0, sum(_ended(s) for s in first) if first else 0
    width = 30
    while (elapsed := time.perf_counter() - t0) < duration:
        time.sleep(min(0.5, duration - elapsed))
        now = time.perf_counter()
        rate_text = ""
        if stats_urls:
            try:
                n = sum(_ended(_stats(u)) for u in stats_urls)
            except OSError:
                n = last_n
            rate = (n - last_n) / (now - last_t) if now > last_t else 0.0
            series.append([round(now - t0, 3), rate])
            last_t, last_n = now, n
            rate_text = f"  {rate:>10,.0f} calls/s"
        done = min(1.0, (now - t0) / duration)
        bar = "#" * int(done * width) + "." * (width - int(done * width))
        print(f"\r  [{bar}] {now - t0:5.1f}/{duration:.0f} s{rate_text}", end="",
              file=sys.stderr, flush=True)
    print(file=sys.stderr)
    return series


def options(command: Any) -> Any:
    """The load's shape as click options (shared by ``rpcbus bench``)."""
    for decorator in reversed((
        click.option("--url", default=None, help="Existing node(s), comma-separated, instead "
                     "of starting them (no CPU figures then)."),
        click.option("--providers", type=click.IntRange(min=1), default=1,
                     show_default=True, help="Provider processes."),
        click.option("--callers", type=click.IntRange(min=1), default=4, show_default=True,
                     help="Caller processes."),
        click.option("--conns", type=click.IntRange(min=1), default=1, show_default=True,
                     help="Connections per caller process."),
        click.option("--inflight", type=click.IntRange(min=1), default=50, show_default=True,
                     help="Calls in flight per connection."),
        click.option("--payload", type=click.IntRange(min=0), default=16, show_default=True,
                     help="Bytes of data per call."),
        click.option("--duration", type=click.FloatRange(min=0, min_open=True),
                     default=5.0, show_default=True, help="Measured seconds."),
        click.option("--warmup", type=click.FloatRange(min=0), default=1.0, show_default=True,
                     help="Seconds before measuring."),
        click.option("--max-calls", type=click.IntRange(min=1), default=5_000_000,
                     show_default=True, help="Hard cap on calls."),
        click.option("--rpc", default="bench.echo", show_default=True,
                     help="Rpc name(s), comma-separated: every provider provides all, "
                     "callers call them in turn."),
        click.option("--seal", type=click.Choice(["none", "sign", "encrypt"]), default="none",
                     show_default=True, help="With several nodes: how the cluster bus is "
                     "sealed (a fresh key)."),
        click.option("--redis-shards", type=click.IntRange(min=0), default=0,
                     show_default=True, help="With several nodes: run the bus on an embedded "
                     "Redis Cluster of this many masters (3 or more; sharded pub/sub) "
                     "instead of one redis-server."),
        click.option("--policy", type=click.Choice(["local-first", "cluster"]), default=None,
                     help="With several nodes: the nodes' choice of provider "
                     "(cluster.policy) [the nodes' default: cluster]."),
        click.option("--no-baseline", is_flag=True, help="Skip the direct echo baseline."),
    )):
        command = decorator(command)
    return command


@click.command(context_settings={"help_option_names": ["-h", "--help"]}, help=__doc__)
@options
@click.option("--nodes", type=click.IntRange(min=1), default=1, show_default=True,
              help="Nodes (more than 1: a cluster on an embedded redis-server).")
@click.option("--layout", type=click.Choice(LAYOUTS), default="cross",
              show_default=True, help="With several nodes: cross = providers on n1, callers "
              "on the others; spread = providers and callers round-robin over all nodes; "
              "gather = callers on n1, providers round-robin over all nodes.")
@click.option("--out", type=click.Path(file_okay=False), default=None,
              help="A directory to write result.json into.")
def command(**opts: Any) -> dict[str, Any]:
    args = SimpleNamespace(**opts)
    result = run(args)
    click.echo(_summary(result))
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "result.json"), "w") as f:
            json.dump(jsonable(result), f, indent=2)
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run as ``python -m rpcbus.benchmarks.load ARGV``; returns the result."""
    result: dict[str, Any] = command.main(argv, prog_name="python -m rpcbus.benchmarks.load",
                                          standalone_mode=False)
    return result


def jsonable(result: dict[str, Any]) -> dict[str, Any]:
    """The result without what JSON cannot hold (the histograms)."""
    return {k: (jsonable(v) if isinstance(v, dict) else v)
            for k, v in result.items() if not k.startswith("_")}


def run(args: SimpleNamespace) -> dict[str, Any]:
    """One benchmark run as ``args`` say; returns the figures (see ``_summary``)."""
    shape = (f"{args.nodes} node(s) {args.layout if args.nodes > 1 else ''}; "
             f"{args.providers} provider(s), {args.callers} caller process(es) x {args.conns} "
             f"conn(s) x {args.inflight} in flight = {args.callers * args.conns * args.inflight}; "
             f"payload {args.payload} B")
    print(f"shape: {shape}", file=sys.stderr)
    result: dict[str, Any] = {"shape": shape, "args": vars(args)}

    if not args.no_baseline:
        print("baseline: direct echo server (same I/O stack, no routing) ...", file=sys.stderr)
        echo = _spawn("echo")
        try:
            result["baseline"] = run_callers([_first_line(echo)["url"]], args,
                                             cpu_of=_cpu_reader([echo.pid]))
        finally:
            echo.kill()
            echo.wait()

    nodes: list[NodeProcess] = []
    cluster = None
    providers: list[subprocess.Popen[str]] = []
    try:
        if args.url is not None:
            node_urls = args.url.split(",")
        elif args.nodes == 1:
            nodes = [NodeProcess().start()]
            node_urls = [nodes[0].url]
        else:
            env = _seal_env(args.seal)
            if args.policy:
                env["RPCBUS_CLUSTER_POLICY"] = args.policy
            cluster = LocalCluster(nodes=args.nodes, env=env,
                                   redis_shards=args.redis_shards).start()
            nodes = cluster.nodes
            node_urls = [n.url for n in nodes]
        if len(node_urls) > 1 and args.layout == "cross":
            provider_urls, caller_urls = node_urls[:1], node_urls[1:]
        elif len(node_urls) > 1 and args.layout == "gather":
            provider_urls, caller_urls = node_urls, node_urls[:1]
        else:
            provider_urls = caller_urls = node_urls
        print(f"rpcbus at {', '.join(node_urls)} ...", file=sys.stderr)
        providers = [_spawn("provider", "--url", provider_urls[i % len(provider_urls)],
                            "--rpc", args.rpc) for i in range(args.providers)]
        for prov in providers:
            _first_line(prov)
        servers = ([] if cluster is None else [cluster.redis] if cluster.redis
                   else cluster.redis_cluster.servers if cluster.redis_cluster else [])
        redis_pids = [s.proc.pid for s in servers if s.proc is not None]
        result["rpcbus"] = run_callers(
            caller_urls, args, cpu_of=_cpu_reader([n.pid for n in nodes]) if nodes else None,
            stats_urls=node_urls, redis_cpu=_cpu_reader(redis_pids) if redis_pids else None)
        result["rpcbus"]["nodes"] = [n.name or n.url for n in nodes] or node_urls
        if nodes:
            import psutil

            result["rpcbus"]["rss_mb_by_node"] = [
                round(psutil.Process(n.pid).memory_info().rss / 2**20, 1) for n in nodes]
        result["rpcbus"]["served_by_provider"] = _served(providers, provider_urls)
    finally:
        for prov in providers:
            prov.kill()
            prov.wait()
        if cluster is not None:
            cluster.stop()
        for node in nodes if cluster is None else ():
            node.stop()

    if "baseline" in result:
        base = result["baseline"]
        result["ratio_calls_per_s"] = result["rpcbus"]["calls_per_s"] / base["calls_per_s"]
        result["ratio_p99"] = result["rpcbus"]["p99_us"] / base["p99_us"]
    return result


def _served(providers: list[subprocess.Popen[str]], urls: list[str]) -> list[dict[str, Any]]:
    """Each provider's calls (asked with SIGTERM), with the node it was on: the shares."""
    served = []
    for i, prov in enumerate(providers):
        prov.terminate()
        try:
            out, _ = prov.communicate(timeout=10)
            n = json.loads(out.strip().splitlines()[-1])["served"]
        except (subprocess.TimeoutExpired, ValueError, KeyError, IndexError):
            n = None  # it did not say: left out of the shares
        served.append({"node": urls[i % len(urls)], "calls": n})
    total = sum(s["calls"] or 0 for s in served)
    for s in served:
        s["share"] = round(s["calls"] / total, 4) if total and s["calls"] is not None else None
    return served


def _seal_env(mode: str) -> dict[str, str]:
    if mode == "none":
        return {}
    from rpcbus.cluster.seal import new_key

    return {"RPCBUS_CLUSTER_SEAL": mode, "RPCBUS_CLUSTER_KEY_ID": "bench",
            "RPCBUS_CLUSTER_KEYS": json.dumps({"bench": new_key()})}


def _cpu_reader(pids: list[int]) -> Any:
    """A function giving the user + system CPU seconds of each of these processes."""
    import psutil

    procs = [psutil.Process(pid) for pid in pids]

    def read() -> list[float]:
        return [t.user + t.system for t in (p.cpu_times() for p in procs)]

    return read


def _summary(result: dict[str, Any]) -> str:
    lines = [f"shape: {result['shape']}",
             f"{'':10} {'calls/s':>10} {'p50 µs':>8} {'p99 µs':>8} {'max µs':>8} "
             f"{'CPU µs/call':>12} {'msgs/frame in/out':>18} errors"]
    for key in ("baseline", "rpcbus"):
        r = result.get(key)
        if r is None:
            continue
        frames = (f"{r['msgs_per_frame_in']:.1f}/{r['msgs_per_frame_out']:.1f}"
                  if "msgs_per_frame_in" in r else "-")
        lines.append(f"{key:10} {r['calls_per_s']:>10,.0f} {r['p50_us']:>8.0f} {r['p99_us']:>8.0f} "
                     f"{r['max_us']:>8.0f} {r.get('node_cpu_us_per_call', float('nan')):>12.2f} "
                     f"{frames:>18} {r['errors'] or '-'} unanswered={r['unanswered']}")
        if "msgs_per_publish" in r or "redis_cpu_us_per_call" in r:
            lines.append(f"{'':10} msgs/PUBLISH {r.get('msgs_per_publish', float('nan')):.1f}, "
                         f"bus msgs/call {r.get('bus_msgs_per_call', float('nan')):.2f}, "
                         f"Redis CPU µs/call {r.get('redis_cpu_us_per_call', float('nan')):.2f}"
                         + (" (by shard: " + ", ".join(
                             f"{x:.2f}" for x in r["redis_cpu_us_per_call_by_server"]) + ")"
                            if len(r.get("redis_cpu_us_per_call_by_server", ())) > 1 else ""))
        by_node = r.get("by_node") or []
        if len(by_node) > 1:
            names = r.get("nodes") or [f"n{i + 1}" for i in range(len(by_node))]
            cpu = r.get("cpu_us_per_call_by_node") or [float("nan")] * len(by_node)
            lines.append(f"{'':10} {'node':>6} {'CPU µs/call':>12} {'msgs/frame in/out':>18} "
                         f"{'msgs/PUBLISH':>13} {'PUBLISH/call':>13}")
            for name, b, c in zip(names, by_node, cpu, strict=True):
                frames = f"{b['msgs_per_frame_in']:.1f}/{b['msgs_per_frame_out']:.1f}"
                lines.append(f"{'':10} {name:>6} {c:>12.2f} {frames:>18} "
                             f"{b['msgs_per_publish']:>13.1f} {b['publishes_per_call']:>13.3f}")
        if "stayed_local" in r:
            lines.append(f"{'':10} callers' calls that stayed on their node: "
                         f"{r['stayed_local']:.1%}")
        served = r.get("served_by_provider") or []
        if len(served) > 1:
            lines.append(f"{'':10} calls by provider (share; node): " + ", ".join(
                f"{s['share']:.1%} ({s['node'].rsplit(':', 1)[-1]})" if s["share"] is not None
                else "?" for s in served))
    if "ratio_calls_per_s" in result:
        lines.append(f"rpcbus ÷ direct: throughput {result['ratio_calls_per_s']:.2f}, "
                     f"p99 {result['ratio_p99']:.2f}")
    for key in ("baseline", "rpcbus"):
        said = (result.get(key) or {}).get("disturbed")
        if said:
            lines.append(f"WARNING ({key}): {said}")
    return "\n".join(lines)


if __name__ == "__main__":
    command(prog_name="python -m rpcbus.benchmarks.load")
