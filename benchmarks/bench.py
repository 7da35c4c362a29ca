"""Load benchmark: starts what it needs and writes a report.

\b
Scenarios:
  local    one node; providers and callers on it
  cross    two nodes; providers on n1, callers on n2 (every call crosses Redis)
  cluster  --nodes nodes (3); providers and callers spread over all
  stream   two nodes as in cross, run twice: callers call, then read streams
           (--inflight streams per connection, each a --window of 64 B parts by
           default); the same run's figures per call and per part, and their ratios
  overload open-loop arrivals from 0.5x to 5x the measured capacity, on 1 and 2
           nodes and NATS: goodput, latency, every outcome, wasted work per step
           (its own options: rpcbus bench overload --help; benchmarks/overload.py)
  events   one publisher to 1, 100 and 1,000 subscribers on 1 and 2 nodes, beside
           deepstream 7 and NATS: deliveries/s, server CPU per delivery, p99 emit to
           delivery (its own options: rpcbus bench events --help; benchmarks/events.py)

Everything runs in its own process (nodes, an embedded redis-server or, with
--redis-shards N, Redis Cluster, provider and caller processes), on loopback,
and stops by itself (--duration and --max-calls); --url aims at running nodes
instead. Calls/s count each call once, on its caller's node. Each run writes to --out:

\b
  result.json     calls/s; latency p50/p90/p99/p99.9/max (HDR histogram); errors
                  by code; node CPU µs per call (all nodes, and each); Redis CPU
                  µs per call; messages per frame and per PUBLISH; node memory;
                  the throughput series; the same for the baseline (a direct echo
                  server on the same I/O stack and shape) and rpcbus ÷ direct
  latency.png     latency by percentile
  throughput.png  calls/s over the measured window, of rpcbus and each peer
  summary.md      a Markdown table of the above

A run the rest of the machine disturbed (other processes using over a quarter of a
core meanwhile, or calls/s under a quarter of its median for half a second) says so
in a WARNING line and in summary.md: its figures read low (benchmarks/quiet.py).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from types import SimpleNamespace
from typing import Any

import click

from rpcbus.benchmarks import load

NAMES = {"baseline": "direct echo", "rpcbus": "rpcbus", "redis": "raw Redis req/reply",
         "nats": "NATS req/reply", "calls": "rpcbus calls (same run)"}
SCENARIOS = {
    "local": {"nodes": 1, "layout": "cross"},
    "cross": {"nodes": 2, "layout": "cross"},
    "cluster": {"nodes": 3, "layout": "spread"},
    "stream": {"nodes": 2, "layout": "cross"},
}


class _Bench(click.Command):
    """``rpcbus bench``; ``rpcbus bench overload ...`` is benchmarks/overload.py and
    ``rpcbus bench events ...`` benchmarks/events.py, whose options are their own."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args[:1] in (["overload"], ["events"]):
            ctx.meta["own"] = args
            return []
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        if "own" in ctx.meta:
            name, *rest = ctx.meta["own"]
            if name == "events":
                from rpcbus.benchmarks import events

                events.main(rest)
            else:
                from rpcbus.benchmarks import overload

                overload.main(rest)
            return None
        return super().invoke(ctx)


@click.command(cls=_Bench, context_settings={"help_option_names": ["-h", "--help"]},
               help=__doc__)
@click.argument("scenario", type=click.Choice(sorted(SCENARIOS)), default="local")
@load.options
@click.option("--nodes", type=click.IntRange(min=1), default=None,
              help="Nodes [the scenario's: local 1, cross 2, cluster 3].")
@click.option("--layout", type=click.Choice(load.LAYOUTS), default=None,
              help="cross = providers on n1, callers on the others; spread = both round-robin "
              "over all nodes; gather = callers on n1, providers round-robin over all "
              "[the scenario's: cluster spreads].")
@click.option("--window", type=click.IntRange(1, 1024), default=64, show_default=True,
              help="stream: each stream's credit window (parts ahead of the reading).")
@click.option("--smoke", is_flag=True, help="A tiny run (the test suite's).")
@click.option("--out", type=click.Path(file_okay=False), default=None,
              help="The directory the report goes to [bench-results/SCENARIO-TIME].")
@click.option("--compare", is_flag=True, help="Also run raw Redis pub/sub and NATS "
              "request/reply (nats-py) with the same callers, payload and calls in flight.")
def command(scenario: str, **opts: Any) -> dict[str, Any]:
    _needs("psutil", "hdrh", "matplotlib")
    args = SimpleNamespace(**opts)
    preset = SCENARIOS[scenario]
    if args.nodes is None:
        args.nodes = preset["nodes"]
    args.layout = args.layout or preset["layout"]
    if scenario == "cluster" and args.providers < args.nodes:
        args.providers = args.nodes
    if args.smoke:
        args.duration, args.warmup, args.callers, args.inflight = 0.6, 0.2, 1, 20
    out_dir = args.out or os.path.join(
        "bench-results", f"{scenario}-{time.strftime('%Y%m%d-%H%M%S')}")
    os.makedirs(out_dir, exist_ok=True)

    if scenario == "stream":
        result = streams(args)
    else:
        result = load.run(args)
    result["scenario"] = scenario
    if args.compare:
        for kind in ("redis", "nats"):
            result[kind] = compare(kind, args)
            peer = result[kind]
            if "calls_per_s" in peer:
                peer["rpcbus_ratio_calls_per_s"] = (result["rpcbus"]["calls_per_s"]
                                                    / peer["calls_per_s"])
                peer["rpcbus_ratio_p99"] = result["rpcbus"]["p99_us"] / peer["p99_us"]
    click.echo(load._summary(result))
    if "calls" in result:
        c = result["calls"]
        click.echo(f"the same run's calls: {c['calls_per_s']:,.0f} calls/s, node CPU "
                   f"{c.get('node_cpu_us_per_call', float('nan')):.2f} µs/call; parts/s ÷ "
                   f"calls/s {result['parts_per_call_throughput']:.2f}, node CPU per part ÷ "
                   f"per call {result.get('part_cpu_per_call_cpu', float('nan')):.2f}")
    for kind in ("redis", "nats"):
        peer = result.get(kind)
        if peer is not None:
            click.echo(f"rpcbus ÷ {NAMES[kind]}: " + (
                f"throughput {peer['rpcbus_ratio_calls_per_s']:.2f}, p99 "
                f"{peer['rpcbus_ratio_p99']:.2f}  ({peer['calls_per_s']:,.0f} calls/s, p99 "
                f"{peer['p99_us']:,.0f} µs)" if "skipped" not in peer
                else f"skipped ({peer['skipped']})"))
            if peer.get("disturbed"):
                click.echo(f"WARNING ({NAMES[kind]}): {peer['disturbed']}")
    with open(os.path.join(out_dir, "result.json"), "w") as f:
        json.dump(load.jsonable(result), f, indent=2)
    with open(os.path.join(out_dir, "summary.md"), "w") as f:
        f.write(markdown(result))
    plot(result, out_dir)
    click.echo(f"report: {out_dir}/ (result.json, summary.md, latency.png, throughput.png)")
    return result


def streams(args: SimpleNamespace) -> dict[str, Any]:
    """The stream scenario: the cross shape called, then read as streams, in one run; the
    second run's figures (per part) under "rpcbus", the first's (per call) under "calls"."""
    args.no_baseline = True
    if args.smoke:
        args.inflight = 4
    args.stream = 0
    calls = load.run(args)
    args.stream = args.window
    result = load.run(args)
    result["shape"] += f"; streams of window {args.window} (parts counted as calls)"
    result["calls"] = calls["rpcbus"]
    parts, per_call = result["rpcbus"], calls["rpcbus"]
    result["parts_per_call_throughput"] = parts["calls_per_s"] / per_call["calls_per_s"]
    if parts.get("node_cpu_us_per_call") and per_call.get("node_cpu_us_per_call"):
        result["part_cpu_per_call_cpu"] = (parts["node_cpu_us_per_call"]
                                           / per_call["node_cpu_us_per_call"])
    return result


def _needs(*modules: str) -> None:
    """One line naming the extra when a module the benchmark uses is missing."""
    for module in modules:
        if importlib.util.find_spec(module) is None:
            raise click.ClickException(
                f"rpcbus bench needs {module}: pip install 'rpcbus[bench]'")


def compare(kind: str, args: SimpleNamespace) -> dict[str, Any]:
    """One peer run (benchmarks/peers.py): its figures, or why it was skipped."""
    from rpcbus.benchmarks.peers import Peer

    label = {"redis": "raw Redis pub/sub request/reply",
             "nats": "NATS request/reply (nats-py)"}[kind]
    print(f"peer: {label} ...", file=sys.stderr)
    try:
        peer = Peer(kind, responders=args.providers)
    except (RuntimeError, OSError) as exc:
        print(f"  skipped: {exc}", file=sys.stderr)
        return {"skipped": str(exc)}
    try:
        out = load.run_callers([peer.url], args, cpu_of=load._cpu_reader([peer.pid]),
                               role=f"{kind}-caller", module="rpcbus.benchmarks.peers")
        out["broker_cpu_us_per_call"] = out.pop("node_cpu_us_per_call", None)
        out.pop("cpu_us_per_call_by_node", None)
        return out
    finally:
        peer.stop()


def markdown(result: dict[str, Any]) -> str:
    rows = [f"# rpcbus bench {result['scenario']}", "", f"Shape: {result['shape']}", "",
            "| run | calls/s | p50 µs | p90 µs | p99 µs | p99.9 µs | max µs | node CPU µs/call "
            "| Redis CPU µs/call | msgs/frame in/out | msgs/PUBLISH | node RSS MB | errors |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---|---|"]
    for key in ("baseline", "calls", "rpcbus", "redis", "nats"):
        r = result.get(key)
        if r is None or "skipped" in r:
            continue
        frames = (f"{r['msgs_per_frame_in']:.1f} / {r['msgs_per_frame_out']:.1f}"
                  if "msgs_per_frame_in" in r else "–")
        rows.append(
            f"| {NAMES[key]} | {r['calls_per_s']:,.0f} "
            f"| {r['p50_us']:,.0f} | {r['p90_us']:,.0f} | {r['p99_us']:,.0f} "
            f"| {r['p999_us']:,.0f} | {r['max_us']:,.0f} "
            f"| {_num(r.get('node_cpu_us_per_call', r.get('broker_cpu_us_per_call')))} "
            f"| {_num(r.get('redis_cpu_us_per_call'))} "
            f"| {frames} | {_num(r.get('msgs_per_publish'), 1)} "
            f"| {', '.join(map(str, r.get('rss_mb_by_node', []))) or '–'} "
            f"| {', '.join(f'{c} {n}' for c, n in r['errors'].items()) or 'none'} |")
    if "parts_per_call_throughput" in result:
        rows += ["", "The rpcbus row counts parts as calls (no latency: a part answers no "
                 f"request). Parts/s ÷ calls/s **{result['parts_per_call_throughput']:.2f}**; "
                 "node CPU per part ÷ per call "
                 f"**{_num(result.get('part_cpu_per_call_cpu'))}** (the same run)."]
    if "ratio_calls_per_s" in result:
        rows += ["", f"rpcbus ÷ direct echo: throughput **{result['ratio_calls_per_s']:.2f}**, "
                 f"p99 latency **{result['ratio_p99']:.2f}** (measured in the same run)."]
    for kind in ("redis", "nats"):
        peer = result.get(kind)
        if peer is None:
            continue
        if "skipped" in peer:
            rows += ["", f"{NAMES[kind]}: skipped ({peer['skipped']})."]
        else:
            rows += ["", f"rpcbus ÷ {NAMES[kind]}: throughput "
                     f"**{peer['rpcbus_ratio_calls_per_s']:.2f}**, p99 latency "
                     f"**{peer['rpcbus_ratio_p99']:.2f}**."]
    rows += ["", "For peers, \"node CPU\" is the broker's: redis-server or nats-server."]
    for key in ("baseline", "rpcbus", "redis", "nats"):
        said = (result.get(key) or {}).get("disturbed")
        if said:
            rows += ["", f"**Warning ({NAMES[key]})**: {said}"]
    r = result.get("rpcbus", {})
    by_node, cpu = r.get("by_node") or [], r.get("cpu_us_per_call_by_node")
    if len(by_node) > 1:
        names = r.get("nodes") or [f"n{i + 1}" for i in range(len(by_node))]
        rows += ["", "Each node (CPU per call of all calls; batching over the window):", "",
                 "| node | CPU µs/call | msgs/frame in / out | msgs/PUBLISH | PUBLISH/call |",
                 "|---|---:|---|---:|---:|"]
        for i, (name, b) in enumerate(zip(names, by_node, strict=True)):
            rows.append(f"| {name} | {_num(cpu[i] if cpu else None)} "
                        f"| {b['msgs_per_frame_in']:.1f} / {b['msgs_per_frame_out']:.1f} "
                        f"| {b['msgs_per_publish']:.1f} | {b['publishes_per_call']:.3f} |")
    return "\n".join(rows) + "\n"


def _num(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def plot(result: dict[str, Any], out_dir: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.set_xscale("log")
    ax.set_yscale("log")
    qs = [50, 75, 90, 95, 99, 99.5, 99.9, 99.95, 99.99]
    at = [1 / (1 - q / 100) for q in qs]      # "number of nines" spacing
    for key, label in NAMES.items():
        r = result.get(key)
        if r is None or "_histogram" not in r:
            continue
        hist = r["_histogram"]
        ax.plot(at, [hist.get_value_at_percentile(q) / 1000 for q in qs], marker="o",
                label=label)
    ax.set_xticks(at, [f"{q:g}" for q in qs])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_major_formatter(ScalarFormatter())
    ax.set_xlabel("percentile")
    ax.set_ylabel("latency, ms")
    ax.set_title(f"latency by percentile — {result['scenario']}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "latency.png"), dpi=100)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 3.5))
    for key, label in NAMES.items():  # every run of the report, peers too
        series = (result.get(key) or {}).get("throughput_series") or []
        if series:
            ax.plot([t for t, _ in series], [v for _, v in series], marker=".", label=label)
    ax.set_xlabel("seconds into the measured window")
    ax.set_ylabel("calls/s (rpcbus: the nodes' count; peers: their callers')")
    ax.legend()
    ax.set_ylim(bottom=0)
    ax.set_title(f"throughput — {result['scenario']}")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "throughput.png"), dpi=100)
    plt.close(fig)



if __name__ == "__main__":
    command(prog_name="rpcbus bench")
